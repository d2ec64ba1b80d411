"""The `atropos` Typer app. Commands register lazily: `atropos --help` lists them from `COMMANDS` (name, module,
one-line help) without importing a single command module; running a command imports only its module, whose
`register(app)` defines it. A test checks that each one-line help here is the first line of the command's own
help, so the two cannot drift apart.

The group also owns how the CLI fails before a command runs: an unknown command gets a did-you-mean, and usage
errors (Typer/click's) print as the same `error:`/`hint:` lines as every other error (exit 2), not in a box.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from difflib import get_close_matches
from typing import Any, NamedTuple

import typer
from typer.core import TyperCommand, TyperGroup


class LazyCommand(NamedTuple):
    module: str
    help: str


# Order is the order of `atropos --help`.
COMMANDS: dict[str, LazyCommand] = {
    "process": LazyCommand(
        "atropos_cli.cli.process", "Run ENV offline: collect scored groups into jsonl + parquet + an HTML viewer."
    ),
    "evaluate": LazyCommand(
        "atropos_cli.cli.evaluate",
        "Evaluate ENV on its eval split: pass@1..k (unbiased estimator), mean score, stderr, and a report.",
    ),
    "init-env": LazyCommand(
        "atropos_cli.cli.init_env",
        "Write NAME.py (a declarative env: items, prompt, reward) and test_NAME.py; both pass as written.",
    ),
    "port": LazyCommand(
        "atropos_cli.cli.port",
        "Check an Atropos env file without running it: what it uses that we lack (read from its source).",
    ),
    "view": LazyCommand(
        "atropos_cli.cli.view",
        "Render scored groups to one self-contained HTML page (search, score filter, keyboard navigation).",
    ),
    "envs": LazyCommand(
        "atropos_cli.cli.envs",
        "List bundled envs (and envs installed through the `atropos.envs` entry point) with a one-line description.",
    ),
    "api": LazyCommand(
        "atropos_cli.cli.api",
        "Serve the trajectory queue: envs POST scored groups, trainers GET exact-size batches (Atropos wire).",
    ),
    "serve-trainer": LazyCommand(
        "atropos_cli.cli.serve_trainer",
        "Serve the Tinker training API (the tinker SDK's service, training and sampling clients) on a local model.",
    ),
    "serve": LazyCommand(
        "atropos_cli.cli.serve",
        "Run ENV online: register with the API, collect groups with up to max_num_workers workers, post them.",
    ),
    "sft-gen": LazyCommand(
        "atropos_cli.cli.datagen",
        "Build an SFT dataset: the best rollouts of each group (rejection sampling), TRL-ready.",
    ),
    "dpo-gen": LazyCommand(
        "atropos_cli.cli.datagen",
        "Build a DPO dataset: chosen/rejected pairs from each group's score spread, TRL-ready.",
    ),
    "train": LazyCommand(
        "atropos_cli.cli.train",
        "Train a policy with GRPO (or a variant) and save Hugging Face checkpoints under OUT/checkpoints/step-N.",
    ),
    "export": LazyCommand(
        "atropos_cli.cli.export",
        "Serve ENV to other frameworks: `atropos export openenv ENV` (an OpenEnv-compatible env server), "
        "`atropos export ors ENV` (an Open Reward Standard server).",
    ),
    "proxy": LazyCommand(
        "atropos_cli.cli.proxy",
        "Serve the recording proxy: an OpenAI-compatible endpoint per rollout session that records every call's "
        "token ids.",
    ),
    "models": LazyCommand(
        "atropos_cli.cli.models",
        "List the shipped models with their directories, and the supported model families with their paths.",
    ),
    "inference": LazyCommand(
        "atropos_cli.cli.inference",
        "Serve a local causal LM over an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /health, "
        'POST /reload_weights {"path": DIR} to swap in new weights without restarting).',
    ),
}


def load_command(name: str) -> Any:
    """Import the command's module and build its click command (what `atropos NAME` runs)."""
    holder = typer.Typer(add_completion=False, pretty_exceptions_enable=False)
    importlib.import_module(COMMANDS[name].module).register(holder)
    group = typer.main.get_group(holder)
    return group.commands[name]


class LazyGroup(TyperGroup):
    """A Typer group whose commands are imported only when one runs (or its own --help is asked for).

    (Typer ships its own copy of click, `typer._click`, which has no public name for its types: hence `Any`.)
    """

    _listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if self._listing:  # the root help table only needs the name and the one-line help
            return TyperCommand(cmd_name, help=COMMANDS[cmd_name].help)
        return load_command(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        """An unknown command is a usage error that names the closest ones (`atropos trian`: did you mean
        'train'?); Typer's own suggestion reads `self.commands`, which a lazy group leaves empty."""
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS:
            close = get_close_matches(name, COMMANDS, n=3, cutoff=0.6)
            guess = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
            raise usage_error(ctx, f"no such command {name!r}{guess}", "the commands: " + ", ".join(COMMANDS))
        return super().resolve_command(ctx, args)

    def main(  # type: ignore[override]  # (the same parameters, by keyword)
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        """Run the CLI; a usage error (an unknown option, a missing argument, a bad value) prints in the
        `error:`/`hint:` format of every other error instead of Typer's box, and exits 2."""
        if not standalone_mode:
            return super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        from typer._click.exceptions import ClickException

        try:
            code = super().main(args=args, prog_name=prog_name, standalone_mode=False, **extra)
        except ClickException as exc:
            print_usage_error(exc)
            sys.exit(exc.exit_code)
        except typer.Abort:
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def usage_error(ctx: Any, message: str, hint: str) -> Any:
    """A usage error (exit 2) carrying a hint, printed by `print_usage_error`."""
    from typer._click.exceptions import UsageError

    error = UsageError(message, ctx)
    error.hint = hint  # type: ignore[attr-defined]
    return error


def print_usage_error(exc: Any) -> None:
    """`error: <what>` and `hint: <the fix, or where the help is>` on stderr."""
    from atropos_cli.cli.common import fail

    if type(exc).__name__ == "NoArgsIsHelpError":  # the help was printed: nothing is wrong
        return
    ctx = getattr(exc, "ctx", None)
    hint = getattr(exc, "hint", None)
    if hint is None and ctx is not None:
        hint = f"see '{ctx.command_path} --help'"
    message = exc.format_message()
    fail(message[:1].lower() + message[1:].rstrip("."), hint)


def fold_help_tables() -> None:
    """Rich cuts a table cell's word that does not fit with '…' (at 80 columns: `--micro-batch-to…`); Typer's
    option tables and help cells leave Rich's default, so here they fold such a word onto the next line instead."""
    from rich.columns import Columns
    from rich.table import Table
    from rich.text import Text
    from typer import rich_utils

    class FoldingTable(Table):
        def add_row(self, *cells: Any, **kwargs: Any) -> None:
            super().add_row(*cells, **kwargs)
            for column in self.columns:
                column.overflow = "fold"

    class FoldingColumns(Columns):  # an option's help: its text, [default: ...], [env var: ...]
        def __init__(self, renderables: Any = None, *args: Any, **kwargs: Any) -> None:
            super().__init__(renderables, *args, **kwargs)
            for item in self.renderables:
                if isinstance(item, Text) and item.overflow is None:
                    item.overflow = "fold"

    rich_utils.Table = FoldingTable  # type: ignore[misc]
    rich_utils.Columns = FoldingColumns  # type: ignore[misc]


fold_help_tables()

app = typer.Typer(
    name="atropos",
    cls=LazyGroup,
    help="Rollouts, scored datasets and a GRPO loop for RL with LLMs: offline-first.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from atropos_cli import __version__

        typer.echo(f"atropos {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version."),
    verbose: bool = typer.Option(
        False, "--verbose", help="Show third-party progress bars and logs (transformers, datasets)."
    ),
) -> None:
    """Rollouts, scored datasets and a GRPO loop for RL with LLMs: offline-first."""
    from atropos_cli.cli.common import route_warnings
    from atropos_cli.quiet import quiet_third_party

    quiet_third_party(verbose)
    route_warnings()


def main() -> None:
    app()


if __name__ == "__main__":
    main()
