"""`--resume` and every other read-back of a run dir survive a non-UTF-8 byte (issue 21): the line is counted and
reported, nothing is lost, never `internal error: UnicodeDecodeError`."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from atropos_cli.cli.app import app

BAD = b'{"kind": "rollout", "error": "caf\xe9 \xff"}\n'


def invoke(*args: str):
    return CliRunner().invoke(app, list(args))


def test_process_resume_with_a_non_utf8_byte_in_failures_and_groups(tmp_path: Path, fake_server) -> None:
    server = fake_server(rule="arithmetic")
    out = tmp_path / "r"
    args = ["process", "arithmetic", "--out", str(out), "--num-groups", "6", "--base-url", server.base_url]
    assert invoke(*args).exit_code == 0
    with (out / "failures.jsonl").open("ab") as handle:
        handle.write(BAD)
    lines = (out / "groups.jsonl").read_bytes().splitlines(keepends=True)
    lost_index = json.loads(lines[1])["meta"]["index"]
    lines[1] = lines[1][:40] + b"\xff\xfe" + lines[1][40:]
    (out / "groups.jsonl").write_bytes(b"".join(lines))
    result = invoke(*args, "--resume")
    assert result.exit_code == 0, result.output
    assert "UnicodeDecodeError" not in result.output and "internal error" not in result.output
    assert "2 unreadable line(s)" in result.output, result.output
    assert BAD in (out / "failures.jsonl").read_bytes()  # nothing deleted
    assert b"\xff\xfe" in (out / "groups.jsonl").read_bytes()
    readable = [line for line in (out / "groups.jsonl").read_bytes().splitlines() if b"\xff" not in line]
    assert sorted(json.loads(line)["meta"]["index"] for line in readable) == list(range(6))
    assert lost_index in [json.loads(line)["meta"]["index"] for line in readable]
    view = invoke("view", str(out))
    assert view.exit_code == 0 and "UnicodeDecodeError" not in view.output, view.output


def test_evaluate_resume_with_a_non_utf8_byte(tmp_path: Path, fake_server) -> None:
    server = fake_server(rule="arithmetic")
    out = tmp_path / "e"
    args = ["evaluate", "arithmetic", "--num-samples", "2", "--limit", "4", "--out", str(out)]
    args += ["--openai.base_url", server.base_url, "--openai.max_retries", "0"]
    assert invoke(*args).exit_code == 0
    for name in ("samples.jsonl", "failures.jsonl"):
        with (out / name).open("ab") as handle:
            handle.write(BAD)
    result = invoke(*args, "--resume")
    assert result.exit_code == 0, result.output
    assert "UnicodeDecodeError" not in result.output and "internal error" not in result.output
    assert BAD in (out / "samples.jsonl").read_bytes()


def test_a_non_utf8_saved_config_is_one_error_line(tmp_path: Path, fake_server) -> None:
    server = fake_server(rule="arithmetic")
    out = tmp_path / "r"
    args = ["process", "arithmetic", "--out", str(out), "--num-groups", "2", "--base-url", server.base_url]
    assert invoke(*args).exit_code == 0
    config = out / "config.yaml"
    config.write_bytes(config.read_bytes().replace(b"arithmetic", b"arithm\xefic", 1))
    result = invoke(*args, "--resume")
    assert result.exit_code == 2, result.output
    assert "config.yaml of the run is not readable" in result.output and "internal error" not in result.output


def test_trainer_state_and_metrics_with_a_stray_byte(tmp_path: Path) -> None:
    from atropos_cli.errors import ConfigError
    from atropos_cli.trainer.checkpoint import read_trainer_state
    from atropos_cli.trainer.step.metrics import read_metrics

    step = tmp_path / "checkpoints" / "step-3"
    step.mkdir(parents=True)
    (step / "trainer_state.json").write_bytes(b'{"step": 3, "note": "\xff"}')
    try:
        read_trainer_state(step)
    except ConfigError as exc:
        assert "trainer_state.json of the run is not readable" in exc.message
    else:
        raise AssertionError("a non-UTF-8 trainer_state.json was read")
    (tmp_path / "metrics.jsonl").write_bytes(b'{"step": 1}\n{"step": 2, "x": "\xff"}\n{"step": 3}\n')
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 3]


def test_serve_keeps_an_unreadable_spill_line(tmp_path: Path, monkeypatch) -> None:
    import asyncio

    from atropos_cli.runs.serve import ServeOptions, serve_env
    from test_serve import load, pull_all, running_api, start_trainer

    spill = tmp_path / "spill.jsonl"
    good = {"tokens": [[7, 8]], "masks": [[-100, 8]], "scores": [1.0]}
    spill.write_bytes(json.dumps(good).encode() + b"\n" + BAD + json.dumps(good).encode() + b"\n")
    monkeypatch.setenv("SERVE_TEST_ITEMS", "0")
    events: list[str] = []
    with running_api() as url:
        start_trainer(url, batch_size=2)
        options = ServeOptions(api_url=url, spill_path=str(spill))
        stats = asyncio.run(serve_env(load("--env.group_size", "1"), options, on_event=lambda _, m: events.append(m)))
        assert stats.counts.groups == 2 and pull_all(url) == [7, 7]
    assert not spill.exists()
    assert (tmp_path / "spill.unreadable.jsonl").read_bytes() == BAD
    assert any("1 unreadable lines of the spill file" in e for e in events), events
