"""The README's example env runs as written."""

import json
from pathlib import Path

from typer.testing import CliRunner

from atropos_cli.cli.app import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "parity_env.py"


def test_parity_example_env_processes_and_scores(tmp_path, fake_server):
    server = fake_server(rule=lambda prompt, index: "even" if index % 2 == 0 else "odd!!!!!!!!!!")
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "process",
            str(EXAMPLE),
            "--out",
            str(out),
            "--num-groups",
            "4",
            "--group-size",
            "2",
            "--base-url",
            server.base_url,
        ],
    )
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 4
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 1.0]  # one of "even"/"odd" is right for each number
        parts = group["meta"]["rollouts"][0]["reward_parts"]
        assert set(parts) == {"score", "short"}
