"""OpenAICompatBackend against the real fake server: request bodies, parsing, fallbacks and error mapping."""

from __future__ import annotations

import asyncio
import gc

import pytest

from atropos_cli.config import ServerConfig
from atropos_cli.errors import BadResponseError, InferenceError
from atropos_cli.inference.base import SamplingParams
from atropos_cli.inference.openai_compat import OpenAICompatBackend, RetryableError
from atropos_cli.testing import free_port
from atropos_cli.testing.fake_server import encode, render_chat, token_logprob

QUESTION = [{"role": "user", "content": "What is 7 + 5?"}]


def _backend(url: str, server_type: str = "vllm", **kwargs: object) -> OpenAICompatBackend:
    return OpenAICompatBackend(ServerConfig(base_url=url, server_type=server_type, model_name="fake-model", **kwargs))


def _chat(backend: OpenAICompatBackend, messages=QUESTION, **params: object):
    async def go():
        try:
            return await backend.chat(messages, SamplingParams(**params))
        finally:
            await backend.aclose()

    return asyncio.run(go())


def _complete(backend: OpenAICompatBackend, prompt, **params: object):
    async def go():
        try:
            return await backend.complete(prompt, SamplingParams(**params))
        finally:
            await backend.aclose()

    return asyncio.run(go())


def test_vllm_chat_parses_token_ids_and_logprobs(fake_server):
    srv = fake_server(rule="arithmetic", accuracy=1.0)
    gen = _chat(_backend(srv.base_url), n=2, temperature=0.7, top_p=0.9, max_tokens=5, stop=["\n"], seed=3)
    assert [c.message.content for c in gen.choices] == ["12", "12"]
    assert gen.choices[0].token_ids == [ord("1"), ord("2")]
    assert gen.choices[0].logprobs == [token_logprob(ord("1")), token_logprob(ord("2"))]
    assert gen.prompt_token_ids == encode(render_chat(QUESTION))
    assert gen.has_tokens and gen.model == "fake-model" and gen.usage.completion_tokens == 4
    sent = srv.request_log[-1]
    assert sent["return_token_ids"] is True and sent["logprobs"] is True
    assert (sent["n"], sent["temperature"], sent["top_p"], sent["max_tokens"], sent["seed"]) == (2, 0.7, 0.9, 5, 3)
    assert sent["stop"] == ["\n"] and sent["model"] == "fake-model"


def test_vllm_completion_with_token_id_prompt(fake_server):
    srv = fake_server(rule="echo")
    gen = _complete(_backend(srv.base_url), list(b"hey"), max_tokens=2)
    choice = gen.choices[0]
    assert (choice.text, choice.finish_reason) == ("he", "length")
    assert gen.prompt_token_ids == list(b"hey")  # vLLM puts them per choice on /v1/completions
    assert choice.token_ids == list(b"he") and choice.logprobs == [token_logprob(t) for t in b"he"]
    assert srv.request_log[-1]["prompt"] == list(b"hey") and srv.request_log[-1]["logprobs"] == 0


def test_openai_server_gets_logprobs_but_no_token_id_request(fake_server):
    srv = fake_server(rule="echo")
    gen = _chat(_backend(srv.base_url, "openai"), messages=[{"role": "user", "content": "ab"}])
    assert gen.choices[0].text == "ab" and gen.choices[0].logprobs == [token_logprob(97), token_logprob(98)]
    assert gen.choices[0].token_ids is None and gen.prompt_token_ids is None and not gen.has_tokens
    assert "return_token_ids" not in srv.request_log[-1]
    gen = _chat(_backend(srv.base_url, "openai"), logprobs=False)
    assert gen.choices[0].logprobs is None and "logprobs" not in srv.request_log[-1]


def test_extra_body_reaches_the_server(fake_server):
    srv = fake_server(rule="echo")
    _chat(_backend(srv.base_url), extra_body={"top_k": 5})
    assert srv.request_log[-1]["top_k"] == 5 and srv.request_log[-1]["return_token_ids"] is True


def test_server_rejecting_logprobs_is_retried_without_them_and_remembered(fake_server):
    srv = fake_server(rule="echo", reject_logprobs=True)
    backend = _backend(srv.base_url)

    async def go():
        first = await backend.chat(QUESTION, SamplingParams())
        second = await backend.chat(QUESTION, SamplingParams())
        await backend.aclose()
        return first, second

    first, second = asyncio.run(go())
    assert first.choices[0].text == second.choices[0].text == "What is 7 + 5?"
    assert first.choices[0].logprobs is None and backend.extras_supported is False
    assert srv.requests == 3  # rejected + retried, then straight without logprobs
    assert "logprobs" not in srv.request_log[-1] and "return_token_ids" not in srv.request_log[-1]


def test_empty_completion_is_returned_not_an_error(fake_server):
    srv = fake_server(rule=[""])
    gen = _chat(_backend(srv.base_url))
    assert gen.choices[0].text == "" and gen.choices[0].message.content == ""
    assert gen.choices[0].token_ids == [] and gen.choices[0].logprobs == []


def test_garbage_answer_is_bad_response_naming_the_url(fake_server):
    srv = fake_server(garbage=True)
    with pytest.raises(BadResponseError, match="not JSON") as info:
        _chat(_backend(srv.base_url))
    assert repr(srv.base_url) in info.value.message


@pytest.mark.parametrize(("status", "retryable"), [(400, False), (404, False), (429, True), (500, True), (503, True)])
def test_http_errors_map_to_retryable_or_bad_response(fake_server, status, retryable):
    srv = fake_server(error_rate=1.0, error_status=status, retry_after=2 if status == 429 else None)
    expected = RetryableError if retryable else BadResponseError
    with pytest.raises(expected) as info:
        _chat(_backend(srv.base_url))
    assert f"HTTP {status}" in info.value.message and repr(srv.base_url) in info.value.message
    if status == 429:
        assert info.value.retry_after == 2.0
    if status == 404:
        assert "--openai.model_name" in info.value.hint


def test_unreachable_and_timeout_are_retryable(fake_server):
    url = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(RetryableError) as info:
        _chat(_backend(url))
    assert info.value.kind == "connection" and info.value.message == f"no inference server answered at {url!r}"
    slow = fake_server(latency_s=0.8)
    with pytest.raises(RetryableError) as info:
        _chat(_backend(slow.base_url, timeout=0.2))
    assert info.value.kind == "timeout"


def test_missing_base_url_is_an_error_with_a_hint():
    with pytest.raises(InferenceError, match="has no base_url") as info:
        OpenAICompatBackend(ServerConfig(server_type="vllm"))
    assert "--openai.base_url" in info.value.hint


def test_backend_survives_a_new_event_loop(fake_server):
    srv = fake_server(rule="echo")
    backend = _backend(srv.base_url)
    assert asyncio.run(backend.chat(QUESTION, SamplingParams())).choices[0].text == "What is 7 + 5?"
    assert asyncio.run(backend.chat(QUESTION, SamplingParams())).choices[0].text == "What is 7 + 5?"
    asyncio.run(backend.aclose())


@pytest.fixture
def canned_server():
    """Factory: a real HTTP server on 127.0.0.1 whose /v1/chat/completions answers `status`, `body`, `headers`."""
    from starlette.applications import Starlette
    from starlette.responses import Response
    from starlette.routing import Route

    from atropos_cli.testing.threaded import ThreadedServer

    started: list[ThreadedServer] = []

    def start(status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> str:
        def answer(request):
            return Response(body, status_code=status, headers=headers, media_type="application/json")

        routes = [Route("/v1/chat/completions", answer, methods=["POST"]), Route("/elsewhere", answer_ok)]
        server = ThreadedServer(Starlette(routes=routes), lifespan="off").start()
        started.append(server)
        return f"{server.url}/v1"

    yield start
    for server in started:
        server.stop()


_CHAT_OK = b'{"choices": [{"message": {"content": "12"}, "finish_reason": "stop", "logprobs": null}]}'


def answer_ok(request):
    from starlette.responses import Response

    return Response(_CHAT_OK, media_type="application/json")


def test_a_redirect_is_an_error_not_followed(canned_server):
    url = canned_server(307, b"", {"Location": "/elsewhere"})
    with pytest.raises(BadResponseError, match="HTTP 307"):
        _chat(_backend(url))


def test_python_json_extensions_in_an_answer_parse(canned_server):
    # Python servers (json.dumps) write a -inf logprob as -Infinity: valid for them, not for strict JSON parsers
    body = b'{"choices": [{"message": {"content": "1"}, "logprobs": {"content": [{"logprob": -Infinity}]}}]}'
    generation = _chat(_backend(canned_server(200, body)), logprobs=True)
    assert generation.choices[0].logprobs == [float("-inf")]


def test_http_proxy_from_the_environment_is_used_and_no_proxy_respected(fake_server, monkeypatch):
    srv = fake_server(rule="echo", allowed_hosts=["inference.invalid"])  # a proxy keeps the Host it was asked for
    url = "http://inference.invalid:8000/v1"  # no such host: only the proxy can answer
    for name in ("NO_PROXY", "no_proxy", "http_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://{srv.host}:{srv.port}")
    assert _chat(_backend(url)).choices[0].text == "What is 7 + 5?"
    monkeypatch.setenv("NO_PROXY", "inference.invalid")
    with pytest.raises(RetryableError) as info:
        _chat(_backend(url))
    assert info.value.kind == "connection"


def test_a_backend_dropped_unclosed_logs_nothing(fake_server, caplog):
    backend = _backend(fake_server(rule="echo").base_url)
    assert asyncio.run(backend.chat(QUESTION, SamplingParams())).choices  # its loop has ended, session still open
    del backend
    gc.collect()
    assert not [r for r in caplog.records if "nclosed" in r.getMessage()]
