"""The fake inference server over real HTTP: answers, token ids, injected faults, overlap of latency, its CLI."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys

import httpx

from atropos_cli.testing import free_port
from atropos_cli.testing.fake_server import token_logprob


def _chat(url: str, content: str, **body: object) -> httpx.Response:
    payload = {"model": "m", "messages": [{"role": "user", "content": content}], **body}
    return httpx.post(f"{url}/chat/completions", json=payload, timeout=10)


def test_chat_answers_arithmetic_with_vllm_style_tokens(fake_server):
    srv = fake_server(rule="arithmetic", accuracy=1.0)
    resp = _chat(srv.base_url, "What is 12 * 3?", n=2, logprobs=True, return_token_ids=True)
    assert resp.status_code == 200
    data = resp.json()
    assert [c["message"]["content"] for c in data["choices"]] == ["36", "36"]
    choice = data["choices"][0]
    assert choice["token_ids"] == [ord("3"), ord("6")]
    assert [e["logprob"] for e in choice["logprobs"]["content"]] == [token_logprob(51), token_logprob(54)]
    assert bytes(data["prompt_token_ids"]).decode().endswith("What is 12 * 3?\n<|assistant|>")
    assert data["usage"]["completion_tokens"] == 4


def test_tokens_only_when_asked(fake_server):
    srv = fake_server(rule="echo")
    data = _chat(srv.base_url, "hi").json()
    assert data["choices"][0]["message"]["content"] == "hi"
    assert "token_ids" not in data["choices"][0] and "prompt_token_ids" not in data
    assert data["choices"][0]["logprobs"] is None


def test_arithmetic_accuracy_and_wrong_answers_are_close(fake_server):
    srv = fake_server(rule="arithmetic", accuracy=0.5, seed=3)
    texts = [c["message"]["content"] for c in _chat(srv.base_url, "What is 40 - 50?", n=200).json()["choices"]]
    right = sum(t == "-10" for t in texts)
    assert 60 <= right <= 140
    assert all(1 <= abs(int(t) + 10) <= 3 for t in texts if t != "-10")
    never = fake_server(rule="arithmetic", accuracy=0.0)
    assert "-10" not in [
        c["message"]["content"] for c in _chat(never.base_url, "What is 40 - 50?", n=20).json()["choices"]
    ]


def test_scripted_and_callable_rules_max_tokens_and_stop(fake_server):
    script = fake_server(rule=["alpha", "beta"])
    texts = [c["message"]["content"] for c in _chat(script.base_url, "x", n=3).json()["choices"]]
    assert texts == ["alpha", "beta", "alpha"]
    fn = fake_server(rule=lambda prompt, index: f"{prompt}#{index} END more")
    choice = _chat(fn.base_url, "q", stop=[" END"]).json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("q#0", "stop")
    choice = _chat(fn.base_url, "q", max_tokens=3).json()["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"]) == ("q#1", "length")


def test_completions_take_text_or_token_ids(fake_server):
    srv = fake_server(rule="echo")
    body = {"model": "m", "prompt": list(b"abc"), "logprobs": 0, "return_token_ids": True}
    data = httpx.post(f"{srv.base_url}/completions", json=body).json()
    choice = data["choices"][0]
    assert choice["text"] == "abc"
    assert choice["prompt_token_ids"] == [97, 98, 99] and choice["token_ids"] == [97, 98, 99]
    assert choice["logprobs"]["token_logprobs"] == [token_logprob(t) for t in (97, 98, 99)]


def test_faults_errors_garbage_ignore_n_reject_logprobs(fake_server):
    err = fake_server(error_rate=1.0, error_status=429, retry_after=1.5)
    resp = _chat(err.base_url, "x")
    assert resp.status_code == 429 and resp.headers["retry-after"] == "1.5"
    assert "injected error" in resp.json()["error"]["message"]
    assert err.errors_sent == 1
    garbage = fake_server(garbage=True)
    resp = _chat(garbage.base_url, "x")
    assert resp.status_code == 200 and resp.text.startswith("<html>")
    one = fake_server(ignore_n=True)
    assert len(_chat(one.base_url, "x", n=5).json()["choices"]) == 1
    strict = fake_server(reject_logprobs=True)
    assert _chat(strict.base_url, "x", logprobs=True).status_code == 400
    assert _chat(strict.base_url, "x").status_code == 200


def test_endpoints_models_health_stats_and_bad_request(fake_server):
    srv = fake_server(model_name="tiny")
    root = srv.base_url.removesuffix("/v1")
    assert httpx.get(f"{srv.base_url}/models").json()["data"][0]["id"] == "tiny"
    assert httpx.get(f"{root}/health").status_code == 200
    missing = httpx.post(f"{srv.base_url}/chat/completions", json={"model": "m"})  # the shared schema: OpenAI's 400
    assert missing.status_code == 400 and missing.json()["error"]["param"] == "messages"
    _chat(srv.base_url, "x")
    stats = httpx.get(f"{root}/stats").json()
    assert stats["requests"] == 1 and stats["in_flight"] == 0 and stats["max_in_flight"] == 1


def test_latency_overlaps_across_64_concurrent_requests(fake_server):
    """Requests wait out their latency side by side: the server saw many in flight at once (counted by the server,
    not timed; the speed is benchmarks/check_budgets.py's). A 2 s latency leaves the client time to send them."""
    srv = fake_server(rule="echo", latency_s=2.0)

    async def go() -> None:
        limits = httpx.Limits(max_connections=100)
        async with httpx.AsyncClient(limits=limits, timeout=60) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            responses = await asyncio.gather(
                *(client.post(f"{srv.base_url}/chat/completions", json=body) for _ in range(64))
            )
            assert all(r.status_code == 200 for r in responses)

    asyncio.run(go())
    assert srv.max_in_flight >= 32 and srv.requests == 64


def test_cli_prints_url_serves_and_stops_on_sigterm():
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "atropos_cli.testing.fake_server", "--port", str(port), "--accuracy", "1.0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline().strip()
        assert line == f"http://127.0.0.1:{port}/v1"
        assert _chat(line, "What is 2 + 2?").json()["choices"][0]["message"]["content"] == "4"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
