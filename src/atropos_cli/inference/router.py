"""`ServerManager`: the one object env code calls (`self.server.chat_completion(...)`), over one or more backends.

It sits between environments and backends and owns everything about *getting* an answer:

- routing: each request goes to the healthy server with the most free slots; slots are per server and per
  split (`num_max_requests_at_once` for "train", `num_requests_for_eval` for "eval"), so in-flight requests
  are bounded; when every server is full, callers wait for a slot;
- retries: 429, 5xx, timeouts and connection errors (`RetryableError`) are retried up to `max_retries` times
  after `retry.Backoff`'s delay (exponential with jitter, or the server's Retry-After), and a failing server
  cools down so the retry goes to another one if there is one; other errors are raised at once;
- `n`: requests for more than `max_n_completions` (8) choices are split into parallel sub-requests; a server
  that answers fewer choices than asked (provider ignores `n`) gets the missing ones as parallel n=1
  requests and is remembered (`n_kwarg_is_ignored`), as Atropos does.

Backends only translate one request; they never retry (see `openai_compat.py`, `local.py`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from atropos_cli.config import ServerConfig
from atropos_cli.errors import InferenceError, ServerUnreachableError
from atropos_cli.inference.base import Generation, InferenceBackend, SamplingParams, Usage, next_request_seed
from atropos_cli.inference.openai_compat import RetryableError
from atropos_cli.retry import Backoff

__all__ = ["ServerManager", "MAX_N_COMPLETIONS"]

MAX_N_COMPLETIONS = 8
SPLITS = ("train", "eval")
# Atropos env code passes these; `model` is fixed per server, so it is accepted and ignored.
_IGNORED_KWARGS = frozenset({"model"})
# Sampling knobs the OpenAI/vLLM APIs take that SamplingParams does not model: sent via extra_body.
_PASSTHROUGH_KWARGS = frozenset(
    {"presence_penalty", "frequency_penalty", "top_k", "min_p", "repetition_penalty", "logit_bias"}
)
Call = Callable[[InferenceBackend, SamplingParams], Awaitable[Generation]]


async def _within(work: Awaitable[Generation], timeout: float | None, method: str) -> Generation:
    """`work`, bounded by a call's own `timeout=` (seconds) when it gives one."""
    if timeout is None:
        return await work
    try:
        return await asyncio.wait_for(work, timeout)
    except asyncio.TimeoutError:
        raise InferenceError(
            f"{method}() did not finish within its timeout={timeout:g}s",
            hint="raise the timeout the env passes, or send fewer requests at once (--concurrency)",
        ) from None


@dataclass
class _Server:
    config: ServerConfig
    backend: InferenceBackend
    url: str
    n_ignored: bool
    capacity: dict[str, int]
    in_flight: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SPLITS, 0))
    down_until: float = 0.0
    requests: int = 0
    failures: int = 0
    retries: int = 0
    successes: int = 0
    latency_total: float = 0.0
    first_error: str | None = None  # the first failed request's error, for a run that got no answer at all

    def free(self, split: str) -> int:
        return self.capacity[split] - self.in_flight[split]

    def stats(self) -> dict[str, Any]:
        mean = self.latency_total / self.successes if self.successes else None
        return {
            "url": self.url,
            "model": self.config.model_name,
            "requests": self.requests,
            "failures": self.failures,
            "first_error": self.first_error,
            "retries": self.retries,
            "in_flight": sum(self.in_flight.values()),
            "in_flight_eval": self.in_flight["eval"],
            "mean_latency_s": round(mean, 6) if mean is not None else None,
            "n_kwarg_is_ignored": self.n_ignored,
        }


class ServerManager:
    """Routes, bounds, retries and splits requests over the configured inference servers."""

    def __init__(
        self,
        configs: list[ServerConfig],
        backends: list[InferenceBackend] | None = None,
        *,
        backoff_base_s: float = 0.5,
        backoff_max_s: float = 10.0,
        max_n_completions: int = MAX_N_COMPLETIONS,
    ) -> None:
        if not configs:
            raise InferenceError("no inference server configured", hint="pass --openai.base_url URL")
        if backends is None:
            from atropos_cli.inference.factory import make_backend

            backends = [make_backend(config) for config in configs]
        if len(backends) != len(configs):
            raise InferenceError(
                f"got {len(backends)} backends for {len(configs)} server configs",
                hint="pass one backend per server config",
            )
        self.configs = list(configs)
        self.backoff = Backoff(backoff_base_s, backoff_max_s)
        self.max_n_completions = max_n_completions
        self._servers = [
            _Server(
                config=c,
                backend=b,
                url=c.base_url or f"local:{c.model_name}",
                n_ignored=c.n_kwarg_is_ignored,
                capacity={"train": c.num_max_requests_at_once, "eval": c.num_requests_for_eval},
            )
            for c, b in zip(configs, backends, strict=True)
        ]
        self._max_retries = max(c.max_retries for c in configs)
        self._turn = 0
        self._slot_freed: asyncio.Event | None = None
        self._event_loop: asyncio.AbstractEventLoop | None = None

    # -- what env code reads ------------------------------------------------------------------------------

    @property
    def model_name(self) -> str:
        return self.configs[0].model_name

    @property
    def tokenizer_name(self) -> str | None:
        name = self.configs[0].tokenizer_name
        return None if not name or name == "none" else name

    @property
    def tokenizer(self) -> Any | None:
        return getattr(self._servers[0].backend, "tokenizer", None)

    def stats(self) -> dict[str, Any]:
        servers = [s.stats() for s in self._servers]
        totals = {key: sum(s[key] for s in servers) for key in ("requests", "failures", "retries", "in_flight")}
        return {**totals, "servers": servers}

    async def aclose(self) -> None:
        for server in self._servers:
            await server.backend.aclose()

    # -- the Atropos-shaped entry points -----------------------------------------------------------------

    async def chat_completion(
        self,
        messages: list[dict[str, Any]],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        logprobs: bool = True,
        split: str = "train",
        timeout: float | None = None,
        **extra: Any,
    ) -> Generation:
        """Sample `n` chat completions; `split="eval"` uses the eval slots. See `_params` for `extra`.
        `timeout` (seconds, as the OpenAI client takes it) bounds the whole call, retries included."""
        sampling: dict[str, Any] = {"n": n, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        seed = seed if seed is not None else next_request_seed()  # reproducible inside collect_group
        sampling.update(stop=stop, seed=seed, logprobs=logprobs)
        params = self._params("chat_completion", split, sampling, extra)
        messages = [dict(m) for m in messages]

        async def call(backend: InferenceBackend, p: SamplingParams) -> Generation:
            return await backend.chat(messages, p)

        return await _within(self._generate(call, params, split), timeout, "chat_completion")

    async def completion(
        self,
        prompt: str | list[int],
        *,
        n: int = 1,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_tokens: int | None = None,
        stop: str | list[str] | None = None,
        seed: int | None = None,
        logprobs: bool = True,
        split: str = "train",
        timeout: float | None = None,
        **extra: Any,
    ) -> Generation:
        """Sample `n` completions of a text prompt or of a list of prompt token ids (`timeout`: as chat's)."""
        sampling: dict[str, Any] = {"n": n, "temperature": temperature, "top_p": top_p, "max_tokens": max_tokens}
        seed = seed if seed is not None else next_request_seed()  # reproducible inside collect_group
        sampling.update(stop=stop, seed=seed, logprobs=logprobs)
        params = self._params("completion", split, sampling, extra)

        async def call(backend: InferenceBackend, p: SamplingParams) -> Generation:
            return await backend.complete(prompt, p)

        return await _within(self._generate(call, params, split), timeout, "completion")

    def _params(self, method: str, split: str, sampling: dict[str, Any], extra: dict[str, Any]) -> SamplingParams:
        """Sampling kwargs -> SamplingParams. Extra kwargs: `model` is ignored (fixed per server),
        `extra_body` and vLLM/OpenAI knobs (top_k, min_p, penalties) go to the request body as-is,
        `max_completion_tokens` means max_tokens; anything else is an error naming the kwarg."""
        if split not in SPLITS:
            raise InferenceError(f"{method}() got split={split!r}", hint="use split='train' or split='eval'")
        extra = dict(extra)
        extra_body = dict(extra.pop("extra_body", None) or {})
        if "max_completion_tokens" in extra:
            alias = extra.pop("max_completion_tokens")
            sampling["max_tokens"] = sampling["max_tokens"] or alias
        for key, value in extra.items():
            if key in _PASSTHROUGH_KWARGS:
                extra_body[key] = value
            elif key not in _IGNORED_KWARGS:
                allowed = sorted({*SamplingParams.model_fields, *_PASSTHROUGH_KWARGS, "split", "model"})
                raise InferenceError(
                    f"{method}() got an unexpected keyword argument {key!r}", hint="allowed: " + ", ".join(allowed)
                )
        if isinstance(sampling["stop"], str):
            sampling["stop"] = [sampling["stop"]]
        values = {k: v for k, v in sampling.items() if v is not None}
        try:
            return SamplingParams(**values, extra_body=extra_body or None)
        except ValidationError as exc:
            err = exc.errors()[0]
            name = ".".join(str(p) for p in err["loc"])
            raise InferenceError(
                f"{method}() got {name}={err.get('input')!r} ({err['msg']})", hint="fix the sampling argument"
            ) from None

    # -- splitting and fan-out ---------------------------------------------------------------------------

    async def _generate(self, call: Call, params: SamplingParams, split: str) -> Generation:
        if params.n <= self.max_n_completions:
            return await self._request(call, params, split)
        sizes = [self.max_n_completions] * (params.n // self.max_n_completions)
        if params.n % self.max_n_completions:
            sizes.append(params.n % self.max_n_completions)
        parts = await _gather_all(
            self._request(call, _sub_params(params, size, offset), split) for offset, size in enumerate(sizes)
        )
        return _merge(parts)

    async def _fan_out(
        self, call: Call, params: SamplingParams, count: int, split: str, base: Generation | None
    ) -> Generation:
        """`count` parallel n=1 requests (for servers that ignore `n`), appended to `base`'s choices."""
        first = 1 if base is not None else 0
        parts = await _gather_all(self._request(call, _sub_params(params, 1, first + i), split) for i in range(count))
        return _merge([base, *parts] if base is not None else parts)

    # -- one request, retried ----------------------------------------------------------------------------

    async def _request(self, call: Call, params: SamplingParams, split: str) -> Generation:
        """One request for `params.n` (<= max_n_completions) choices, retried across servers."""
        last: RetryableError | None = None
        attempts = self._max_retries + 1
        for attempt in range(attempts):
            server = await self._acquire(split)
            if params.n > 1 and server.n_ignored:
                self._release(server, split)
                return await self._fan_out(call, params, params.n, split, None)
            generation: Generation | None = None
            try:
                generation = await self._send(server, call, params)
            except RetryableError as exc:
                last = exc
                server.down_until = time.monotonic() + self.backoff.delay(attempt, exc.retry_after)
            finally:
                self._release(server, split)
            if generation is not None:
                return await self._complete_n(call, params, split, server, generation)
            if attempt + 1 < attempts:
                server.retries += 1
                await self._wait_for_healthy()
        assert last is not None
        raise self._exhausted(last, attempts)

    async def _send(self, server: _Server, call: Call, params: SamplingParams) -> Generation:
        server.requests += 1
        started = time.perf_counter()
        try:
            generation = await call(server.backend, params)
        except InferenceError as exc:
            server.failures += 1
            server.first_error = server.first_error or exc.text
            raise
        server.successes += 1
        server.latency_total += time.perf_counter() - started
        return generation

    async def _complete_n(
        self, call: Call, params: SamplingParams, split: str, server: _Server, generation: Generation
    ) -> Generation:
        missing = params.n - len(generation.choices)
        if missing > 0:
            server.n_ignored = True  # remembered: next time this server gets n parallel n=1 requests
            return await self._fan_out(call, params, missing, split, generation)
        if missing < 0:
            generation = generation.model_copy(update={"choices": generation.choices[: params.n]})
        return generation

    async def _wait_for_healthy(self) -> None:
        """Sleep until the first failing server's cool-down ends (no sleep if some server is healthy)."""
        wait = min(s.down_until for s in self._servers) - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    def _exhausted(self, last: RetryableError, attempts: int) -> InferenceError:
        if last.kind == "connection":
            return ServerUnreachableError(
                f"no inference server answered at {last.url!r}",
                hint="start one (e.g. `atropos inference`) or fix --openai.base_url; offline, run the shipped "
                "model in-process instead: --openai.server_type local --model atropos-tiny-arith",
            )
        if last.kind == "timeout":
            timeout = max(s.config.timeout for s in self._servers)
            return InferenceError(
                f"inference server at {last.url!r} did not answer within {timeout:g}s ({attempts} attempts)",
                hint="raise --openai.timeout, or send fewer requests at once (--concurrency)",
            )
        return InferenceError(
            f"{last.message} (gave up after {attempts} attempts)",
            hint="the server is overloaded or failing: check its log, send fewer requests at once "
            "(--concurrency), or raise --openai.max_retries",
        )

    # -- slots -------------------------------------------------------------------------------------------

    def _event(self) -> asyncio.Event:
        loop = asyncio.get_running_loop()
        if self._slot_freed is None or self._event_loop is not loop:
            self._slot_freed, self._event_loop = asyncio.Event(), loop
        return self._slot_freed

    async def _acquire(self, split: str) -> _Server:
        event = self._event()
        while True:
            server = self._pick(split)
            if server is not None:
                server.in_flight[split] += 1
                return server
            event.clear()  # no await between the failed pick and here, so no release is missed
            await event.wait()

    def _release(self, server: _Server, split: str) -> None:
        server.in_flight[split] -= 1
        if self._slot_freed is not None:
            self._slot_freed.set()

    def _pick(self, split: str) -> _Server | None:
        """The healthy server with the most free slots (ties rotate); None means wait for a slot.

        A server cooling down after a failure gets requests only while no server is healthy: a busy healthy
        server frees a slot soon, a dead one would only burn a retry."""
        now = time.monotonic()
        healthy = [s for s in self._servers if s.down_until <= now] or self._servers
        candidates = [s for s in healthy if s.free(split) > 0]
        if not candidates:
            return None
        most = max(s.free(split) for s in candidates)
        best = [s for s in candidates if s.free(split) == most]
        self._turn += 1
        return best[self._turn % len(best)]


def _sub_params(params: SamplingParams, n: int, offset: int) -> SamplingParams:
    # A fixed seed would make every sub-request sample the same completions; offset it per sub-request.
    seed = params.seed + offset if params.seed is not None else None
    return params.model_copy(update={"n": n, "seed": seed})


async def _gather_all(calls: Iterable[Awaitable[Generation]]) -> list[Generation]:
    """gather, but let every sub-request finish (and free its slot) before raising the first error."""
    results = await asyncio.gather(*calls, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return list(results)  # type: ignore[arg-type]


def _merge(parts: list[Generation]) -> Generation:
    choices = [c for part in parts for c in part.choices]
    choices = [c.model_copy(update={"index": i}) for i, c in enumerate(choices)]
    prompt_ids = next((p.prompt_token_ids for p in parts if p.prompt_token_ids is not None), None)
    completion_tokens = sum(p.usage.completion_tokens for p in parts)
    prompt_tokens = parts[0].usage.prompt_tokens
    usage = Usage(
        prompt_tokens=prompt_tokens,
        completion_tokens=completion_tokens,
        total_tokens=prompt_tokens + completion_tokens,
    )
    return Generation(model=parts[0].model, choices=choices, prompt_token_ids=prompt_ids, usage=usage)
