"""The recording proxy over real HTTP: a tool-calling agent program (tests/harness/agent.py, the `openai` client
in a subprocess) drives a session; the rows hold exactly the token ids the backend sampled, each prompt extends
the one before, a harness that rewrites its history is reported as drift, and errors keep OpenAI's shape.

The backend is the fake inference server answering in the shipped model's tokenizer ids (as vLLM does), with
a rule that calls the `add` tool first and answers once the tool's result is in the chat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from atropos_cli.adapters.harness.proxy import Proxy, create_proxy_app
from atropos_cli.adapters.harness.settings import ProxySettings
from atropos_cli.cli.app import app
from atropos_cli.compat.tool_parsers import get_parser
from atropos_cli.config import ServerConfig
from atropos_cli.inference.router import ServerManager
from atropos_cli.inference.tokenizer import load_tokenizer
from atropos_cli.resources import resolve_model_path
from atropos_cli.testing.fake_server import token_logprob
from atropos_cli.testing.threaded import ThreadedServer

TOKENIZER = str(resolve_model_path("atropos-tiny-arith"))
AGENT = Path(__file__).parent / "harness" / "agent.py"
KEY = "proxy-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CALL = get_parser("hermes").render(None, [{"name": "add", "arguments": {"a": 2, "b": 3}}])


def tool_rule(prompt: str, k: int) -> str:
    return "The answer is 5" if prompt.endswith("<|tool|>5<|end|><|assistant|>") else CALL


@pytest.fixture
def proxy(fake_server) -> Iterator[tuple[ThreadedServer, Any, Any]]:
    def start(rule: Any = tool_rule, **settings: Any) -> tuple[str, Any]:
        backend = fake_server(rule, tokenizer=TOKENIZER, tokenizer_ids=True)
        router = ServerManager([ServerConfig(base_url=backend.base_url, server_type="vllm", model_name="policy")])
        app = create_proxy_app(Proxy(router, load_tokenizer(TOKENIZER), ProxySettings(max_tokens=128, **settings)), KEY)
        server = ThreadedServer(app).start()
        started.append(server)
        return server.url, backend

    started: list[ThreadedServer] = []
    yield start  # type: ignore[misc]
    for server in started:
        server.stop()


def run_agent(url: str, *args: str, task: dict[str, Any] | None = None, cwd: Path) -> tuple[str, dict[str, Any]]:
    """Open a session, run the agent against it to its end, close the session: (its session id, the report)."""
    opened = httpx.post(f"{url}/sessions", headers=AUTH).json()
    assert opened["base_url"] == f"{url}/s/{opened['id']}/v1"
    env = {
        **os.environ, "OPENAI_BASE_URL": opened["base_url"], "OPENAI_API_KEY": KEY,
        "ATROPOS_TASK": json.dumps(task or {"question": "What is 2 plus 3?"}),
    }  # fmt: skip
    done = subprocess.run([sys.executable, str(AGENT), *args], env=env, cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    report = httpx.delete(f"{url}/sessions/{opened['id']}", headers=AUTH).json()
    return opened["id"], report


@pytest.mark.parametrize("stream", [False, True], ids=["json", "stream"])
def test_a_tool_calling_agent_is_recorded_token_for_token(proxy, tmp_path: Path, stream: bool) -> None:
    url, backend = proxy()
    _, report = run_agent(url, "--turns", "3", *(["--stream"] if stream else []), cwd=tmp_path)
    assert report["calls"] == 3 and report["drift"] == []
    [row] = report["rows"]
    # the agent ran the tool the model called and sent its result back under the call's id
    roles = [m["role"] for m in row["messages"]]
    assert roles == ["user", "assistant", "tool", "assistant", "user", "assistant"]
    assert row["messages"][1]["tool_calls"][0]["function"] == {"name": "add", "arguments": '{"a": 2, "b": 3}'}
    assert row["messages"][2] == {"role": "tool", "content": "5", "tool_call_id": "call_0"}
    assert row["messages"][3]["content"] == "The answer is 5" and (tmp_path / "answer.txt").exists()
    # every prompt the backend got extends the previous prompt and its sampled completion, token for token
    prompts = [body["prompt"] for body in backend.request_log]
    tokenizer = load_tokenizer(TOKENIZER)
    answers = [CALL, "The answer is 5", CALL]
    sampled = [tokenizer.encode(a, add_special_tokens=False) + [tokenizer.eos_token_id] for a in answers]
    for before, completion, after in zip(prompts, sampled, prompts[1:], strict=False):
        assert after[: len(before) + len(completion)] == before + completion
    # the trained tokens are exactly the sampled ones, with the backend's logprobs; the rest is masked
    assert row["tokens"] == prompts[-1] + sampled[-1] and row["exact"]
    trained = [(t, lp) for t, m, lp in zip(row["tokens"], row["masks"], row["logprobs"], strict=True) if m != -100]
    assert [t for t, _ in trained] == [t for ids in sampled for t in ids]
    assert [lp for _, lp in trained] == [token_logprob(t) for ids in sampled for t in ids]
    assert all(lp == 1.0 for m, lp in zip(row["masks"], row["logprobs"], strict=True) if m == -100)


def test_a_rewritten_history_starts_a_new_row_and_is_reported(proxy, tmp_path: Path) -> None:
    url, _ = proxy(rule=lambda prompt, k: "7")
    _, report = run_agent(url, "--turns", "2", "--rewrite", cwd=tmp_path)
    assert report["calls"] == 2 and len(report["rows"]) == 2
    [drift] = report["drift"]
    assert drift["call"] == 2 and drift["kind"] == "history_rewritten"
    assert drift["detail"].startswith("message 2 (assistant) differs from the session's copy")
    first, second = report["rows"]
    assert first["messages"][-1] == {"role": "assistant", "content": "7"}
    assert second["messages"][1]["content"] == "7 (edited)"  # the new segment is the harness's own history
    assert all(row["exact"] and row["calls"] == 1 for row in report["rows"])


def test_errors_limits_and_a_failed_call_that_the_harness_retries(proxy, fake_server) -> None:
    url, backend = proxy(max_calls=2)
    with httpx.Client(base_url=url, timeout=30) as client:
        assert client.post("/sessions").status_code == 401  # the key is required
        session = client.post("/sessions", headers=AUTH).json()["id"]
        base = f"/s/{session}/v1/chat/completions"
        chat = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]}
        two = client.post(base, json={**chat, "n": 2}, headers=AUTH)
        assert two.status_code == 400 and two.json()["error"]["param"] == "n"
        unknown = client.post("/s/nope/v1/chat/completions", json=chat, headers=AUTH)
        assert unknown.status_code == 404 and "no session 'nope'" in unknown.json()["error"]["message"]
        browser = client.post(base, json=chat, headers={**AUTH, "Origin": "http://evil.example"})
        assert browser.status_code == 403
        backend.error_rate, backend.error_status = 1.0, 400  # the backend refuses: the call is not recorded
        refused = client.post(base, json=chat, headers=AUTH)
        assert (
            refused.status_code == 400 and "the policy backend refused the call" in refused.json()["error"]["message"]
        )
        assert client.get(f"/sessions/{session}", headers=AUTH).json()["calls"] == 0
        backend.error_rate = 0.0  # the harness sends the same call again: one clean segment, no drift
        assert client.post(base, json=chat, headers=AUTH).status_code == 200
        reply = client.post(base, json=chat, headers=AUTH)  # the same chat again: a new segment (drift)
        assert reply.status_code == 200
        over = client.post(base, json=chat, headers=AUTH)
        assert over.status_code == 429 and "--max-calls" in over.json()["error"]["message"]
        report = client.get(f"/sessions/{session}", headers=AUTH).json()
        assert report["calls"] == 2 and [d["kind"] for d in report["drift"]] == ["history_rewritten"]
        assert "no more than the 2 already answered" in report["drift"][0]["detail"]


def test_a_backend_without_token_ids_is_reported_as_retokenized(fake_server) -> None:
    backend = fake_server(tool_rule, tokenizer=TOKENIZER, tokenizer_ids=True)
    router = ServerManager([ServerConfig(base_url=backend.base_url, server_type="openai", model_name="policy")])
    app = create_proxy_app(Proxy(router, load_tokenizer(TOKENIZER), ProxySettings(max_tokens=128)))
    with ThreadedServer(app) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        session = client.post("/sessions").json()["id"]
        chat = {"messages": [{"role": "user", "content": "What is 2 plus 3?"}]}
        assert client.post(f"/s/{session}/v1/chat/completions", json=chat).status_code == 200
        report = client.delete(f"/sessions/{session}").json()
    assert [(d["call"], d["kind"]) for d in report["drift"]] == [(1, "retokenized")]
    assert report["rows"][0]["exact"] is False


def test_the_proxy_command_serves_sessions_on_the_shipped_model(tmp_path: Path) -> None:
    cmd = [sys.executable, "-c", "from atropos_cli.cli.app import main; main()", "proxy", "--port", "0"]
    env = {**os.environ, "COLUMNS": "400"}
    proc = subprocess.Popen(
        [*cmd, "--max-tokens", "4"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    killer = threading.Timer(120, proc.kill)  # a proxy that never says it serves cannot hang the test
    killer.start()
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert "recording proxy for 'atropos-tiny-arith' on http://127.0.0.1:" in line, proc.stderr.read()
        url = line.split(" on ")[1].split()[0]
        with httpx.Client(timeout=60) as client:
            opened = client.post(f"{url}/sessions").json()
            chat = {"messages": [{"role": "user", "content": "What is 2 + 3?"}]}
            reply = client.post(f"{opened['base_url']}/chat/completions", json=chat).json()
            assert reply["choices"][0]["message"]["role"] == "assistant" and reply["usage"]["completion_tokens"] >= 1
            [row] = client.delete(f"{url}/sessions/{opened['id']}").json()["rows"]
        trained = [t for t, m in zip(row["tokens"], row["masks"], strict=True) if m != -100]
        assert len(trained) == reply["usage"]["completion_tokens"] and row["exact"]
    finally:
        killer.cancel()
        proc.terminate()
        proc.wait(timeout=30)
    bad = CliRunner().invoke(app, ["proxy", "--port", "0", "--env.group_size", "2"])
    assert bad.exit_code == 2 and "atropos proxy takes no --env.* flags" in bad.output
