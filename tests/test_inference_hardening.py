"""`atropos inference` and the fake server (one app) against hostile or broken requests (issue 15): browser
cross-site requests, oversized bodies and prompts, floods, missing keys, one bad request in a batch."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from atropos_cli.config import ServerConfig
from atropos_cli.inference.local import LocalBackend
from atropos_cli.inference.server import ServerSettings, create_app
from atropos_cli.resources import DEFAULT_MODEL
from atropos_cli.testing.threaded import ThreadedServer

CHAT = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 3?"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def local():
    backend = LocalBackend(ServerConfig(server_type="local", model_name=DEFAULT_MODEL))
    with ThreadedServer(create_app(backend, ServerSettings(max_body_mb=1)), lifespan="off") as server:
        yield server.url


def _root(srv) -> str:
    return srv.base_url.removesuffix("/v1")


@pytest.mark.parametrize("which", ["local", "fake"])
def test_cross_site_and_non_json_requests_are_refused(which, local, fake_server):
    url = local if which == "local" else _root(fake_server())
    body = json.dumps(CHAT).encode()
    plain = httpx.post(f"{url}/v1/chat/completions", content=body, headers={"Content-Type": "text/plain"})
    assert plain.status_code == 415 and "application/json" in plain.json()["error"]["message"]
    reload = httpx.post(f"{url}/reload_weights", content=b'{"path": "/x"}', headers={"Content-Type": "text/plain"})
    assert reload.status_code == 415
    assert httpx.get(f"{url}/reload_weights").status_code == 405
    for headers in ({"Sec-Fetch-Site": "cross-site"}, {"Origin": "https://evil.example"}):
        resp = httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=headers)
        assert resp.status_code == 403 and "refused" in resp.json()["error"]["message"]
    local_page = {"Origin": "http://localhost:3000", "Sec-Fetch-Site": "same-origin"}
    assert httpx.post(f"{url}/v1/chat/completions", json=CHAT, headers=local_page).status_code == 200


def test_body_over_the_limit_is_413_and_a_huge_prompt_is_refused_before_tokenizing(local, monkeypatch):
    reached: list[str] = []  # the backend's entry points, the only places a prompt is tokenized
    chat, complete = LocalBackend.chat, LocalBackend.complete

    async def chat_spy(self, *args, **kwargs):
        reached.append("chat")
        return await chat(self, *args, **kwargs)

    async def complete_spy(self, *args, **kwargs):
        reached.append("complete")
        return await complete(self, *args, **kwargs)

    monkeypatch.setattr(LocalBackend, "chat", chat_spy)
    monkeypatch.setattr(LocalBackend, "complete", complete_spy)
    big = {**CHAT, "messages": [{"role": "user", "content": "x" * (2 * 1024 * 1024)}]}
    assert httpx.post(f"{local}/v1/chat/completions", json=big, timeout=30).status_code == 413
    long = {**CHAT, "messages": [{"role": "user", "content": "ab " * 200_000}]}  # 600 kB, under the body limit
    resp = httpx.post(f"{local}/v1/chat/completions", json=long, timeout=60)
    assert resp.status_code == 400 and "characters" in resp.json()["error"]["message"]
    assert resp.json()["error"]["param"] == "messages"
    prompt = httpx.post(f"{local}/v1/completions", json={"prompt": "ab " * 200_000}, timeout=60)
    assert prompt.status_code == 400 and prompt.json()["error"]["param"] == "prompt"
    assert reached == [], "a prompt past the limit reached the backend (and its tokenizer)"
    # the spies see what does reach the backend: a prompt that fits
    assert httpx.post(f"{local}/v1/chat/completions", json=CHAT, timeout=60).status_code == 200
    assert reached == ["chat"]


def test_past_max_pending_requests_get_503_and_health_stays_fast():
    from atropos_cli.testing.fake_server import FakeInferenceServer

    srv = FakeInferenceServer(rule="echo", latency_s=1.0)
    with ThreadedServer(create_app(srv, ServerSettings(max_pending=1)), lifespan="off") as server:
        first: list[httpx.Response] = []
        thread = threading.Thread(target=lambda: first.append(httpx.post(f"{server.url}/v1/chat/completions",
                                                                         json=CHAT, timeout=10)))  # fmt: skip
        thread.start()
        deadline = time.monotonic() + 10
        while srv.in_flight == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        busy = httpx.post(f"{server.url}/v1/chat/completions", json=CHAT)
        assert busy.status_code == 503 and busy.headers["retry-after"] == "1"
        assert httpx.get(f"{server.url}/health", timeout=0.5).json()["status"] == "ok"
        thread.join()
        assert first[0].status_code == 200


def test_api_key_is_required_when_set(fake_server):
    srv = fake_server(rule="echo", api_key="k3y")
    url = srv.base_url
    assert httpx.post(f"{url}/chat/completions", json=CHAT).status_code == 401
    assert httpx.get(f"{_root(srv)}/health").status_code == 401
    ok = httpx.post(f"{url}/chat/completions", json=CHAT, headers={"Authorization": "Bearer k3y"})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"] == "What"  # max_tokens 4


def test_one_bad_seed_fails_only_its_own_request(local):
    async def go() -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=60) as client:
            bodies = [{**CHAT, "seed": i} for i in range(15)] + [{**CHAT, "seed": 2**64}]
            return await asyncio.gather(*(client.post(f"{local}/v1/chat/completions", json=b) for b in bodies))

    responses = asyncio.run(go())
    assert [r.status_code for r in responses] == [200] * 15 + [400]
    assert responses[-1].json()["error"]["param"] == "seed"


def test_non_string_content_is_400(local):
    resp = httpx.post(f"{local}/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": 5}]})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "messages"
    no_role = httpx.post(f"{local}/v1/chat/completions", json={**CHAT, "messages": [{"content": "hi"}]})
    assert no_role.status_code == 400


def test_an_image_to_the_text_model_is_a_400_never_dropped(local, fake_server):
    """Image parts (vision envs send them): the local text model refuses them as vLLM does; the fake server,
    which answers from the text, takes them."""
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    parts = [{"type": "text", "text": "How many?"}, image]
    resp = httpx.post(f"{local}/v1/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": parts}]})
    assert resp.status_code == 400 and "1 image part" in resp.json()["error"]["message"]
    fake = fake_server(rule="echo").base_url
    ok = httpx.post(f"{fake}/chat/completions", json={**CHAT, "messages": [{"role": "user", "content": parts}]})
    assert ok.status_code == 200 and ok.json()["choices"][0]["message"]["content"].startswith("How")


def test_a_checkpoint_that_does_not_load_is_a_400_naming_it(local, tmp_path):
    (tmp_path / "config.json").write_text("{}")  # looks like a checkpoint, is not one
    resp = httpx.post(f"{local}/reload_weights", json={"path": str(tmp_path)}, timeout=60)
    assert resp.status_code == 400 and str(tmp_path) in resp.json()["error"]["message"]
    assert httpx.get(f"{local}/health").json()["version"] == 0
