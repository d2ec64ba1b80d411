"""`atropos port FILE`: the scan names each missing atroposlib name with its line; a supported env then runs
one group on the shipped local model."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from atropos_cli.cli.app import app

ENVS = Path(__file__).parent / "data" / "atropos_envs"


def test_port_lists_missing_names_with_their_lines(tmp_path: Path) -> None:
    env = tmp_path / "old_env.py"
    env.write_text(
        "from atroposlib.envs.base import BaseEnv, NotAThing\n"
        "from atroposlib.utils.force_diverse_samples import force_diverse_samples\n"
        "ds = load_dataset('gsm8k')\n"
    )
    result = CliRunner().invoke(app, ["port", str(env)])
    assert result.exit_code == 1
    assert f"{env}:1: missing: atroposlib.envs.base has no 'NotAThing'" in result.output
    assert f"{env}:2: missing: module atroposlib.utils.force_diverse_samples is not provided" in result.output
    assert f"{env}:3: note: datasets from the Hugging Face hub" in result.output


def test_port_runs_one_group_of_a_supported_env_on_the_local_model() -> None:
    result = CliRunner().invoke(app, ["port", str(ENVS / "math_n_choices.py")])
    assert result.exit_code == 0, result.output
    assert "every atroposlib name it imports is provided" in result.output
    assert "one group ran on the shipped local model" in result.output
