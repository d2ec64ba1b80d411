"""One request never fails a batch (issue 21): every sampling value the schema admits but fp32 sampling cannot do
(temperature 1e-300, top_p 1e-300, ...) sent beside 15 innocent requests to `atropos inference` (the shipped
model on CPU, the batching engine); any job that raises fails its own caller only; prompts x n is capped per
request and counted in the pending limit."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from atropos_cli.config import ServerConfig
from atropos_cli.inference.batching import RequestBatcher
from atropos_cli.inference.local import LocalBackend
from atropos_cli.inference.server import ServerSettings, create_app
from atropos_cli.resources import DEFAULT_MODEL
from atropos_cli.testing.fake_server import FakeInferenceServer
from atropos_cli.testing.threaded import ThreadedServer

# Values the request schema admits (temperature >= 0, 0 < top_p <= 1) that overflow or underflow fp32 sampling.
HOSTILE = [
    {"temperature": 1e-300},
    {"temperature": 1e-40},
    {"temperature": 1e-38},
    {"temperature": 5e-324},
    {"temperature": 1e-7},
    {"top_p": 1e-300},
    {"top_p": 1e-40},
    {"top_p": 5e-324},
    {"temperature": 10.0, "top_p": 1e-300},
    {"temperature": 1e-300, "top_p": 1e-300},
]


def _chat(question: str, seed: int, **sampling: float) -> dict[str, object]:
    return {
        "model": "m", "messages": [{"role": "user", "content": question}], "max_tokens": 6, "seed": seed, "n": 2,
        **sampling,
    }  # fmt: skip


async def _burst(url: str, bodies: list[dict[str, object]]) -> list[httpx.Response]:
    async with httpx.AsyncClient(timeout=120) as client:
        return await asyncio.gather(*(client.post(f"{url}/v1/chat/completions", json=b) for b in bodies))


@pytest.fixture(scope="module")
def local():
    backend = LocalBackend(ServerConfig(server_type="local", model_name=DEFAULT_MODEL), max_wait_s=0.05)
    with ThreadedServer(create_app(backend, ServerSettings()), lifespan="off") as server:
        yield server.url, backend


def test_values_the_sampler_cannot_do_fail_no_innocent_request(local):
    url, backend = local
    innocent = [_chat(f"What is {i} + 3?", seed=i) for i in range(15)]
    for hostile in HOSTILE:
        before = backend.batcher.batches_run
        answers = asyncio.run(_burst(url, [*innocent, _chat("What is 7 * 8?", seed=99, **hostile)]))
        assert [a.status_code for a in answers[:15]] == [200] * 15, (hostile, [a.text[:200] for a in answers])
        # below the floor a temperature means greedy and a top-p keeps the top token: an answer, not an error
        assert answers[15].status_code == 200, (hostile, answers[15].text)
        assert backend.batcher.batches_run - before < 16, "the requests were never batched together"
    greedy = asyncio.run(_burst(url, [_chat("What is 7 * 8?", seed=1, temperature=0.0)]))[0].json()
    tiny = asyncio.run(_burst(url, [_chat("What is 7 * 8?", seed=2, temperature=1e-300)]))[0].json()
    assert [c["message"] for c in tiny["choices"]] == [c["message"] for c in greedy["choices"]]


def test_a_job_that_raises_fails_only_its_caller():
    def run(jobs: list[str]) -> list[str]:
        if "poison" in jobs:
            raise RuntimeError("probability tensor contains inf")
        return [job.upper() for job in jobs]

    async def main() -> tuple[list[object], RequestBatcher[str, str]]:
        batcher: RequestBatcher[str, str] = RequestBatcher(run, size=lambda _: 1, max_wait_s=0.05)
        jobs = [f"job{i}" for i in range(15)] + ["poison"]
        try:
            return await asyncio.gather(*(batcher.submit(j) for j in jobs), return_exceptions=True), batcher
        finally:
            await batcher.aclose()

    results, batcher = asyncio.run(main())
    assert results[:15] == [f"JOB{i}" for i in range(15)]
    assert isinstance(results[15], RuntimeError)
    assert batcher.batches_split >= 1


def test_prompts_times_n_is_capped_and_counted_in_the_pending_limit():
    fake = FakeInferenceServer(latency_s=2.0)  # the first request holds its 16 sequences for 2 s
    app = create_app(fake, ServerSettings(max_choices=16, max_pending=20))
    with ThreadedServer(app, lifespan="off") as server:
        # the amplification request: 80 prompts x n 512 in a few hundred bytes
        amplified = httpx.post(
            f"{server.url}/v1/completions", json={"prompt": ["What is 1 + 1?"] * 80, "n": 512, "max_tokens": 512}
        )
        assert amplified.status_code == 400, amplified.text
        assert "40960 sequences" in amplified.json()["error"]["message"] and amplified.json()["error"]["param"] == "n"
        assert httpx.post(f"{server.url}/v1/completions", json={"prompt": ["a"] * 4, "n": 5}).status_code == 400

        async def crowd() -> list[httpx.Response]:
            async with httpx.AsyncClient(timeout=60) as client:
                first = asyncio.ensure_future(
                    client.post(f"{server.url}/v1/completions", json={"prompt": ["a"] * 4, "n": 4})
                )
                while fake.in_flight == 0:  # the 16 sequences are held
                    await asyncio.sleep(0.01)
                second = await client.post(f"{server.url}/v1/chat/completions", json=_chat("hi", 1) | {"n": 8})
                return [await first, second]

        held, refused = asyncio.run(crowd())
        assert held.status_code == 200 and len(held.json()["choices"]) == 16
        assert refused.status_code == 503 and refused.headers["Retry-After"] == "1", refused.text
        assert "sequences in flight" in refused.json()["error"]["message"]
        assert httpx.post(f"{server.url}/v1/chat/completions", json=_chat("hi", 1)).status_code == 200
