"""`atropos --help` and every command's --help stay light: no torch, transformers, datasets or vllm imports."""

import subprocess
import sys

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app

HEAVY = ("torch", "transformers", "datasets", "vllm")


def test_importing_the_cli_pulls_in_no_heavy_stack():
    code = f"import sys, atropos_cli.cli.app as a\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("command", [c.name for c in app.registered_commands])
def test_each_command_help_is_light(command):
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom atropos_cli.cli.app import app\n"
        f"r = CliRunner().invoke(app, [{command!r}, '--help'])\n"
        "assert r.exit_code == 0, r.output\n"
        f"print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1:] in ([], [""])


def test_root_help_lists_the_commands():
    result = CliRunner().invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "process" in result.output and "envs" in result.output
