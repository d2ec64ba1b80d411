"""A hub dataset env with no hub: one clear error in seconds, no run dir left behind, and the retry works."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.testing import free_port

DATA = Path(__file__).parent / "data"


@pytest.fixture
def no_hub(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub endpoint is a local port nobody listens on (deterministic, unlike relying on the network)."""
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{free_port()}")
    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("command", ["process", "serve"])
def test_an_unreachable_hub_is_one_error_with_a_hint_and_leaves_nothing(no_hub, tmp_path, command):
    out = tmp_path / "run"
    args = [command, "gsm8k", "--openai.base_url", "http://127.0.0.1:9/v1"]
    args += ["--out", str(out)] if command == "process" else ["--api-url", "http://127.0.0.1:9"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert "cannot reach the Hugging Face hub" in result.output and "'openai/gsm8k'" in result.output
    assert "--env.data_path" in result.output and "HF_HUB_OFFLINE=1" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_the_retry_with_a_local_file_uses_the_same_out(no_hub, tmp_path, fake_server):
    server = fake_server(rule=["\\boxed{1}"])
    out = tmp_path / "run"
    args = ["process", "gsm8k", "--out", str(out), "--num-groups", "2", "--group-size", "2"]
    assert CliRunner().invoke(app, [*args, "--base-url", server.base_url]).exit_code == 2
    data = ["--env.data_path", str(DATA / "gsm8k_tiny.jsonl")]
    result = CliRunner().invoke(app, [*args, *data, "--base-url", server.base_url])
    assert result.exit_code == 0, result.output
    assert len((out / "groups.jsonl").read_text().splitlines()) == 2


def test_a_run_that_wrote_no_record_does_not_block_the_retry(tmp_path, fake_server):
    out = tmp_path / "run"
    args = ["process", "arithmetic", "--out", str(out), "--num-groups", "2", "--openai.max_retries", "0"]
    dead = f"http://127.0.0.1:{free_port()}/v1"
    failed = CliRunner().invoke(app, [*args, "--base-url", dead])
    assert failed.exit_code != 0 and "no inference server answered" in failed.output
    assert (out / "config.yaml").exists()  # kept: --resume can continue it once a server answers
    retry = CliRunner().invoke(app, [*args, "--base-url", fake_server(rule="arithmetic").base_url])
    assert retry.exit_code == 0, retry.output
    assert len((out / "groups.jsonl").read_text().splitlines()) == 2
    assert CliRunner().invoke(app, [*args, "--base-url", dead]).exit_code == 2  # now it holds records: refused


def test_hf_hub_offline_without_a_cached_copy_is_one_error(tmp_path):
    pytest.importorskip("datasets")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "atropos_cli.cli.app", "process", "gsm8k", "--out", str(tmp_path / "run")]
    cmd += ["--env.dataset_name", "atropos-tests/no-such-dataset", "--openai.base_url", "http://127.0.0.1:9/v1"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "cannot load 'atropos-tests/no-such-dataset' (train)" in done.stderr
    assert "not in your Hugging Face cache" in done.stderr and "Traceback" not in done.stderr


def test_math_verify_timeout_warning_is_logged_once(caplog):
    pytest.importorskip("math_verify")
    from atropos_cli.envs._shared.mathcheck import answers_match

    def many() -> None:  # off the main thread math-verify runs without timeouts and warns on every call
        for gold in ("4", "5", "6"):
            answers_match(f"so \\boxed{{{gold}}}", gold)

    with caplog.at_level(logging.WARNING):
        thread = threading.Thread(target=many)
        thread.start()
        thread.join()
    warned = [r.name for r in caplog.records if "Timeout is disabled" in r.getMessage()]
    assert len(warned) == len(set(warned)), warned  # once per math-verify logger, not once per call
