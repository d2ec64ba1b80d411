"""The ManagedServer proxy (Atropos main's managed_server_proxy) over real HTTP: sessions, chat completions
with tool calls, render, nodes, errors in OpenAI's shape, the browser guard; and an Atropos-style env whose
`managed_server()` goes through the proxy (ATROPOS_PROXY_URL) under `atropos process`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.compat.atroposlib.envs.server_handling.managed_server_proxy import create_app
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager
from atropos_cli.compat.tool_parsers import get_parser
from atropos_cli.resources import resolve_model_path
from atropos_cli.testing.threaded import ThreadedServer
from test_compat_atroposlib import SED
from test_tool_parsers import _tool_rule

TOKENIZER = resolve_model_path("atropos-tiny-arith")
DATA = Path(__file__).parent / "data" / "compat_names"
TOOLS = [{"type": "function", "function": {"name": "add", "parameters": {"properties": {"a": {"type": "integer"}}}}}]


@pytest.fixture
def proxy(fake_server):
    from atropos_cli.inference.tokenizer import load_tokenizer

    backend = fake_server(_tool_rule("hermes"), tokenizer=str(TOKENIZER))
    manager = ServerManager([APIServerConfig(base_url=backend.base_url, server_type="vllm", model_name="policy")])
    with ThreadedServer(create_app(manager, load_tokenizer(TOKENIZER), "policy")) as server:
        yield server, backend


def test_a_session_answers_tool_calls_tracks_nodes_and_ends(proxy) -> None:
    server, backend = proxy
    with httpx.Client(base_url=server.url, timeout=30) as client:
        created = client.post("/sessions/create", json={"tool_parser": "hermes"}).json()
        assert created["base_url"] == backend.base_url and created["model_name"] == "policy"
        uuid = created["uuid"]
        chat = [{"role": "user", "content": "What is 2 plus 3?"}]
        first = client.post(f"/{uuid}/v1/chat/completions", json={"messages": chat, "tools": TOOLS, "max_tokens": 200})
        assert first.status_code == 200, first.text
        choice = first.json()["choices"][0]
        call = choice["message"]["tool_calls"][0]
        assert choice["finish_reason"] == "tool_calls" and call["function"]["name"] == "add"
        chat += [{"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "5"}]
        rendered = client.post(f"/{uuid}/v1/chat/completions/render", json={"messages": chat, "tools": TOOLS}).json()
        raw_call = get_parser("hermes").render(None, [{"name": "add", "arguments": {"a": 2, "b": 3}}])
        assert raw_call in rendered["prompt_text"] and rendered["num_tokens"] == len(rendered["token_ids"])
        second = client.post(f"/{uuid}/v1/chat/completions", json={"messages": chat, "tools": TOOLS, "max_tokens": 40})
        assert second.json()["choices"][0]["message"]["content"] in ("The answer is 5", "No idea.")
        nodes = client.get(f"/{uuid}/nodes").json()["nodes"]
        assert len(nodes) == 1 and raw_call in nodes[0]["full_text"]  # one extending node per rollout
        assert len(nodes[0]["tokens"]) == len(nodes[0]["masked_tokens"]) == len(nodes[0]["logprobs"])
        assert [s["num_nodes"] for s in client.get("/sessions").json()["sessions"]] == [1]
        assert client.delete(f"/{uuid}").json() == {"status": "deleted", "uuid": uuid}
        gone = client.post(f"/{uuid}/v1/chat/completions", json={"messages": chat})
        assert gone.status_code == 404 and gone.json()["error"]["message"] == f"Session {uuid} not found"


def test_errors_are_openai_shaped_and_browsers_are_refused(proxy) -> None:
    server, backend = proxy
    with httpx.Client(base_url=server.url, timeout=30) as client:
        bad_parser = client.post("/sessions/create", json={"tool_parser": "granite"})
        assert (
            bad_parser.status_code == 400
            and "unknown tool-call parser 'granite'" in bad_parser.json()["error"]["message"]
        )
        pinned = client.post("/sessions/create", json={"base_url": "http://elsewhere/v1"})
        assert pinned.status_code == 404 and backend.base_url in pinned.json()["error"]["message"]
        uuid = client.post("/sessions/create", json={}).json()["uuid"]
        empty = client.post(f"/{uuid}/v1/chat/completions", json={"messages": []})
        assert empty.status_code == 400 and empty.json()["error"]["type"] == "invalid_request_error"
        assert client.get("/servers").json()["servers"][0]["base_url"] == backend.base_url
        assert client.get("/v1/models").json()["data"][0]["id"] == "policy"
        browser = client.post("/sessions/create", json={}, headers={"Sec-Fetch-Site": "cross-site"})
        assert browser.status_code == 403


def test_an_env_s_managed_server_through_the_proxy(proxy, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server, backend = proxy
    monkeypatch.setenv("ATROPOS_PROXY_URL", server.url)
    dead = "http://127.0.0.1:9/v1"  # the env's own server: only the proxy can answer
    args = ["process", str(DATA / "managed_tools_env.py"), "--openai.base_url", dead, "--openai.server_type", "vllm"]
    args += ["--env.tokenizer_name", str(TOKENIZER), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (tmp_path / "run" / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and all(sorted(g["scores"]) == [0.0, 1.0] for g in groups)
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/sessions").json()["sessions"] == []  # every rollout's session was ended


def test_python_env_py_proxy_url_flag(proxy, tmp_path: Path) -> None:
    server, backend = proxy
    env = tmp_path / "managed_tools_env.py"
    env.write_text((DATA / "managed_tools_env.py").read_text())
    subprocess.run(["sed", "-i", SED, str(env)], check=True)
    dead = "http://127.0.0.1:9/v1"  # the env's own server: only the proxy can answer
    args = [sys.executable, str(env), "process", "--proxy_url", server.url, "--openai.base_url", dead]
    args += ["--openai.server_type", "vllm", "--env.tokenizer_name", str(TOKENIZER), "--env.total_steps", "1"]
    done = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    group = json.loads((tmp_path / "data" / "managed_tools.jsonl").read_text().splitlines()[0])
    assert sorted(group["scores"]) == [0.0, 1.0]
    with httpx.Client(base_url=server.url) as client:
        assert client.get("/health").json()["sessions"] == 0


def test_setup_replaces_the_backends(proxy) -> None:
    server, backend = proxy
    with httpx.Client(base_url=server.url, timeout=30) as client:
        body = {
            "model_name": "renamed",
            "servers": [{"base_url": backend.base_url}, {"base_url": "http://127.0.0.1:9/v1"}],
        }
        assert client.post("/setup", json=body).json() == {"status": "ok", "servers": 2, "model_name": "renamed"}
        listed = client.get("/servers").json()["servers"]
        assert [s["base_url"] for s in listed] == [backend.base_url, "http://127.0.0.1:9/v1"]
        assert {s["server_type"] for s in listed} == {"vllm"}


def test_the_standalone_proxy_serves_and_a_bad_config_is_one_line(fake_server, tmp_path: Path) -> None:
    from atropos_cli.testing import free_port

    backend = fake_server("arithmetic", tokenizer=str(TOKENIZER))
    config = tmp_path / "servers.json"
    config.write_text(json.dumps({"model_name": str(TOKENIZER), "servers": [{"base_url": backend.base_url}]}))
    module = "atropos_cli.compat.atroposlib.envs.server_handling.managed_server_proxy"
    port = free_port()
    process = subprocess.Popen([sys.executable, "-m", module, "--config", str(config), "--port", str(port)])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                health = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).json()
                break
            except httpx.TransportError:
                assert process.poll() is None and time.monotonic() < deadline, "the proxy did not start"
                time.sleep(0.1)
        assert health["status"] == "ok" and health["servers"] == 1
    finally:
        process.terminate()
        process.wait(timeout=30)
    config.write_text("{not json")
    bad = subprocess.run([sys.executable, "-m", module, "--config", str(config)], capture_output=True, text=True)
    assert (
        bad.returncode != 0 and bad.stderr.startswith(f"error: cannot read {config}") and "Traceback" not in bad.stderr
    )
