"""`atropos --help` and every command's --help stay light: no torch, transformers, datasets or vllm imports."""

import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import COMMANDS, app, load_command

HEAVY = ("torch", "transformers", "datasets", "vllm")
QUIET_VARS = ("HF_HUB_DISABLE_PROGRESS_BARS", "TRANSFORMERS_VERBOSITY", "DATASETS_VERBOSITY", "ATROPOS_VERBOSE")


def test_importing_the_cli_pulls_in_no_heavy_stack():
    code = f"import sys, atropos_cli.cli.app as a\nprint(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""


@pytest.mark.parametrize("command", list(COMMANDS))
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


def test_root_help_imports_no_command_module_and_no_pydantic():
    code = (
        "import sys\nfrom typer.testing import CliRunner\nfrom atropos_cli.cli.app import app\n"
        "r = CliRunner().invoke(app, ['--help'])\nassert r.exit_code == 0, r.output\n"
        "print(','.join(sorted(m for m in sys.modules if m.startswith('atropos_cli.cli.') or m == 'pydantic')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "atropos_cli.cli.app"


@pytest.mark.parametrize("command", list(COMMANDS))
def test_the_help_table_says_what_each_command_says_of_itself(command):
    own = load_command(command).help or ""
    assert COMMANDS[command].help == " ".join(own.split("\n\n")[0].split())


def test_an_unknown_command_is_an_error():
    result = CliRunner().invoke(app, ["proces"])
    assert result.exit_code == 2 and "No such command" in result.output


QUIET_PROBE = (
    "import sys\nfrom typer.testing import CliRunner\nfrom atropos_cli.cli.app import app\n"
    "assert CliRunner().invoke(app, [*sys.argv[1:], 'envs']).exit_code == 0\n"
    "from transformers import AutoModelForCausalLM\nfrom atropos_cli.resources import resolve_model_path\n"
    "AutoModelForCausalLM.from_pretrained(resolve_model_path('atropos-tiny-arith'))\n"
)


def test_third_party_loading_bars_show_only_with_verbose():
    env = {k: v for k, v in os.environ.items() if k not in QUIET_VARS}
    quiet = subprocess.run([sys.executable, "-c", QUIET_PROBE], capture_output=True, text=True, env=env)
    assert quiet.returncode == 0, quiet.stderr
    assert "Loading weights" not in quiet.stderr
    loud = subprocess.run([sys.executable, "-c", QUIET_PROBE, "--verbose"], capture_output=True, text=True, env=env)
    assert loud.returncode == 0, loud.stderr
    assert "Loading weights" in loud.stderr
