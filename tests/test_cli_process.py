"""`atropos process` end to end through real HTTP against the fake inference server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml
from typer.testing import CliRunner

from atropos_cli.cli.app import app

FAST = ["--openai.max_retries", "0"]


def invoke(*args: str):
    return CliRunner().invoke(app, ["process", *args])


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_process_writes_every_output_and_a_summary(tmp_path, fake_server):
    server = fake_server(rule="arithmetic", accuracy=0.5)
    out = tmp_path / "run"
    result = invoke(
        "arithmetic",
        "--out",
        str(out),
        "--num-groups",
        "12",
        "--group-size",
        "4",
        "--base-url",
        server.base_url,
        "--concurrency",
        "4",
    )
    assert result.exit_code == 0, result.output
    assert "wrote 12 groups (48 rollouts" in result.output
    groups = read_jsonl(out / "groups.jsonl")
    assert len(groups) == 12 and sorted(g["meta"]["index"] for g in groups) == list(range(12))
    assert all(len(g["scores"]) == 4 for g in groups)
    assert pq.read_table(out / "groups.parquet").num_rows == 48
    html = (out / "index.html").read_text()
    assert "What is" in html
    config = yaml.safe_load((out / "config.yaml").read_text())
    assert config["env"]["group_size"] == 4 and config["openai"][0]["base_url"] == server.base_url
    assert (out / "failures.jsonl").read_text() == ""


def test_atropos_habits_dotted_flags_yaml_and_data_path(tmp_path, fake_server):
    server = fake_server(rule="arithmetic")
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"env": {"group_size": 2}, "openai": [{"base_url": server.base_url}]}))
    target = tmp_path / "data" / "out.jsonl"
    result = invoke(
        "arithmetic",
        "--env.total_steps",
        "5",
        "--env.data_path_to_save_groups",
        str(target),
        "--config",
        str(config),
        "--env.group_size",
        "3",
    )
    assert result.exit_code == 0, result.output
    groups = read_jsonl(target)
    assert len(groups) == 5 and {len(g["scores"]) for g in groups} == {3}  # CLI beats YAML
    for suffix in (".parquet", ".html", ".failures.jsonl", ".config.yaml"):
        assert (tmp_path / "data" / f"out{suffix}").exists(), suffix


def test_existing_output_is_refused_then_overwritten(tmp_path, fake_server):
    server = fake_server(rule="arithmetic")
    args = ["arithmetic", "--out", str(tmp_path / "r"), "--num-groups", "2", "--base-url", server.base_url]
    assert invoke(*args).exit_code == 0
    refused = invoke(*args)
    assert refused.exit_code == 2 and "already exists" in refused.output and "--resume" in refused.output
    assert invoke(*args, "--overwrite").exit_code == 0


def test_resume_after_a_torn_write_neither_duplicates_nor_loses(tmp_path, fake_server):
    server = fake_server(rule="arithmetic")
    out = tmp_path / "r"
    args = ["arithmetic", "--out", str(out), "--num-groups", "10", "--base-url", server.base_url]
    assert invoke(*args).exit_code == 0
    lines = (out / "groups.jsonl").read_text().splitlines(keepends=True)
    kept = sorted(json.loads(line)["meta"]["index"] for line in lines[:4])
    (out / "groups.jsonl").write_text("".join(lines[:4]) + lines[4][: len(lines[4]) // 2])  # crash mid-line
    result = invoke(*args, "--resume")
    assert result.exit_code == 0, result.output
    indices = [g["meta"]["index"] for g in read_jsonl(out / "groups.jsonl")]
    assert sorted(indices) == list(range(10)) and sorted(indices[:4]) == kept
    assert "4 kept from before" in result.output


def test_resume_refuses_a_changed_config_and_names_the_keys(tmp_path, fake_server):
    server = fake_server(rule="arithmetic")
    args = ["arithmetic", "--out", str(tmp_path / "r"), "--num-groups", "2", "--base-url", server.base_url]
    assert invoke(*args).exit_code == 0
    result = invoke(*args, "--resume", "--group-size", "2", "--env.temperature", "0.5")
    assert result.exit_code == 2
    assert "env.group_size" in result.output and "env.temperature" in result.output


def test_unreachable_server_is_one_clear_error(tmp_path):
    from atropos_cli.testing import free_port

    url = f"http://127.0.0.1:{free_port()}/v1"
    result = invoke("arithmetic", "--out", str(tmp_path / "r"), "--num-groups", "3", "--base-url", url, *FAST)
    assert result.exit_code != 0
    assert "no inference server answered" in result.output and "hint:" in result.output
    assert (tmp_path / "r" / "config.yaml").exists()


def test_garbage_from_the_server_is_recorded_then_stops_the_run(tmp_path, fake_server):
    server = fake_server(rule="arithmetic", garbage=True)
    out = tmp_path / "r"
    result = invoke(
        "arithmetic",
        "--out",
        str(out),
        "--num-groups",
        "40",
        "--base-url",
        server.base_url,
        "--concurrency",
        "1",
        *FAST,
    )
    assert result.exit_code == 1
    assert "groups in a row failed" in result.output
    failures = read_jsonl(out / "failures.jsonl")
    assert len(failures) == 8 and all(f["kind"] == "group" for f in failures)


def test_flaky_server_loses_no_group(tmp_path, fake_server):
    server = fake_server(rule="arithmetic", error_rate=0.3, seed=1)
    out = tmp_path / "r"
    result = invoke(
        "arithmetic",
        "--out",
        str(out),
        "--num-groups",
        "16",
        "--base-url",
        server.base_url,
        "--openai.max_retries",
        "6",
    )
    assert result.exit_code == 0, result.output
    groups, failures = read_jsonl(out / "groups.jsonl"), read_jsonl(out / "failures.jsonl")
    assert len(groups) + len([f for f in failures if f["kind"] == "group"]) == 16


def test_a_model_that_returns_empty_text_still_yields_scored_groups(tmp_path, fake_server):
    server = fake_server(rule=lambda prompt, index: "")
    out = tmp_path / "r"
    assert invoke("arithmetic", "--out", str(out), "--num-groups", "3", "--base-url", server.base_url).exit_code == 0
    groups = read_jsonl(out / "groups.jsonl")
    assert all(g["scores"] == [0.0] * 8 for g in groups)


def test_env_file_with_a_syntax_error(tmp_path):
    bad = tmp_path / "bad_env.py"
    bad.write_text("def broken(:\n")
    result = invoke(str(bad), "--out", str(tmp_path / "r"))
    assert result.exit_code == 2 and "bad_env.py:1: syntax error" in result.output
    assert not (tmp_path / "r").exists()


def test_ctrl_c_leaves_valid_files_and_resume_completes(tmp_path, fake_server):
    server = fake_server(rule="arithmetic", latency_s=0.2)
    out = tmp_path / "r"
    cmd = [
        sys.executable,
        "-m",
        "atropos_cli.cli.app",
        "process",
        "arithmetic",
        "--out",
        str(out),
        "--num-groups",
        "400",
        "--concurrency",
        "2",
        "--base-url",
        server.base_url,
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"}
    )
    deadline = time.time() + 30
    while time.time() < deadline and not ((out / "groups.jsonl").exists() and (out / "groups.jsonl").stat().st_size):
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "--resume" in stderr
    written = read_jsonl(out / "groups.jsonl")
    assert 0 < len(written) < 400
    assert pq.read_table(out / "groups.parquet").num_rows == 8 * len(written)
    result = invoke(
        "arithmetic",
        "--out",
        str(out),
        "--num-groups",
        "400",
        "--concurrency",
        "64",
        "--base-url",
        server.base_url,
        "--resume",
    )
    assert result.exit_code == 0, result.output
    indices = sorted(g["meta"]["index"] for g in read_jsonl(out / "groups.jsonl"))
    assert indices == list(range(400))


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["arithmetic", "--num-group", "3"], ["no such option: --num-group", "--num-groups"]),
        (["--num-grups", "3"], ["no such option: --num-grups", "--num-groups"]),  # not "unknown env '--num-grups'"
        (["arithmetic", "--env.nope", "3"], ["unknown env option 'nope'"]),
        (["arithmetic", "--env.group_size"], ["env.group_size needs a value"]),  # bare: not silently 1
        (["arithmetic", "--env.group_size", "--concurrency", "2"], ["env.group_size needs a value"]),
        (["arithmetic", "--num-groups", "0"], ["--num-groups", "greater than or equal to 1"]),
        (["arithmetic", "--num-groups", "-1"], ["--num-groups", "greater than or equal to 1"]),
        (["arithmetic", "--env.total_steps", "0"], ["env.total_steps", "greater than or equal to 1"]),
    ],
)
def test_unknown_missing_or_bad_flags_are_usage_errors(args, says, tmp_path):
    result = invoke(*args, "--out", str(tmp_path / "r"))
    assert result.exit_code == 2, result.output
    flat = " ".join(result.output.replace("│", " ").split())  # click's usage errors come in a wrapped box
    assert all(s in flat for s in says), result.output
    assert not (tmp_path / "r").exists()


def test_resume_reports_corrupt_lines_and_loses_nothing(tmp_path, fake_server):
    server = fake_server(rule="arithmetic")
    out = tmp_path / "r"
    args = ["arithmetic", "--out", str(out), "--num-groups", "6", "--base-url", server.base_url]
    assert invoke(*args).exit_code == 0
    lines = (out / "groups.jsonl").read_text().splitlines(keepends=True)
    lost_index = json.loads(lines[2])["meta"]["index"]
    lines[2] = '{"tokens": [[1, 2]], "masks": oops\n'  # a corrupt middle line
    (out / "groups.jsonl").write_text("".join(lines))
    (out / "failures.jsonl").write_text('{"kind": "rollout", "err\n{"kind": "group", "error_type": "X"}\n')
    result = invoke(*args, "--resume")
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert "2 unreadable line(s)" in result.output
    assert f"{out / 'groups.jsonl'}:3" in result.output and f"{out / 'failures.jsonl'}:1" in result.output
    assert "5 kept from before" in result.output
    text = (out / "groups.jsonl").read_text()
    assert "oops" in text and '"err' in (out / "failures.jsonl").read_text()  # nothing deleted
    indices = sorted(json.loads(line)["meta"]["index"] for line in text.splitlines() if "oops" not in line)
    assert indices == list(range(6)) and lost_index in indices


HOSTILE_REWARDS = """
from atropos_cli.env.base import SimpleEnv


class Hostile(SimpleEnv):
    name = "hostile"

    def items(self, split):
        yield from ({"id": i} for i in range(4))

    def prompt(self, item):
        return "What is 1 + 1?"

    def reward(self, completion, item):
        return [0.5, 1e308, float("nan"), {"score": 1.0, "style": -float("inf")}][item["id"]]
"""


def test_huge_or_non_finite_rewards_are_failure_records_not_a_traceback(tmp_path, fake_server):
    server = fake_server(rule="arithmetic")
    env_file = tmp_path / "hostile_env.py"
    env_file.write_text(HOSTILE_REWARDS)
    out = tmp_path / "run"
    result = invoke(str(env_file), "--out", str(out), "--num-groups", "4", "--group-size", "2",
                    "--base-url", server.base_url, *FAST)  # fmt: skip
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    groups = read_jsonl(out / "groups.jsonl")
    assert [g["meta"]["item_id"] for g in groups] == ["0"] and groups[0]["scores"] == [0.5, 0.5]
    failures = read_jsonl(out / "failures.jsonl")
    assert {f["item_id"] for f in failures} == {"1", "2", "3"} and len(failures) == 6
    assert all("rewards must be finite and within" in f["error"] for f in failures)
