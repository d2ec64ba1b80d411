"""Live two-way compatibility with atroposlib 0.4.0, installed in its own venv (never our dependency).

Opt-in: `ATROPOSLIB_PYTHON=/tmp/atroposlib-venv/bin/python .venv/bin/pytest tests/test_atroposlib_compat.py`
(setup: `python3 -m venv /tmp/atroposlib-venv && /tmp/atroposlib-venv/bin/pip install atroposlib==0.4.0`).

1. an unmodified Atropos env loop (`python env.py serve`, atroposlib's CLI and BaseEnv) against `atropos api`;
2. `atropos serve` against atroposlib's `run-api`;
3. atroposlib's `atropos-sft-gen` (a fake trainer) against `atropos api`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path

import httpx
import pytest

from atropos_cli.resources import resolve_model_path
from atropos_cli.runs.serve import ServeOptions, serve_env
from atropos_cli.testing import free_port
from atropos_conformance import portable_tokenizer
from differential import venv_python
from test_api_durability import api_process
from test_serve import load, start_trainer

PYTHON = os.environ.get("ATROPOSLIB_PYTHON", "")
pytestmark = pytest.mark.atroposlib


@pytest.fixture(autouse=True)
def atroposlib_venv() -> None:
    """Skip without atroposlib's venv here; where the venvs are required (.ci/run) its absence fails."""
    venv_python("ATROPOSLIB_PYTHON", "atroposlib")


DATA = Path(__file__).parent / "data" / "atroposlib"
REG = {
    "wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 2048,
    "checkpoint_dir": "c", "save_checkpoint_interval": 1, "starting_step": 0, "num_steps": 100,
}  # fmt: skip


@cache
def _tokenizer() -> Path:
    """The shipped tokenizer in a form atroposlib's venv reads whatever its transformers (4 or 5)."""
    return portable_tokenizer(resolve_model_path("atropos-tiny-arith"), Path(tempfile.mkdtemp()) / "tok")


@contextmanager
def atropos_process(args: list[str], log: Path) -> Iterator[subprocess.Popen]:
    env = {**os.environ, "ATROPOS_TEST_TOKENIZER": str(_tokenizer())}
    with log.open("w") as out:
        proc = subprocess.Popen([PYTHON, *args], env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            proc.terminate()
            proc.wait(20)


@contextmanager
def run_api() -> Iterator[str]:
    port = free_port()
    with atropos_process(
        ["-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(port)], Path(os.devnull)
    ):
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url + "/", timeout=1)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "atroposlib run-api did not start"
                time.sleep(0.2)
        yield url


def wait_for_batches(url: str, n: int, timeout_s: float = 90) -> list[list[dict]]:
    batches: list[list[dict]] = []
    deadline = time.monotonic() + timeout_s
    while len(batches) < n and time.monotonic() < deadline:
        batch = httpx.get(url + "/batch").json()["batch"]
        if batch:
            batches.append(batch)
        else:
            time.sleep(0.3)
    return batches


def test_atropos_env_serve_against_atropos_api(tmp_path: Path) -> None:
    port = free_port()
    with api_process(None, port):
        url = f"http://127.0.0.1:{port}"
        httpx.post(url + "/register", json=REG).raise_for_status()
        httpx.get(url + "/batch").raise_for_status()
        args = [str(DATA / "atropos_env.py"), "serve", "--env.rollout_server_url", url]
        with atropos_process(args, tmp_path / "env.log"):
            batches = wait_for_batches(url, 3)
        log = (tmp_path / "env.log").read_text()
        assert len(batches) == 3, log[-3000:]
        for batch in batches:
            assert sum(len(g["tokens"]) for g in batch) == 4
            assert all(g["env_id"] == 0 and len(g["tokens"][0]) == 603 for g in batch)
        metrics = httpx.get(url + "/metrics").text
        assert 'atropos_api_ingested_groups_total{env="counting_atropos_0"}' in metrics


def test_atropos_serve_against_atroposlib_run_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_ITEMS", "6")
    with run_api() as url:
        start_trainer(url, batch_size=4)
        loaded = load("--env.max_batches_offpolicy", "0")
        stats = asyncio.run(serve_env(loaded, ServeOptions(api_url=url, spill_path=str(tmp_path / "spill.jsonl"))))
        assert (stats.env_id, stats.counts.groups) == (0, 6)
        batches = wait_for_batches(url, 3, timeout_s=10)
        assert sorted(g["tokens"][0][0] for b in batches for g in b) == [0, 1, 2, 3, 4, 5]
        assert all(set(g) == set(batches[0][0]) and len(g) == 14 for b in batches for g in b)


def test_atroposlib_sft_gen_against_atropos_api(tmp_path: Path) -> None:
    port = free_port()
    out = tmp_path / "sft.jsonl"
    with api_process(None, port):
        url = f"http://127.0.0.1:{port}"
        sft_gen = str(Path(PYTHON).parent / "atropos-sft-gen")
        tokenizer = str(_tokenizer())
        sft_args = [sft_gen, str(out), "--api-url", url, "--group-size", "2", "--tasks-per-step", "2"]
        sft_args += ["--tokenizer", tokenizer, "--num-seqs-to-save", "4", "--max-token-len", "2048"]
        with atropos_process(sft_args, tmp_path / "sft.log") as sft:
            deadline = time.monotonic() + 60
            while httpx.get(url + "/info").json()["batch_size"] == -1:
                assert time.monotonic() < deadline, (tmp_path / "sft.log").read_text()[-2000:]
                time.sleep(0.3)
            env_args = [str(DATA / "atropos_env.py"), "serve", "--env.rollout_server_url", url]
            with atropos_process(env_args, tmp_path / "env.log"):
                while sft.poll() is None and time.monotonic() < deadline + 60:
                    time.sleep(0.5)
        assert out.exists(), (tmp_path / "sft.log").read_text()[-3000:]
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(rows) >= 4
