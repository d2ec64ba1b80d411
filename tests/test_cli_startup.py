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
    assert result.exit_code == 2 and "no such command" in result.output


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


def test_a_misspelled_command_gets_a_did_you_mean():
    result = CliRunner().invoke(app, ["trian"])
    assert result.exit_code == 2
    assert result.output.splitlines()[0] == "error: no such command 'trian'; did you mean 'train'?"
    assert result.output.splitlines()[1].startswith("hint: the commands: process, evaluate,")


@pytest.mark.parametrize(
    "args, says",
    [
        (["train", "--stepz", "3"], "error: no such option: --stepz"),
        (["train", "--steps", "x"], "error: invalid value for '--steps'"),
        (["export", "openenv"], "error: missing argument 'env'"),
        (["envs", "extra"], "error: got unexpected extra argument"),
    ],
)
def test_usage_errors_print_in_the_error_hint_format_not_a_box(args, says):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    lines = result.output.splitlines()
    assert lines[0].startswith(says), result.output
    assert lines[1] == f"hint: see 'atropos {' '.join(args[: 2 if args[0] == 'export' else 1])} --help'"
    assert len(lines) == 2 and "╭" not in result.output and "Usage:" not in result.output


@pytest.mark.parametrize("command", [*COMMANDS, None])
def test_help_at_80_columns_cuts_nothing_with_an_ellipsis(command):
    result = CliRunner().invoke(app, [*([command] if command else []), "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0
    assert max(len(line) for line in result.output.splitlines()) <= 80
    assert "…" not in result.output


def test_train_help_shows_the_learning_rate_a_run_uses():
    from atropos_cli.resources import DEFAULT_MODEL
    from atropos_cli.trainer.config import default_lr

    result = CliRunner().invoke(app, ["train", "--help"], env={"COLUMNS": "250"})
    line = next(line for line in result.output.splitlines() if "--lr " in line)
    assert f"[default: ({default_lr(DEFAULT_MODEL):g} for the shipped {DEFAULT_MODEL}, else " in line, line
    assert f"else {default_lr('Qwen/Qwen2.5-0.5B-Instruct'):g})]" in line, line
