"""Crash-restart durability of `atropos api --state-dir`: a real subprocess, SIGKILL, restart, nothing lost."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

REG = {
    "wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 64,
    "checkpoint_dir": "ckpt", "save_checkpoint_interval": 5, "starting_step": 0, "num_steps": 10,
}  # fmt: skip
ENV = {"max_token_length": 64, "desired_name": "demo", "weight": 1.0, "group_size": 2}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def group(seed: int, size: int = 2, env_id: int = 0) -> dict:
    toks = [[seed, i] for i in range(size)]
    return {"tokens": toks, "masks": [[-100, i] for i in range(size)], "scores": [0.5] * size, "env_id": env_id}


@contextmanager
def api_process(state_dir: Path | None, port: int) -> Iterator[subprocess.Popen]:
    cli = "from atropos_cli.cli.app import main; main()"
    cmd = [sys.executable, "-c", cli, "api", "--port", str(port), "--status-every", "0"]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
                assert time.monotonic() < deadline, "api did not start"
                time.sleep(0.1)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(10)
        if proc.stdout:
            proc.stdout.close()


def tokens_of(batch: list[dict]) -> list[int]:
    return [g["tokens"][0][0] for g in batch]


def test_acknowledged_state_survives_sigkill_and_restart(tmp_path: Path) -> None:
    state = tmp_path / "state"
    port = _free_port()
    with api_process(state, port) as proc, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        assert c.post("/register", json=REG).status_code == 200
        assert c.get("/batch").json() == {"batch": None}
        assert c.post("/register-env", json=ENV).json()["env_id"] == 0
        for seed in range(1, 8):
            assert c.post("/scored_data", json=group(seed)).json() == {"status": "received"}
        assert c.post("/scored_data", json=group(100, size=1)).json() == {"status": "buffered", "buffer_size": 1}
        assert tokens_of(c.get("/batch").json()["batch"]) == [1, 2]  # and batch [3, 4] is formed, not served
        assert c.get("/status").json() == {"current_step": 2, "queue_size": 3}
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)

    with api_process(state, port) as proc, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        assert c.get("/info").json() == {"batch_size": 4, "max_token_len": 64}
        assert c.get("/status").json() == {"current_step": 2, "queue_size": 3}
        assert c.request("GET", "/status-env", json={"env_id": 0}).json()["self_queue_size"] == 3
        again = c.post("/register-env", json=ENV).json()
        assert (again["env_id"], again["wandb_name"]) == (1, "demo_1")  # registrations kept: no id reuse
        assert tokens_of(c.get("/batch").json()["batch"]) == [3, 4]  # the formed-unserved batch first
        assert c.post("/scored_data", json=group(101, size=1)).json() == {"status": "received"}
        assert tokens_of(c.get("/batch").json()["batch"]) == [5, 6]
        assert tokens_of(c.get("/batch").json()["batch"]) == [7, 100, 101]
        assert c.get("/status").json() == {"current_step": 4, "queue_size": 0}


def test_without_state_dir_it_says_in_memory_and_forgets(tmp_path: Path) -> None:
    port = _free_port()
    with api_process(None, port) as proc, httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        assert c.get("/health").json()["durable"] is False
        c.post("/register", json=REG)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=10)[0].decode()
    assert "IN-MEMORY mode" in out
    with api_process(None, port), httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
        assert c.get("/info").json() == {"batch_size": -1, "max_token_len": -1}
