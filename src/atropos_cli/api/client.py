"""Async client of the trajectory API (ours or atroposlib's `run-api`), used by `atropos serve` and trainers.

It speaks the Atropos wire: `/status-env` as a GET with a JSON body, group bodies gzip-compressed when large,
the bearer token on every request. Transient trouble is retried with capped exponential backoff: connection
errors (API down or restarting), 5xx, and 503 (queue full; its `Retry-After` is honoured), so a full queue
slows the producer down instead of dropping work. A 4xx other than 503 is the caller's bug and raises
`ApiRequestError` at once with the server's message.
"""

from __future__ import annotations

import asyncio
import gzip
import random
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import orjson

from atropos_cli.errors import AtroposError
from atropos_cli.types import ScoredGroup

__all__ = ["ApiClient", "ApiRequestError", "ApiUnavailableError", "GZIP_MIN_BYTES"]

GZIP_MIN_BYTES = 1024  # as Atropos' env client: smaller bodies are not worth compressing


class ApiRequestError(AtroposError):
    """The API refused a request (4xx): retrying the same request cannot help."""

    def __init__(self, message: str, status: int, hint: str | None = None) -> None:
        super().__init__(message, hint)
        self.status = status


class ApiUnavailableError(AtroposError):
    """The API could not be reached (or stayed busy) for longer than the client's `max_wait_s`."""


RetryHook = Callable[[str, float], None]


class ApiClient:
    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_wait_s: float | None = None,
        backoff_max_s: float = 10.0,
        on_retry: RetryHook | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self.max_wait_s = max_wait_s
        self.backoff_max_s = backoff_max_s
        self.on_retry = on_retry

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self.http.aclose()

    # ---- transport with retries ---------------------------------------------------------------------
    async def request(self, method: str, path: str, body: Any = None, *, retry: bool = True) -> Any:
        """Send one request (JSON body, gzip when large) and return the decoded JSON answer."""
        content, headers = _encode(body)
        start, attempt = time.monotonic(), 0
        while True:
            try:
                resp = await self.http.request(method, path, content=content, headers=headers)
            except httpx.TransportError as exc:
                if not retry:
                    raise ApiUnavailableError(f"cannot reach the API at {self.base_url}: {exc!r}") from None
                reason, delay = f"cannot reach {self.base_url} ({type(exc).__name__})", None
            else:
                if resp.status_code < 400:
                    return _decode(resp)
                if resp.status_code < 500 or not retry:
                    if resp.status_code == 503 and not retry:
                        raise ApiUnavailableError(_message(resp), hint="the API queue is full; retry later")
                    raise ApiRequestError(f"{method} {path}: {_message(resp)}", resp.status_code, _hint(resp))
                reason = f"{method} {path} got {resp.status_code}: {_message(resp)}"
                delay = _retry_after(resp)
            attempt += 1
            delay = delay if delay is not None else min(self.backoff_max_s, 0.25 * 2**attempt)
            delay *= 1 + 0.1 * random.random()  # jitter: many envs must not retry in lockstep
            if self.max_wait_s is not None and time.monotonic() - start + delay > self.max_wait_s:
                raise ApiUnavailableError(
                    f"gave up after {time.monotonic() - start:.0f} s: {reason}",
                    hint="is `atropos api` running at that URL (--api-url)?",
                )
            if self.on_retry:
                self.on_retry(reason, delay)
            await asyncio.sleep(delay)

    # ---- trainer side -------------------------------------------------------------------------------
    async def register(self, registration: dict[str, Any]) -> int:
        return int((await self.request("POST", "/register", registration))["uuid"])

    async def get_batch(self) -> list[dict[str, Any]] | None:
        """The next batch (a list of ScoredData dicts), or None when the queue cannot fill one yet."""
        return (await self.request("GET", "/batch")).get("batch")

    # ---- env side -----------------------------------------------------------------------------------
    async def register_env(
        self, registration: dict[str, Any], poll_s: float = 1.0, on_wait: Callable[[str], None] | None = None
    ) -> dict[str, Any]:
        """POST /register-env until it succeeds (the API answers 'wait' until the trainer's first /batch)."""
        while True:
            answer = await self.request("POST", "/register-env", registration)
            if answer.get("status") == "success":
                return answer
            if on_wait:
                on_wait(str(answer.get("status")))
            await asyncio.sleep(poll_s)

    async def info(self) -> dict[str, Any]:
        return await self.request("GET", "/info")

    async def status(self) -> dict[str, Any]:
        return await self.request("GET", "/status")

    async def status_env(self, env_id: int) -> dict[str, Any]:
        return await self.request("GET", "/status-env", {"env_id": env_id})

    async def disconnect_env(self, env_id: int) -> dict[str, Any]:
        return await self.request("POST", "/disconnect-env", {"env_id": env_id}, retry=False)

    async def post_groups(self, groups: Sequence[ScoredGroup], env_id: int | None = None) -> dict[str, Any]:
        """POST one group to /scored_data or several to /scored_data_list; `env_id` is stamped on each."""
        payloads = []
        for group in groups:
            data = group.to_scored_data()
            if env_id is not None:
                data["env_id"] = env_id
            payloads.append(data)
        if len(payloads) == 1:
            return await self.request("POST", "/scored_data", payloads[0])
        return await self.request("POST", "/scored_data_list", payloads)


def _encode(body: Any) -> tuple[bytes | None, dict[str, str]]:
    if body is None:
        return None, {}
    raw = orjson.dumps(body)
    headers = {"Content-Type": "application/json"}
    if len(raw) >= GZIP_MIN_BYTES:
        packed = gzip.compress(raw, compresslevel=1)
        if len(packed) < len(raw):
            return packed, {**headers, "Content-Encoding": "gzip"}
    return raw, headers


def _decode(resp: httpx.Response) -> Any:
    if not resp.headers.get("content-type", "").startswith("application/json"):
        return {"status": resp.text}
    return orjson.loads(resp.content)


def _message(resp: httpx.Response) -> str:
    try:
        data = resp.json()
    except ValueError:
        return resp.text[:300] or f"HTTP {resp.status_code}"
    if isinstance(data, dict):
        return str(data.get("message") or data.get("detail") or data)[:500]
    return str(data)[:500]


def _hint(resp: httpx.Response) -> str | None:
    try:
        data = resp.json()
    except ValueError:
        return None
    return data.get("hint") if isinstance(data, dict) else None


def _retry_after(resp: httpx.Response) -> float | None:
    value = resp.headers.get("retry-after", "")
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
