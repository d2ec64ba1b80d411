"""mkdocs hook: the CLI reference page (cli.md), generated at build time from the commands' own help.

Typer's `utils docs` renders every command's usage, arguments and options (their help text and defaults, declared
once in the code) as Markdown. The page is never in git, so it cannot drift from `atropos --help`.
"""

from __future__ import annotations

import subprocess
import sys

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

PAGE = "cli.md"
INTRO = """# CLI reference

Every command, its arguments and options, with their defaults, as `atropos COMMAND --help` prints them. This page
is generated from the commands' own help each time the site is built (`docs/hooks/cli_reference.py`).
Exit codes are the same for every command: [Concepts](concepts.md#exit-codes).

"""


def cli_markdown() -> str:
    """The reference as Markdown: typer's `utils docs` on atropos' app, one heading per command."""
    result = subprocess.run(
        [sys.executable, "-m", "typer", "atropos_cli.cli.app", "utils", "docs", "--name", "atropos"],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.startswith("# `atropos`"):
        raise RuntimeError(f"cannot generate the CLI reference (typer utils docs): {result.stderr.strip()[-2000:]}")
    body = result.stdout.split("\n", 1)[1]  # our own title replaces typer's
    return INTRO + "## `atropos`\n" + body


def on_files(files: Files, config: MkDocsConfig) -> Files:
    files.append(File.generated(config, PAGE, content=cli_markdown()))
    return files
