"""`atropos serve-trainer` driven by the official tinker SDK (0.38.0, its own venv: $ATROPOS_TINKER_PYTHON, which
.ci/run builds) on the shipped tiny model, on CPU, offline: each scenario of tests/tinker_sdk/drive.py runs in
that venv against a real server on 127.0.0.1, stopped after."""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos_cli.testing import free_port
from differential import venv_python

DRIVE = Path(__file__).parent / "tinker_sdk" / "drive.py"
COOKBOOK = Path(__file__).parent / "tinker_sdk" / "cookbook_run.py"


@pytest.fixture
def tinker_python() -> str:
    return venv_python("ATROPOS_TINKER_PYTHON", "tinker==0.38.0 + tinker-cookbook==0.6.1")


@pytest.fixture
def trainer_server(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """Factory: start our serve-trainer app (state in tmp_path/state unless given) in a thread on 127.0.0.1."""
    from atropos_cli.resources import resolve_model_path
    from atropos_cli.testing.threaded import ThreadedServer
    from atropos_cli.tinker.app import create_app
    from atropos_cli.tinker.service import Settings

    started: list[ThreadedServer] = []

    def start(
        api_key: str | None = None, max_slots: int = 8, state_dir: Path | None = None, reuse: bool | None = None
    ) -> ThreadedServer:
        settings = Settings(
            model_dir=resolve_model_path("atropos-tiny-arith"),
            model_name="atropos-tiny-arith",
            state_dir=state_dir or tmp_path / "state",
            device="cpu",
            max_slots=max_slots,
            reuse_snapshots=reuse,
        )
        server = ThreadedServer(create_app(settings, api_key=api_key), lifespan="on").start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def drive(python: str, url: str, scenario: str, tmp_path: Path, state: dict[str, Any] | None = None,
          key: str = "tml-local") -> dict[str, Any]:  # fmt: skip
    state_file = tmp_path / f"{scenario}.json"
    state_file.write_text(json.dumps(state or {}))
    env = {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": key, "HF_HUB_OFFLINE": "1"}
    env.pop("TINKER_CREDENTIAL_CMD", None)
    proc = subprocess.run(
        [python, str(DRIVE), scenario, str(state_file)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_sdk(*command: str, url: str) -> None:
    """`command` with the SDK pointed at `url` (offline), as a user runs it; it must succeed."""
    env = {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": "tml-local", "HF_HUB_OFFLINE": "1"}
    env.pop("TINKER_CREDENTIAL_CMD", None)
    proc = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]


def run_cookbook(python: str, url: str, *args: str) -> None:
    run_sdk(python, str(COOKBOOK), *args, url=url)


def metrics(log_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (log_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def run_recipe(python: str, url: str, recipe: str, *args: str) -> None:
    """`python -m tinker_cookbook.recipes.RECIPE ARGS`: the recipe's own chz command line."""
    run_sdk(python, "-m", f"tinker_cookbook.recipes.{recipe}", *args, "behavior_if_log_dir_exists=delete", url=url)


def test_cookbook_recipes_run_unchanged(tinker_python: str, trainer_server: Callable[..., Any], tmp_path: Path) -> None:
    """The cookbook's chat SL recipe on a conversations file lowers the loss; its math RL recipe (arithmetic env)
    then runs from the SL run's final checkpoint: each one its own unchanged CLI entry point, in a subprocess.
    The tiny model's own template has no cookbook renderer: both use the cookbook's `role_colon` (plain text)."""
    from atropos_cli.resources import resolve_model_path

    model = resolve_model_path("atropos-tiny-arith")
    data = tmp_path / "conversations.jsonl"
    data.write_text("".join(
        json.dumps({"messages": [{"role": "user", "content": f"What is {a} + {b}?"},
                                 {"role": "assistant", "content": str(a + b)}]}) + "\n"
        for a in (3, 11, 20, 27) for b in (5, 14, 22, 30)
    ))  # fmt: skip
    server = trainer_server()
    common = [f"model_name={model}", "renderer_name=role_colon", "lora_rank=8", "save_every=0", "eval_every=0"]
    run_recipe(tinker_python, server.url, "chat_sl.train", *common, f"dataset={data}", f"log_path={tmp_path / 'sl'}",
               "batch_size=8", "num_epochs=2", "learning_rate=1e-2", "lr_schedule=constant",
               "max_length=64")  # fmt: skip
    nll = [m["train_mean_nll"] for m in metrics(tmp_path / "sl") if "train_mean_nll" in m]
    assert len(nll) == 4 and nll[-1] < nll[0] * 0.7, nll
    sl_state = json.loads((tmp_path / "sl" / "checkpoints.jsonl").read_text().splitlines()[-1])["state_path"]
    run_recipe(tinker_python, server.url, "math_rl.train", *common, "env=arithmetic", f"log_path={tmp_path / 'rl'}",
               f"load_checkpoint_path={sl_state}", "group_size=4", "groups_per_batch=4", "max_tokens=8",
               "learning_rate=3e-3", "loss_fn=importance_sampling", "max_steps=1")  # fmt: skip
    steps = [m for m in metrics(tmp_path / "rl") if "env/all/reward/total" in m]
    assert len(steps) == 1 and all(m["env/all/total_episodes"] == 16 for m in steps), steps
    # the sampler's log-probs of the sampled tokens are the trainer's: both serve the SL run's weights
    assert all(abs(m["optim/kl_sample_train_v1"]) < 1e-3 for m in steps), steps
    final = json.loads((tmp_path / "rl" / "checkpoints.jsonl").read_text().splitlines()[-1])
    assert final["sampler_path"].endswith("/sampler_weights/final") and final["cumulative_tokens"]["sampled"] > 0


@pytest.mark.parametrize(
    "reuse",
    [pytest.param(False, marks=pytest.mark.slow), True],  # CI: the in-place update (the CUDA default) only
    ids=["new-sampler-each-step", "sampler-updated-in-place"],
)
def test_cookbook_rl_loop_raises_the_reward(
    tinker_python: str, trainer_server: Callable[..., Any], tmp_path: Path, reuse: bool
) -> None:
    """The cookbook's RL loop (importance sampling, a new sampler each step) on its arithmetic env; the same with
    each unnamed snapshot written into the previous one's engine (the CUDA default), which must sample the new
    weights: else the reward would not climb."""
    from atropos_cli.resources import resolve_model_path

    server = trainer_server(reuse=reuse)
    run_cookbook(tinker_python, server.url, "rl", resolve_model_path("atropos-tiny-arith"), str(tmp_path / "rl"),
                 "8", "16", "3e-3")  # fmt: skip
    reward = [m["env/all/reward/total"] for m in metrics(tmp_path / "rl") if "env/all/reward/total" in m]
    assert len(reward) == 8
    assert sum(reward[-3:]) / 3 > sum(reward[:3]) / 3 + 0.1, reward


def test_sdk_basic_calls(tinker_python: str, trainer_server: Callable[..., Any], tmp_path: Path) -> None:
    server = trainer_server()
    out = drive(tinker_python, server.url, "basic", tmp_path)
    assert out["models"] == ["atropos-tiny-arith"]
    assert all(lp <= 0 for lp in out["forward_logprobs"])
    assert out["losses"][-1] < out["losses"][0] / 2  # LoRA SFT on one answer: the loss falls
    assert set(out["rl_losses"]) == {"importance_sampling", "ppo", "cispo", "dro", "gspo"}
    assert all(math.isfinite(v) for v in out["rl_losses"].values())
    assert out["custom"]["mean_nll"] > 0  # forward_backward_custom: forward, then the cross-entropy surrogate
    assert len(out["samples"]) == 4
    for tokens, logprobs, stop in out["samples"]:
        assert len(tokens) == len(logprobs) > 0 and all(lp <= 0 for lp in logprobs)
        assert stop in ("stop", "length")
    assert len(out["prompt_logprobs"]) == out["prompt_len"] and out["prompt_logprobs"][0] is None
    assert "unknown loss_fn 'hinge'" in out["unknown_loss"] and "400" in out["unknown_loss"]
    assert "'stable_reinforce' is not supported" in out["stable_loss"]
    assert "has shape [1]" in out["short_inputs"]
    assert out["info"]["is_lora"] is True and out["info"]["lora_rank"] == 4


def test_sdk_clients_share_one_base_without_mixing(
    tinker_python: str, trainer_server: Callable[..., Any], tmp_path: Path
) -> None:
    server = trainer_server(max_slots=3)
    out = drive(tinker_python, server.url, "tenants", tmp_path)
    for name in ("a", "b", "full"):
        assert out["after"][name] < out["before"][name] / 2, name
    # client a learned "5": its loss on b's answer "7" did not fall as b's own did
    assert out["a_on_b"] > out["after"]["b"] * 2
    assert [i["lora_rank"] for i in out["info"]] == [4, 8, None]
    assert out["info"][2]["is_lora"] is False  # rank 0: full fine-tuning
    assert "all 3 training slots are taken" in out["fourth"]
    assert math.isfinite(out["after_close"])  # the closed session's three slots were given back


def test_sdk_resumes_after_restart(tinker_python: str, trainer_server: Callable[..., Any], tmp_path: Path) -> None:
    first = trainer_server()
    saved = drive(tinker_python, first.url, "resume_save", tmp_path)
    first.stop()
    second = trainer_server()  # the same state dir, a fresh process state
    loaded = drive(tinker_python, second.url, "resume_load", tmp_path, saved)
    assert loaded["loss"] == pytest.approx(saved["loss"], rel=1e-4)
    assert loaded["greedy"] == saved["greedy"]
    assert math.isfinite(loaded["trains"][0])
    assert "no training state" in loaded["missing"]


def test_api_key_is_required_when_set(tinker_python: str, trainer_server: Callable[..., Any], tmp_path: Path) -> None:
    server = trainer_server(api_key="tml-secret")
    assert drive(tinker_python, server.url, "auth", tmp_path, key="tml-secret")["models"] == ["atropos-tiny-arith"]
    refused = httpx.get(server.url + "/api/v1/get_server_capabilities", headers={"X-API-Key": "tml-wrong"})
    assert refused.status_code == 401 and "wrong API key" in refused.json()["detail"]


def test_bad_payloads_get_4xx_with_a_message(trainer_server: Callable[..., Any]) -> None:
    server = trainer_server()
    with httpx.Client(base_url=server.url + "/api/v1") as http:
        bad_json = http.post("/create_session", content=b"{", headers={"content-type": "application/json"})
        assert bad_json.status_code == 400 and "not valid JSON" in bad_json.json()["detail"]
        missing = http.post("/create_model", json={"session_id": "x"})
        assert missing.status_code == 400 and "model_seq_id" in missing.json()["detail"]
        garbage = http.post(
            "/forward_backward", content=b"\xff\xff\xff", headers={"content-type": "application/x-protobuf"}
        )
        assert garbage.status_code == 400 and "protobuf" in garbage.json()["detail"]
        as_json = http.post("/forward_backward", json={})
        assert as_json.status_code == 400 and "application/x-protobuf" in as_json.json()["detail"]
        unknown = http.post("/optim_step", json={"model_id": "nope:train:0", "adam_params": {}})
        assert unknown.status_code == 404 and "no training client" in unknown.json()["detail"]
        path = http.post("/load_weights", json={"path": "tinker://../../etc/weights/x", "optimizer": False})
        assert path.status_code == 400
        unserved = http.post("/save_weights_external", json={})
        assert unserved.status_code == 422 and "not supported" in unserved.json()["detail"]
        registry = http.get("/sessions/search")  # the REST registry's session routes; /finish is served
        assert registry.status_code == 422 and "session registry" in registry.json()["detail"]
        assert all(r.headers["x-should-retry"] == "false" for r in (bad_json, missing, unknown))
        rebound = http.get("/get_server_capabilities", headers={"Host": "evil.example"})
        assert rebound.status_code == 403  # a DNS-rebinding page names its own host
        form = http.post("/create_session", content=b"a=1", headers={"content-type": "text/plain"})
        assert form.status_code == 415


def test_replicas_train_as_one_rank(tinker_python: str, trainer_server: Callable[..., Any], tmp_path: Path) -> None:
    """`serve-trainer --nproc-per-node 2` (two gloo ranks on CPU, each a replica; forward_backward's datums split
    between them, gradients summed before optim_step) trains a LoRA client and a full fine-tune as one rank does."""
    port = free_port()
    cmd = [sys.executable, "-m", "atropos_cli", "serve-trainer", "--nproc-per-node", "2", "--device", "cpu",
           "--port", str(port), "--state-dir", str(tmp_path / "replicated")]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            assert server.poll() is None, server.stdout.read() if server.stdout else ""
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(url + "/api/v1/healthz").status_code == 200:
                    break
            assert time.monotonic() < deadline, "serve-trainer --nproc-per-node 2 did not come up"
            time.sleep(0.2)
        out = drive(tinker_python, url, "replicas", tmp_path, {"single": trainer_server().url})
    finally:
        server.send_signal(signal.SIGINT)  # as Ctrl-C: rank 0 closes the service, the other rank leaves with it
        log, _ = server.communicate(timeout=60)
    assert server.returncode == 0, log[-3000:]
    two, one = out["ranks"], out["single"]
    for rank in ("4", "0"):
        assert two[rank]["losses"] == pytest.approx(one[rank]["losses"], rel=1e-4), rank
        assert two[rank]["norms"] == pytest.approx(one[rank]["norms"], rel=1e-3), rank
        assert two[rank]["losses"][-1] < two[rank]["losses"][0], rank  # it trained
        for a, b in zip(two[rank]["logprobs"], one[rank]["logprobs"], strict=True):
            assert a == pytest.approx(b, rel=1e-3), rank  # two Adam steps on sums in another order


def test_cli_refuses_a_public_bind_without_a_key() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "atropos_cli", "serve-trainer", "--host", "0.0.0.0", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "without a key" in proc.stderr and "Traceback" not in proc.stderr
