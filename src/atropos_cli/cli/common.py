"""What every command shares: the console, turning library errors into `error:`/`hint:` lines and exit codes
(the table is in `atropos_cli.errors`), and the parsing of Atropos-style dotted flags beside the typed ones."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperOption

from atropos_cli.config import NAMESPACES
from atropos_cli.errors import EXIT_INTERRUPTED, EXIT_RUNTIME, AtroposError, AtroposWarning

__all__ = ["console", "err_console", "fail", "warn", "route_warnings", "cli_errors", "DottedCommand"]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def fail(message: str, hint: str | None = None, code: int = EXIT_RUNTIME) -> typer.Exit:
    """Print a one-line error (and hint) to stderr and return the Exit to raise (pass code=EXIT_USAGE for a usage
    error; library code raises an `AtroposError` instead, which carries its own code)."""
    # the texts are data, never markup: "[...]" in a message (a path, a torch error) is printed as it is
    err_console.print(f"[bold red]error:[/] {escape(message)}", markup=True, soft_wrap=True)
    if hint:
        err_console.print(f"[yellow]hint:[/] {escape(hint)}", markup=True, soft_wrap=True)
    return typer.Exit(code)


def warn(message: str) -> None:
    err_console.print(f"[yellow]warning:[/] {escape(message)}", markup=True, soft_wrap=True)


def route_warnings() -> None:
    """Print our own warnings (`AtroposWarning`, e.g. the code sandbox's gaps) as one `warning:` line each;
    anything else keeps Python's format."""
    python_format = warnings.showwarning
    if getattr(python_format, "routes_atropos_warnings", False):
        return

    def show(
        message: Warning | str, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        if issubclass(category, AtroposWarning):
            warn(str(message))
        else:
            python_format(message, category, filename, lineno, file, line)

    show.routes_atropos_warnings = True  # type: ignore[attr-defined]
    warnings.showwarning = show


@contextmanager
def cli_errors() -> Iterator[None]:
    """Run a command body: an AtroposError becomes `error:`/`hint:` lines and its exit code, Ctrl-C exits 130,
    and any other exception one `internal error` line (ATROPOS_DEBUG=1 shows the traceback)."""
    try:
        yield
    except AtroposError as exc:
        if getattr(exc, "quiet", False):  # reported by someone else (errors.PeerLost: the launcher)
            sys.exit(exc.exit_code)
        raise fail(exc.text, exc.hint, exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("interrupted", style="yellow")
        sys.exit(EXIT_INTERRUPTED)
    except Exception as exc:
        if _is_cli_exit(exc) or os.environ.get("ATROPOS_DEBUG"):
            raise
        raise fail(
            f"internal error: {type(exc).__name__}: {exc}",
            hint="this is a bug in atropos; rerun with ATROPOS_DEBUG=1 for the traceback and report it",
            code=EXIT_RUNTIME,
        ) from None


def _is_cli_exit(exc: BaseException) -> bool:
    """typer.Exit/Abort and click's usage errors (Typer may carry its own copy of click: matched by name)."""
    return isinstance(exc, typer.Exit | typer.Abort) or any(c.__name__ == "ClickException" for c in type(exc).__mro__)


def _dotted(token: str) -> bool:
    namespace, dot, field = token[2:].partition("=")[0].partition(".")
    return token.startswith("--") and bool(dot) and namespace in NAMESPACES and bool(field)


def adapter_options_help() -> str:
    """The `--env.*` flags of each adapter (`vf:`, `gym:`, ...): its config's own fields, for `--help`."""
    from atropos_cli.cli.options import field_help
    from atropos_cli.config import EnvConfig
    from atropos_cli.env.registry import ADAPTERS, adapter_module

    blocks = []
    for prefix in ADAPTERS:
        config = adapter_module(prefix).CONFIG
        own = [name for name in config.model_fields if name not in EnvConfig.model_fields]
        flags = " ".join(f"--env.{name}: {field_help(config.model_fields[name]).rstrip('.')}." for name in own)
        blocks.append(f"Options of {prefix}: envs: {flags or 'none.'}")
    return "\n\n".join(blocks)


class DottedCommand(TyperCommand):
    """A command whose own options parse strictly (an unknown `--flag` is a usage error with a did-you-mean),
    while Atropos-style dotted flags (`--env.<field> V`, `--openai.<field> V`, any of config.NAMESPACES) are set
    aside into `ctx.args`. Its help ends with the adapters' own `--env.*` flags (envs of other frameworks)."""

    _base_epilog: str | None = None

    def format_help(self, ctx: Any, formatter: Any) -> None:
        if self._base_epilog is None:
            self._base_epilog = self.epilog or ""
        self.epilog = "\n\n".join(part for part in (self._base_epilog, adapter_options_help()) if part)
        super().format_help(ctx, formatter)

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own click Context
        takes_value = {
            name: p.nargs
            for p in self.params
            if isinstance(p, TyperOption) and not p.is_flag and not p.count
            for name in p.opts
        }
        rest: list[str] = []
        dotted: list[str] = []
        i = 0
        while i < len(args):
            token = args[i]
            if token == "--":
                rest.extend(args[i:])
                break
            if _dotted(token):
                dotted.append(token)
                if "=" not in token and i + 1 < len(args) and not args[i + 1].startswith("--"):
                    dotted.append(args[i + 1])
                    i += 1
            elif token in takes_value:  # `--opt value`: the value is never a dotted flag, whatever it looks like
                rest.extend(args[i : i + 1 + takes_value[token]])
                i += takes_value[token]
            else:
                rest.append(token)
            i += 1
        super().parse_args(ctx, rest)
        ctx.args = dotted
        return ctx.args
