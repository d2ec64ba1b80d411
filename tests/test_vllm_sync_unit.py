"""`--vllm-sync` without vLLM: the endpoint sequence, the auto-probe, the errors, the child's flags and env.

A fake vLLM (FAKE_VLLM below) speaks the endpoints of vLLM 0.32 that we use, with the same switches: the dev
routes exist only with VLLM_SERVER_DEV_MODE=1, the LoRA route only with VLLM_ALLOW_RUNTIME_LORA_UPDATING=True.
It runs in-process on our threaded uvicorn, or as the child process `VLLMServer` launches
(`python -m vllm.entrypoints.openai.api_server`, found on PYTHONPATH), and records every call it gets.
The trainer is a hand-written fake that writes checkpoint and adapter directories.
"""

from __future__ import annotations

import importlib.util
import os
import socket
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.errors import ConfigError, InferenceError
from atropos_cli.testing.threaded import ThreadedServer
from atropos_cli.trainer.weights.vllm import VLLMServer, VLLMSync, vllm_lora_rank

FAKE_VLLM = """
import argparse, os, sys
from pathlib import Path
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse


def build_app(dev, lora, fail=None, device="cuda"):
    app = FastAPI()
    calls, state = [], {"paused": False, "version": "default"}

    async def record(request, name):
        body = await request.body()
        calls.append({"endpoint": f"{request.method} {request.url.path}", "query": dict(request.query_params),
                      "body": (await request.json()) if body else None})
        if name == fail:
            return JSONResponse({"error": {"message": f"{name} broke", "code": 500}}, status_code=500)
        return None

    @app.get("/health")
    async def health():
        return {}

    @app.get("/_calls")
    async def _calls():
        env = {k: os.environ.get(k) for k in ("VLLM_SERVER_DEV_MODE", "VLLM_ALLOW_RUNTIME_LORA_UPDATING")}
        return {"calls": calls, "pid": os.getpid(), "argv": sys.argv[1:], "env": env, **state}

    if dev:
        @app.get("/is_paused")
        async def is_paused(request: Request):
            return (await record(request, "is_paused")) or {"is_paused": state["paused"]}

        @app.get("/server_info")
        async def server_info(request: Request):
            failed = await record(request, "server_info")
            return failed or {"vllm_config": {"device_config": {"device": device}}}

        @app.post("/pause")
        async def pause(request: Request):
            state["paused"] = True
            return (await record(request, "pause")) or {"status": "paused"}

        @app.post("/resume")
        async def resume(request: Request):
            state["paused"] = False
            return (await record(request, "resume")) or {"status": "resumed"}

        @app.post("/collective_rpc")
        async def collective_rpc(request: Request):
            failed = await record(request, "collective_rpc")
            path = (await request.json())["kwargs"]["weights_path"]
            if failed or not (Path(path) / "config.json").is_file():  # vLLM answers 500 for a missing dir
                return failed or JSONResponse({"error": {"message": "no weights", "code": 500}}, status_code=500)
            return {"results": [None]}

        @app.post("/reset_prefix_cache")
        async def reset_prefix_cache(request: Request):
            return (await record(request, "reset_prefix_cache")) or {"success": True}

        @app.post("/update_weight_version")
        async def update_weight_version(request: Request):
            state["version"] = (await request.json())["new_version"]
            return (await record(request, "update_weight_version")) or {"success": True}

    if lora:
        @app.post("/v1/load_lora_adapter")
        async def load_lora_adapter(request: Request):
            return (await record(request, "load_lora_adapter")) or "Success"

    return app


if __name__ == "__main__":
    import uvicorn
    parser = argparse.ArgumentParser()
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    known, _ = parser.parse_known_args()
    dev = os.environ.get("VLLM_SERVER_DEV_MODE") == "1" and not os.environ.get("FAKE_VLLM_OLD")
    lora = os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING") == "True"
    app = build_app(dev, lora, device=os.environ.get("FAKE_VLLM_DEVICE", "cuda"))
    uvicorn.run(app, host=known.host, port=known.port, log_level="warning")
"""


@pytest.fixture
def fake_vllm_dir(tmp_path: Path) -> Path:
    """A directory holding `vllm/entrypoints/openai/api_server.py` (the fake), for PYTHONPATH or import."""
    root = tmp_path / "fakevllm"
    module = root / "vllm" / "entrypoints" / "openai" / "api_server.py"
    module.parent.mkdir(parents=True)
    module.write_text(FAKE_VLLM)
    return root


def _fake_app(fake_vllm_dir: Path, dev: bool = True, lora: bool = False, fail: str | None = None, device="cuda"):
    path = fake_vllm_dir / "vllm" / "entrypoints" / "openai" / "api_server.py"
    spec = importlib.util.spec_from_file_location("fake_vllm_api_server", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_app(dev, lora, fail, device)


class FakeTrainer:
    """What VLLMSync needs of GRPOTrainer: step_count, save(out), is_lora, save_adapter(path)."""

    def __init__(self, step: int, lora: bool = False) -> None:
        self.step_count, self.is_lora = step, lora

    def save(self, out: Path) -> Path:
        path = out / "checkpoints" / f"step-{self.step_count}"
        path.mkdir(parents=True, exist_ok=True)
        (path / "config.json").write_text("{}")
        return path

    def save_adapter(self, path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        (path / "adapter_config.json").write_text('{"r": 5}')
        (path / "adapter_model.safetensors").write_bytes(b"")
        return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _calls(url: str) -> list[tuple[str, object]]:
    """(endpoint, the part of the request that matters) for every call the fake recorded."""
    seen = httpx.get(url + "/_calls", timeout=5).json()["calls"]
    return [(c["endpoint"], c["query"] or c["body"]) for c in seen]


def _unstarted(port: int, tmp_path: Path, model: str = "atropos-tiny-arith", **kwargs) -> VLLMServer:
    return VLLMServer(model, sys.executable, port, 10, tmp_path, **kwargs)


def test_reload_pauses_reloads_resets_versions_and_resumes_in_that_order(tmp_path: Path, fake_vllm_dir: Path):
    with ThreadedServer(_fake_app(fake_vllm_dir)) as fake:
        server = _unstarted(fake.port, tmp_path)
        sync = VLLMSync(server, tmp_path, every=2, mode="auto")
        assert sync.mode == "reload"
        assert sync(FakeTrainer(step=1)) == {}  # not a sync step
        metrics = sync(FakeTrainer(step=2))
        calls, state = _calls(fake.url), httpx.get(fake.url + "/_calls").json()
    checkpoint = tmp_path / "checkpoints" / "step-2"
    assert calls == [
        ("GET /is_paused", None),
        ("GET /server_info", {"config_format": "json"}),
        ("POST /pause", {"mode": "wait"}),
        (
            "POST /collective_rpc",
            {"method": "reload_weights", "kwargs": {"weights_path": str(checkpoint.resolve())}, "timeout": 10},
        ),
        ("POST /reset_prefix_cache", None),
        ("POST /update_weight_version", {"new_version": "2"}),
        ("POST /resume", None),
    ]
    assert metrics["sync_mode"] == "reload" and metrics["weight_version"] == 2 and metrics["sync_s"] >= 0
    assert metrics["synced_checkpoint"] == str(checkpoint)
    assert state["paused"] is False and state["version"] == "2" and server.restarts == 0


@pytest.mark.parametrize("failing", ["collective_rpc", "reset_prefix_cache", "update_weight_version"])
def test_a_failed_reload_names_step_endpoint_status_and_checkpoint_and_still_resumes(
    tmp_path: Path, fake_vllm_dir: Path, failing: str
):
    with ThreadedServer(_fake_app(fake_vllm_dir, fail=failing)) as fake:
        sync = VLLMSync(_unstarted(fake.port, tmp_path), tmp_path, every=1, mode="reload")
        with pytest.raises(InferenceError) as caught:
            sync(FakeTrainer(step=3))
        calls, state = _calls(fake.url), httpx.get(fake.url + "/_calls").json()
    checkpoint = tmp_path / "checkpoints" / "step-3"
    message = str(caught.value)
    assert f"weight sync of step 3 failed at POST /{failing} (HTTP 500)" in message
    assert f"{failing} broke" in message and repr(str(checkpoint)) in message and "vllm.log" in message
    assert (checkpoint / "config.json").is_file()  # the step's weights are on disk for --resume
    assert calls[-1] == ("POST /resume", None) and state["paused"] is False


def test_reload_from_a_checkpoint_vllm_cannot_read_is_reported(tmp_path: Path, fake_vllm_dir: Path):
    class BrokenSave(FakeTrainer):
        def save(self, out: Path) -> Path:
            path = out / "checkpoints" / f"step-{self.step_count}"
            path.mkdir(parents=True)
            return path  # no config.json: vLLM's loader fails with 500

    with ThreadedServer(_fake_app(fake_vllm_dir)) as fake:
        sync = VLLMSync(_unstarted(fake.port, tmp_path), tmp_path, every=1)
        with pytest.raises(InferenceError, match=r"step 1 failed at POST /collective_rpc \(HTTP 500\).*no weights"):
            sync(BrokenSave(step=1))
        assert _calls(fake.url)[-1] == ("POST /resume", None)


def test_a_server_that_went_away_gives_a_clear_error_not_a_hang(tmp_path: Path, fake_vllm_dir: Path):
    fake = ThreadedServer(_fake_app(fake_vllm_dir)).start()
    sync = VLLMSync(_unstarted(fake.port, tmp_path), tmp_path, every=1)
    fake.stop()
    with pytest.raises(InferenceError) as caught:
        sync(FakeTrainer(step=4))
    assert "step 4 failed at POST /pause (no response)" in str(caught.value)
    assert (tmp_path / "checkpoints" / "step-4").is_dir()
    with pytest.raises(InferenceError, match=r"GET /is_paused failed: no response"):
        VLLMSync(_unstarted(fake.port, tmp_path), tmp_path, every=1)


def test_without_dev_endpoints_auto_picks_restart_and_reload_is_refused(tmp_path: Path, fake_vllm_dir: Path):
    with ThreadedServer(_fake_app(fake_vllm_dir, dev=False)) as fake:
        server = _unstarted(fake.port, tmp_path)
        assert VLLMSync(server, tmp_path, every=1, mode="auto").mode == "restart"
        assert VLLMSync(server, tmp_path, every=1, mode="restart").mode == "restart"
        with pytest.raises(InferenceError, match=r"--vllm-sync reload: .* no weight-reload endpoints") as caught:
            VLLMSync(server, tmp_path, every=1, mode="reload")
    assert "--vllm-sync restart" in caught.value.hint


def test_a_cpu_vllm_with_tied_embeddings_restarts_instead_of_serving_a_stale_lm_head(
    tmp_path: Path, fake_vllm_dir: Path
):
    untied = tmp_path / "untied"
    untied.mkdir()
    (untied / "config.json").write_text('{"tie_word_embeddings": false}')
    with ThreadedServer(_fake_app(fake_vllm_dir, device="cpu")) as fake:
        tied = _unstarted(fake.port, tmp_path)  # the shipped model ties its LM head to the embeddings
        auto = VLLMSync(tied, tmp_path, every=1)
        with pytest.raises(InferenceError, match=r"--vllm-sync reload: vLLM's CPU backend keeps a stale LM head"):
            VLLMSync(tied, tmp_path, every=1, mode="reload")
        untied_sync = VLLMSync(_unstarted(fake.port, tmp_path, model=str(untied)), tmp_path, every=1, mode="reload")
    assert auto.mode == "restart" and "tied word embeddings" in auto.reason
    assert auto.describe().startswith("vLLM weight sync: restart every 1 step(s) (vLLM's CPU backend keeps")
    assert untied_sync.mode == "reload" and untied_sync.reason is None


def test_auto_on_an_old_vllm_restarts_the_child_on_the_checkpoint(
    tmp_path: Path, fake_vllm_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm_dir))
    monkeypatch.setenv("FAKE_VLLM_OLD", "1")  # a vLLM without the dev routes, whatever its env says
    with _unstarted(_free_port(), tmp_path) as server:
        first = httpx.get(server.root_url + "/_calls").json()
        sync = VLLMSync(server, tmp_path, every=1)
        metrics = sync(FakeTrainer(step=1))
        second = httpx.get(server.root_url + "/_calls").json()
    assert sync.mode == "restart" and metrics["sync_mode"] == "restart" and server.restarts == 1
    assert first["env"]["VLLM_SERVER_DEV_MODE"] == "1" and "VLLM_SERVER_DEV_MODE" not in os.environ
    assert second["pid"] != first["pid"]
    assert second["argv"][second["argv"].index("--model") + 1] == str(tmp_path / "checkpoints" / "step-1")
    assert server.proc is None  # stopped on exit


def test_restart_mode_restarts_and_labels_the_new_server_with_the_step(
    tmp_path: Path, fake_vllm_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm_dir))
    with _unstarted(_free_port(), tmp_path) as server:
        first = httpx.get(server.root_url + "/_calls").json()
        metrics = VLLMSync(server, tmp_path, every=1, mode="restart")(FakeTrainer(step=5))
        second = httpx.get(server.root_url + "/_calls").json()
    assert metrics["sync_mode"] == "restart" and server.restarts == 1 and second["pid"] != first["pid"]
    assert second["version"] == "5" and [c["endpoint"] for c in second["calls"]] == ["POST /update_weight_version"]


def test_lora_serves_the_adapter_as_policy_and_replaces_it_in_place(
    tmp_path: Path, fake_vllm_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("PYTHONPATH", str(fake_vllm_dir))
    adapter0 = FakeTrainer(0, lora=True).save_adapter(tmp_path / "adapters" / "step-0")
    with _unstarted(_free_port(), tmp_path, lora_adapter=adapter0, lora_rank=5) as server:
        sync = VLLMSync(server, tmp_path, every=1, mode="restart")  # LoRA always goes through the adapter route
        seen = [sync(FakeTrainer(step, lora=True)) for step in (1, 2, 3)]
        state = httpx.get(server.root_url + "/_calls").json()
        calls = _calls(server.root_url)
    argv = state["argv"]
    assert argv[argv.index("--served-model-name") + 1] == "policy-base" and server.served_name == "policy"
    assert argv[argv.index("--max-lora-rank") + 1] == "8" and "--enable-lora" in argv
    assert argv[argv.index("--lora-modules") + 1] == f"policy={adapter0}"
    assert state["env"] == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True"}
    loads = [body for endpoint, body in calls if endpoint == "POST /v1/load_lora_adapter"]
    assert loads[-1] == {
        "lora_name": "policy",
        "lora_path": str((tmp_path / "adapters" / "step-3").resolve()),
        "load_inplace": True,
    }
    assert [m["sync_mode"] for m in seen] == ["lora"] * 3 and state["version"] == "3" and server.restarts == 0
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == ["step-2", "step-3"]


@pytest.mark.parametrize(("rank", "allowed"), [(1, 1), (5, 8), (8, 8), (17, 32), (300, 320), (512, 512)])
def test_lora_rank_rounds_up_to_one_vllm_accepts(rank: int, allowed: int):
    assert vllm_lora_rank(rank) == allowed


def test_lora_rank_above_vllms_limit_is_refused():
    with pytest.raises(ConfigError, match=r"LoRA rank 600 is above"):
        vllm_lora_rank(600)


def test_cli_refuses_an_unknown_sync_mode(tmp_path: Path):
    result = CliRunner().invoke(app, ["train", "--inference", "vllm", "--vllm-sync", "hot", "--out", str(tmp_path)])
    assert result.exit_code == 2
    flat = " ".join(result.output.replace("│", " ").split())  # click's usage error comes in a wrapped box
    assert "'hot' is not one of 'reload', 'restart', 'auto'" in flat
