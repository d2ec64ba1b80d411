"""What every command shares: the console, turning library errors into `error:`/`hint:` lines and exit codes."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import typer
from rich.console import Console

from atropos_cli.errors import AtroposError

__all__ = ["console", "err_console", "fail", "cli_errors"]

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def fail(message: str, hint: str | None = None, code: int = 1) -> typer.Exit:
    """Print a one-line error (and hint) to stderr and return the Exit to raise."""
    err_console.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    if hint:
        err_console.print(f"[yellow]hint:[/] {hint}", markup=True, soft_wrap=True)
    return typer.Exit(code)


@contextmanager
def cli_errors() -> Iterator[None]:
    """Run a command body; an AtroposError becomes a printed error with its exit code, Ctrl-C exits 130."""
    try:
        yield
    except AtroposError as exc:
        raise fail(exc.message, exc.hint, exc.exit_code) from None
    except KeyboardInterrupt:
        err_console.print("interrupted", style="yellow")
        sys.exit(130)
