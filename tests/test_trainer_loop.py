"""The training loop end to end on a tiny real model: from rollout files (checkpoints, metrics, resume), behind
a real trajectory API on 127.0.0.1, and the one-command loop with in-place weight sync (on-policy)."""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch

from atropos_cli.errors import ConfigError
from atropos_cli.trainer.data.sources import ApiWaitTimeout
from atropos_cli.trainer.run import RunOptions, run_training
from atropos_cli.trainer.step.grpo import GRPOConfig
from atropos_cli.types import ScoredGroup
from tiny_models import save_tiny_arith_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A 2-layer Llama with a real tokenizer and chat template, saved like any HF model (built in ~2 s)."""
    return save_tiny_arith_model(tmp_path_factory.mktemp("m"), op="+", seed=0)


def _groups(n: int, vocab: int = 280, size: int = 4, seed: int = 0) -> list[ScoredGroup]:
    rng = random.Random(seed)
    groups = []
    for _ in range(n):
        tokens, masks = [], []
        for _ in range(size):
            ids = [rng.randrange(5, vocab) for _ in range(rng.randint(6, 10))]
            tokens.append(ids)
            masks.append([-100] * 3 + ids[3:])
        groups.append(ScoredGroup(tokens=tokens, masks=masks, scores=[float(rng.random() > 0.5) for _ in tokens]))
    return groups


def _config(model: Path, out: Path, **kw) -> GRPOConfig:
    return GRPOConfig(model=str(model), out=str(out), **{"lr": 1e-3, "save_every": 1, "keep_checkpoints": 2, **kw})


def test_train_from_files_checkpoints_metrics_and_resume(tiny_model: Path, tmp_path: Path):
    data = tmp_path / "rollouts.jsonl"
    data.write_text("".join(json.dumps(g.to_record()) + "\n" for g in _groups(6)))
    out = tmp_path / "run"
    opts = RunOptions(data=[str(data)], groups_per_step=2)
    seen = []
    summary = run_training(opts, _config(tiny_model, out, steps=2), seen.append)
    assert summary.steps == 2 and summary.checkpoint == str(out / "checkpoints" / "step-2")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2] and seen == rows
    assert {"reward_mean", "reward_std", "signal_fraction", "loss", "clip_fraction", "tokens_per_s"} <= set(rows[0])
    from transformers import AutoModelForCausalLM, AutoTokenizer

    trained = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "step-2")
    initial = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert not torch.equal(trained.model.layers[0].mlp.up_proj.weight, initial.model.layers[0].mlp.up_proj.weight)
    assert AutoTokenizer.from_pretrained(out / "checkpoints" / "step-2").chat_template  # tokenizer saved too

    resumed = run_training(opts.model_copy(update={"resume": True}), _config(tiny_model, out, steps=3), seen.append)
    assert resumed.steps == 3
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-2", "step-3"]  # keep_checkpoints=2

    with pytest.raises(ConfigError, match="grpo.loss"):
        run_training(opts.model_copy(update={"resume": True}), _config(tiny_model, out, steps=4, loss="dapo"), print)


def _register(url: str, batch_size: int, headers: dict[str, str] | None = None) -> None:
    body = {
        "wandb_group": "t",
        "wandb_project": "t",
        "batch_size": batch_size,
        "max_token_len": 64,
        "checkpoint_dir": "c",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": 2,
    }
    httpx.post(f"{url}/register", json=body, headers=headers).raise_for_status()


def test_train_behind_a_trajectory_api(tiny_model: Path, tmp_path: Path, trajectory_api, monkeypatch):
    monkeypatch.setenv("ATROPOS_API_KEY", "sekret")  # the trainer sends the API's key, as `serve` does
    headers = {"Authorization": "Bearer sekret"}
    with trajectory_api(api_key="sekret") as api:
        _register(api.url, batch_size=8, headers=headers)
        for group in _groups(4, seed=3):
            response = httpx.post(f"{api.url}/scored_data", json=group.to_scored_data(), headers=headers)
            assert response.status_code == 200
        opts = RunOptions(api_url=api.url, api_batch_size=8, wait_timeout=5)
        seen: list[dict] = []
        summary = run_training(opts, _config(tiny_model, tmp_path / "run", steps=2), seen.append)
    assert summary.steps == 2
    assert [m["groups"] for m in seen] == [2, 2]  # 8 sequences a batch = 2 groups of 4


def test_api_without_data_times_out_with_a_clear_error(tiny_model: Path, tmp_path: Path, trajectory_api):
    with trajectory_api() as api:
        opts = RunOptions(api_url=api.url, api_batch_size=8, wait_timeout=1.0)
        with pytest.raises(ApiWaitTimeout, match="no batch from the trajectory API") as info:
            run_training(opts, _config(tiny_model, tmp_path / "run", steps=1), print)
    assert "atropos serve" in info.value.hint


PARITY_ENV = '''
from atropos_cli.env.base import SimpleEnv


class ParityEnv(SimpleEnv):
    """Reward 1 when the completion has an even number of characters: a signal even a random model gets."""

    name = "parity"

    def items(self, split):
        i = 0
        while True:
            yield {"id": i, "q": str(i)}
            i += 1

    def prompt(self, item):
        return "Say " + item["q"]

    def reward(self, completion, item):
        return float(len(completion) % 2 == 0)
'''


def test_one_command_loop_syncs_weights_in_place(tiny_model: Path, tmp_path: Path):
    env_file = tmp_path / "parity_env.py"
    env_file.write_text(PARITY_ENV)
    opts = RunOptions(
        env=str(env_file),
        dotted_args=["--env.group_size", "6", "--env.max_token_length", "8"],
        groups_per_step=4,
        inference="local",
    )
    seen: list[dict] = []
    summary = run_training(opts, _config(tiny_model, tmp_path / "run", steps=3, lr=3e-2), seen.append)
    assert summary.steps == 3 and len(seen) == 3
    trained = [m for m in seen if not m.get("skipped")]
    assert trained and all(m["signal_fraction"] > 0 for m in trained)
    # The engine samples from the weights the trainer just produced, so its logprobs match the trainer's
    # recomputation to float precision even though lr 3e-2 moved the weights a lot between steps.
    assert all(m["logprob_gap_abs"] < 1e-4 for m in seen[1:]), [m["logprob_gap_abs"] for m in seen]
    assert all("sync_s" in m for m in trained)


@pytest.mark.slow
def test_grpo_raises_reward_of_the_shipped_model_on_the_default_env(tmp_path: Path):
    """`atropos train arithmetic` in short: the shipped model, the default env and the CLI's defaults for it
    (lr 3e-4, 32 groups of 8 per step), on-policy for 80 steps with a fixed seed (~1 min on 2 cores). The
    model knows more than it samples (greedy 76%, temperature 1.0 36%), so the reward must climb."""
    from atropos_cli.resources import DEFAULT_MODEL, shipped_models
    from atropos_cli.trainer.config import default_lr

    if DEFAULT_MODEL not in shipped_models():
        pytest.skip("the shipped model is not built in this checkout")
    torch.manual_seed(0)
    config = GRPOConfig(model=DEFAULT_MODEL, out=str(tmp_path / "run"), lr=default_lr(DEFAULT_MODEL), steps=80,
                        save_every=0, seed=0)  # fmt: skip
    rewards: list[float] = []
    summary = run_training(RunOptions(env="arithmetic"), config, lambda m: rewards.append(m["reward_mean"]))
    assert summary.steps == 80 and summary.rollouts_failed == 0
    first, last = sum(rewards[:10]) / 10, sum(rewards[-10:]) / 10
    assert last > first + 0.08, [round(r, 3) for r in rewards]


def test_ctrl_c_stops_the_loop_and_leaves_a_checkpoint(tiny_model: Path, tmp_path: Path):
    import signal
    import subprocess
    import sys

    env_file = tmp_path / "parity_env.py"
    env_file.write_text(PARITY_ENV)
    out = tmp_path / "run"
    args = ["train", str(env_file), "--model", str(tiny_model), "--out", str(out), "--steps", "1000",
            "--save-every", "0", "--lr", "1e-3", "--env.group_size", "4", "--env.max_token_length", "6",
            "--groups-per-step", "2"]  # fmt: skip
    code = "import sys; from atropos_cli.cli.app import app; app(sys.argv[1:], prog_name='atropos')"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        for line in proc.stdout:  # wait until a few steps have trained
            if line.startswith("step    3/") or time.monotonic() > deadline:
                break
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, stderr
    assert "interrupted; the checkpoint" in stderr and "Traceback" not in stderr
    steps = [p.name for p in (out / "checkpoints").iterdir()]
    assert len(steps) == 1 and int(steps[0].split("-")[1]) >= 3


def test_external_inference_server_is_asked_to_reload_each_checkpoint(tiny_model: Path, tmp_path: Path):
    """`--inference external` against a real `atropos inference` server with an API key: checkpoints + POST
    /reload_weights, authorised with the key the env's clients use (--openai.api_key)."""
    import uvicorn

    from atropos_cli.config import ServerConfig
    from atropos_cli.inference.local import LocalBackend
    from atropos_cli.inference.server import ServerSettings, create_app

    backend = LocalBackend(ServerConfig(server_type="local", model_name=str(tiny_model)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    app = create_app(backend, ServerSettings(api_key="s3cret"))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert time.monotonic() < deadline, "the inference server did not start"
            time.sleep(0.02)
        env_file = tmp_path / "parity_env.py"
        env_file.write_text(PARITY_ENV)
        dotted = ["--openai.base_url", f"{url}/v1", "--openai.api_key", "s3cret", "--openai.server_type", "vllm",
                  "--openai.model_name",
                  str(tiny_model), "--openai.tokenizer_name", str(tiny_model), "--env.group_size", "4",
                  "--env.max_token_length", "6"]  # fmt: skip
        opts = RunOptions(env=str(env_file), dotted_args=dotted, inference="external", groups_per_step=2)
        seen: list[dict] = []
        summary = run_training(opts, _config(tiny_model, tmp_path / "run", steps=2, save_every=0), seen.append)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
    assert summary.steps == 2
    assert [m["reloaded_version"] for m in seen] == [1, 2]  # the server swapped weights after each step
    assert backend.version == 2
