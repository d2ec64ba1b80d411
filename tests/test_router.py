"""ServerManager over real fake servers: routing, slot bounds, retries, n splitting/fallback, kwargs, errors."""

from __future__ import annotations

import asyncio

import pytest

from atropos_cli.config import ServerConfig
from atropos_cli.errors import BadResponseError, InferenceError, ServerUnreachableError
from atropos_cli.inference.factory import make_backend
from atropos_cli.inference.openai_compat import OpenAICompatBackend
from atropos_cli.inference.router import ServerManager
from atropos_cli.retry import Backoff
from atropos_cli.testing import free_port

QUESTION = [{"role": "user", "content": "What is 7 + 5?"}]


def _manager(*urls: str, server_type: str = "vllm", **config: object) -> ServerManager:
    configs = [ServerConfig(base_url=u, server_type=server_type, model_name="fake-model", **config) for u in urls]
    return ServerManager(configs, backoff_base_s=0.005, backoff_max_s=0.05)


def _run(manager: ServerManager, *calls):
    """Run `calls` (functions of the manager returning coroutines) concurrently, then close the manager."""

    async def go():
        try:
            return await asyncio.gather(*(call(manager) for call in calls))
        finally:
            await manager.aclose()

    return asyncio.run(go())


def _chats(count: int, **kwargs: object):
    return [lambda m: m.chat_completion(messages=QUESTION, **kwargs) for _ in range(count)]


def test_requests_spread_over_servers_and_favour_the_least_loaded(fake_server):
    a, b = fake_server(rule="echo", latency_s=0.05), fake_server(rule="echo", latency_s=0.05)
    _run(_manager(a.base_url, b.base_url), *_chats(40))
    assert a.requests + b.requests == 40 and min(a.requests, b.requests) >= 15
    # A slow server holds its slots longer, so the fast one has more free slots and gets more requests.
    slow, fast = fake_server(rule="echo", latency_s=0.3), fake_server(rule="echo", latency_s=0.02)
    _run(_manager(slow.base_url, fast.base_url, num_max_requests_at_once=4), *_chats(48))
    assert fast.requests > 2 * slow.requests


def test_in_flight_requests_stay_within_the_slot_bounds(fake_server):
    srv = fake_server(rule="echo", latency_s=0.05)
    manager = _manager(srv.base_url, num_max_requests_at_once=4, num_requests_for_eval=2)
    gens = _run(manager, *_chats(32))
    assert len(gens) == 32 and srv.max_in_flight == 4
    srv.reset_stats()
    _run(manager, *_chats(12, split="eval"))
    assert srv.requests == 12 and srv.max_in_flight == 2
    assert manager.stats()["in_flight"] == 0


def test_retries_recover_from_a_30_percent_error_rate(fake_server):
    srv = fake_server(rule="echo", error_rate=0.3, error_status=503, seed=1)
    manager = _manager(srv.base_url, max_retries=8)
    gens = _run(manager, *_chats(30))
    assert [g.choices[0].text for g in gens] == ["What is 7 + 5?"] * 30
    stats = manager.stats()
    assert srv.errors_sent > 0 and stats["retries"] == srv.errors_sent == stats["failures"]
    assert stats["requests"] == 30 + srv.errors_sent and stats["servers"][0]["mean_latency_s"] > 0


def test_unreachable_server_fails_fast_with_a_hint():
    url = f"http://127.0.0.1:{free_port()}/v1"
    manager = _manager(url, max_retries=3)
    with pytest.raises(ServerUnreachableError) as info:
        _run(manager, *_chats(1))
    stats = manager.stats()  # counted, not timed: it tried 1 + max_retries times, then gave up
    assert stats["requests"] == 4 and stats["retries"] == 3, stats
    assert info.value.message == f"no inference server answered at {url!r}"
    assert "atropos inference" in info.value.hint and "--openai.base_url" in info.value.hint


def test_a_retry_goes_to_the_server_that_answers(fake_server):
    dead = f"http://127.0.0.1:{free_port()}/v1"
    alive = fake_server(rule="echo")
    manager = _manager(dead, alive.base_url, max_retries=2)
    gens = _run(manager, *_chats(6))
    assert len(gens) == 6 and alive.requests == 6
    assert manager.stats()["servers"][0]["failures"] >= 1


def test_garbage_and_400_are_not_retried(fake_server):
    garbage = fake_server(garbage=True)
    with pytest.raises(BadResponseError, match="not JSON"):
        _run(_manager(garbage.base_url), *_chats(1))
    assert garbage.requests == 1
    bad = fake_server(error_rate=1.0, error_status=400)
    with pytest.raises(BadResponseError) as info:
        _run(_manager(bad.base_url), *_chats(1))
    assert bad.requests == 1 and "HTTP 400" in info.value.message and repr(bad.base_url) in info.value.message


def test_persistent_5xx_gives_up_after_max_retries(fake_server):
    srv = fake_server(error_rate=1.0, error_status=503)
    with pytest.raises(InferenceError, match=r"HTTP 503.*gave up after 3 attempts"):
        _run(_manager(srv.base_url, max_retries=2), *_chats(1))
    assert srv.requests == 3


class _RecordingBackoff:
    """The router's own Backoff, recording each (server's Retry-After, chosen delay) it is asked for."""

    def __init__(self, backoff: Backoff) -> None:
        self.backoff = backoff
        self.calls: list[tuple[float | None, float]] = []

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        chosen = self.backoff.delay(attempt, retry_after)
        self.calls.append((retry_after, chosen))
        return chosen


def test_retry_after_is_respected(fake_server):
    """The server's Retry-After (0.2 s), not the manager's 5-50 ms backoff, sets every cool-down: checked on the
    delays the router chose and the cool-down it set, not on a clock."""
    srv = fake_server(error_rate=1.0, error_status=429, retry_after=0.2)
    manager = _manager(srv.base_url, max_retries=2)
    manager.backoff = recording = _RecordingBackoff(manager.backoff)
    with pytest.raises(InferenceError, match="HTTP 429"):
        _run(manager, *_chats(1))
    assert srv.requests == 3 and len(recording.calls) == 3
    assert all(after == 0.2 and 0.2 <= chosen <= 0.22 for after, chosen in recording.calls), recording.calls


def test_ignored_n_is_fanned_out_and_remembered(fake_server):
    srv = fake_server(rule=["a", "b", "c", "d", "e", "f", "g", "h"], ignore_n=True)
    manager = _manager(srv.base_url, server_type="openai")

    async def go():
        first = await manager.chat_completion(messages=QUESTION, n=4, seed=10)
        after_first = srv.requests
        second = await manager.chat_completion(messages=QUESTION, n=4)
        await manager.aclose()
        return first, after_first, second

    first, after_first, second = asyncio.run(go())
    assert [c.index for c in first.choices] == [0, 1, 2, 3] and len(second.choices) == 4
    assert after_first == 4 and srv.requests == 8  # remembered: no wasted n=4 request the second time
    assert sorted(c.text for c in first.choices + second.choices) == list("abcdefgh")
    assert [r["n"] for r in srv.request_log[-4:]] == [1, 1, 1, 1]
    assert sorted(r["seed"] for r in srv.request_log[:4]) == [10, 11, 12, 13]
    assert manager.stats()["servers"][0]["n_kwarg_is_ignored"] is True


def test_n_above_8_is_split_into_parallel_sub_requests(fake_server):
    srv = fake_server(rule="arithmetic", accuracy=1.0)
    (gen,) = _run(_manager(srv.base_url), lambda m: m.completion("What is 2 * 21?", n=19, seed=5))
    assert len(gen.choices) == 19 and [c.index for c in gen.choices] == list(range(19))
    assert {c.text for c in gen.choices} == {"42"} and gen.has_tokens
    assert sorted((r["n"], r["seed"]) for r in srv.request_log) == [(3, 7), (8, 5), (8, 6)]
    assert gen.usage.completion_tokens == 38


def test_env_style_kwargs(fake_server):
    srv = fake_server(rule="echo")
    manager = _manager(srv.base_url)
    (gen,) = _run(
        manager,
        lambda m: m.chat_completion(
            messages=QUESTION, model="ignored", top_k=20, extra_body={"min_p": 0.1}, stop="\n", max_tokens=4
        ),
    )
    assert gen.choices[0].text == "What" and gen.choices[0].finish_reason == "length"
    sent = srv.request_log[-1]
    assert sent["top_k"] == 20 and sent["min_p"] == 0.1 and sent["stop"] == ["\n"] and sent["model"] == "fake-model"
    with pytest.raises(InferenceError, match="unexpected keyword argument 'tempreature'"):
        _run(_manager(srv.base_url), lambda m: m.chat_completion(messages=QUESTION, tempreature=0.5))
    (gen,) = _run(_manager(srv.base_url), lambda m: m.chat_completion(messages=QUESTION, timeout=60, max_tokens=4))
    assert gen.choices[0].text == "What"  # timeout= (the OpenAI client's per-call seconds) is taken
    _run(_manager(srv.base_url), lambda m: m.chat_completion(messages=QUESTION, stop=["\n", 2], max_tokens=4))
    assert srv.request_log[-1]["stop"] == ["\n", 2]  # a stop token id goes out as the env gave it (as to vLLM)
    with pytest.raises(InferenceError, match="split='test'"):
        _run(_manager(srv.base_url), lambda m: m.chat_completion(messages=QUESTION, split="test"))
    with pytest.raises(InferenceError, match="n=0"):
        _run(_manager(srv.base_url), lambda m: m.chat_completion(messages=QUESTION, n=0))


def test_empty_completion_passes_through_the_router(fake_server):
    srv = fake_server(rule=[""])
    (gen,) = _run(_manager(srv.base_url), *_chats(1, n=2))
    assert [c.text for c in gen.choices] == ["", ""]


def test_manager_properties_and_backend_factory(fake_server):
    srv = fake_server()
    manager = _manager(srv.base_url, tokenizer_name="none")
    assert manager.model_name == "fake-model" and manager.tokenizer_name is None and manager.tokenizer is None
    named = ServerManager([ServerConfig(base_url=srv.base_url, tokenizer_name="gpt2")])
    assert named.tokenizer_name == "gpt2"
    for server_type in ("openai", "vllm", "sglang", "trl"):
        backend = make_backend(ServerConfig(base_url=srv.base_url, server_type=server_type))
        assert isinstance(backend, OpenAICompatBackend)
    with pytest.raises(InferenceError, match="no inference server configured"):
        ServerManager([])


def test_timeouts_are_retried_then_reported_with_a_hint(fake_server):
    srv = fake_server(rule="echo", latency_s=0.6)
    with pytest.raises(InferenceError, match=r"did not answer within 0.1s \(2 attempts\)") as info:
        _run(_manager(srv.base_url, timeout=0.1, max_retries=1), *_chats(1))
    assert "--openai.timeout" in info.value.hint and srv.requests == 2


def test_a_calls_own_timeout_bounds_it(fake_server):
    """`timeout=` (seconds, as Atropos envs pass it to the OpenAI client) ends a call the server sits on."""
    srv = fake_server(rule="echo", latency_s=30)
    with pytest.raises(InferenceError, match=r"did not finish within its timeout=0.2s"):
        _run(_manager(srv.base_url), lambda m: m.completion("Hi", timeout=0.2))
