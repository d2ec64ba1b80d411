"""The one client of the trajectory API (ours or atroposlib's `run-api`), for both of its sides.

Env side (`atropos serve`): `register_env`, `post_groups`, `status_env`, `disconnect_env`. Trainer side
(`atropos train --api-url`, `sft-gen` / `dpo-gen --api-url`): `register`, `next_batch` (polls `GET /batch`
until data comes or `idle_timeout` passes: `{"batch": null}` means "not enough data yet"), and the blocking
`iter_batches` / `iter_api_groups` over them for callers that are not async. `GET /reset_data` wipes a live
run's queue, so it is only sent when asked (`reset=True`).

It speaks the Atropos wire: `/status-env` as a GET with a JSON body, group bodies gzip-compressed when large,
the bearer token on every request. On the env side transient trouble is retried after `retry.Backoff`'s
delay: connection errors (API down or restarting), 5xx, and 503 (queue full; its `Retry-After` is honoured),
so a full queue slows the producer down instead of dropping work. The trainer side fails fast (a trainer
with no API has nothing to wait for). A 4xx other than 503 is the caller's bug and raises `ApiRequestError`
at once with the server's message.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import httpx
import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atropos_cli.errors import ApiRequestError, ApiUnavailableError, AtroposError, BadResponseError, RecordError
from atropos_cli.formats.reader import SourcedGroup
from atropos_cli.httpclient import ReplyTooLarge, bounded_send
from atropos_cli.retry import Backoff, parse_retry_after
from atropos_cli.types import ScoredGroup, describe_validation_error

__all__ = [
    "ApiClient",
    "ApiRequestError",
    "ApiSourceOptions",
    "ApiUnavailableError",
    "GZIP_MIN_BYTES",
    "TrainerRegistration",
    "iter_api_groups",
    "iter_batches",
]

GZIP_MIN_BYTES = 1024  # as Atropos' env client: smaller bodies are not worth compressing
_UNREACHABLE_HINT = "start it with `atropos api` (or Atropos' `run-api`) and check --api-url"
_AUTH_HINT = "pass the API's key with --api-key (or set ATROPOS_API_KEY)"


_NOT_AN_API_HINT = "is --api-url a trajectory API (`atropos api`, or Atropos' run-api)?"


class TrainerRegistration(BaseModel):
    """The body of `POST /register` (Atropos' `Registration`)."""

    wandb_group: str = "atropos"
    wandb_project: str = "atropos"
    batch_size: int
    max_token_len: int = 2048
    checkpoint_dir: str = "checkpoints"
    save_checkpoint_interval: int = 0
    starting_step: int = 0
    num_steps: int = 1000
    vocab_size: int | None = None  # ours: the API then refuses token ids the model has no embedding for


RetryHook = Callable[[str, float], None]
OnBad = Callable[[str, str], None]


MAX_REPLY_BYTES = 1 << 30  # the largest answer read (a batch of long sequences is tens of MiB)


class ApiClient:
    """Async client of one trajectory API; every method is one endpoint (see the module docstring)."""

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_wait_s: float | None = None,
        backoff: Backoff = Backoff(base_s=0.5, max_s=10.0),
        on_retry: RetryHook | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.base_url, headers=headers, timeout=timeout_s)
        self.timeout_s = timeout_s  # the whole of one request: connect, send, every byte of the answer
        self.max_wait_s = max_wait_s
        self.backoff = backoff
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
                resp = await bounded_send(
                    self.http, method, path, self.timeout_s, MAX_REPLY_BYTES, content=content, headers=headers
                )
            except ReplyTooLarge as exc:
                raise ApiUnavailableError(f"{method} {path}: {exc}", hint="is this a trajectory API?") from None
            except httpx.TransportError as exc:
                reason = f"cannot reach the trajectory API at {self.base_url} ({type(exc).__name__})"
                if not retry:
                    raise ApiUnavailableError(reason, hint=_UNREACHABLE_HINT) from None
                delay = self.backoff.delay(attempt)
            else:
                if resp.status_code < 400:
                    return _decode(resp)
                if resp.status_code < 500 or not retry:
                    raise _refusal(method, path, resp)
                reason = f"{method} {path} got {resp.status_code}: {_message(resp)}"
                delay = self.backoff.delay(attempt, parse_retry_after(resp.headers.get("retry-after")))
            attempt += 1
            if self.max_wait_s is not None and time.monotonic() - start + delay > self.max_wait_s:
                raise ApiUnavailableError(
                    f"gave up after {time.monotonic() - start:.0f} s: {reason}", _UNREACHABLE_HINT
                )
            if self.on_retry:
                self.on_retry(reason, delay)
            await asyncio.sleep(delay)

    # ---- trainer side -------------------------------------------------------------------------------
    async def register(self, registration: TrainerRegistration, *, reset: bool = False) -> dict[str, Any]:
        """POST /register as the trainer (after `GET /reset_data` when `reset`, which wipes the queue)."""
        if reset:
            await self.request("GET", "/reset_data", retry=False)
        return await self.request("POST", "/register", registration.model_dump(exclude_none=True), retry=False)

    async def get_batch(self) -> list[dict[str, Any]] | None:
        """The next batch (a list of ScoredData dicts), or None when the queue cannot fill one yet."""
        return _batch_of(await self.request("GET", "/batch", retry=False))

    async def next_batch(
        self,
        idle_timeout: float,
        poll_s: float = 1.0,
        on_wait: Callable[[float, int | None], None] | None = None,
        report_every: float = 30.0,
    ) -> list[dict[str, Any]] | None:
        """Poll GET /batch until it has data; None once `idle_timeout` seconds passed without any. While none
        comes, `on_wait(seconds waited, groups queued or None)` is called every `report_every` seconds."""
        started = reported = time.monotonic()
        while (batch := await self.get_batch()) is None:
            now = time.monotonic()
            if now - started >= idle_timeout:
                return None
            if on_wait is not None and now - reported >= report_every:
                reported = now
                on_wait(now - started, await self._queued())
            await asyncio.sleep(poll_s)
        return batch

    async def _queued(self) -> int | None:
        """GET /status's queue_size, or None when the API does not say (the status line does without it)."""
        try:
            size = (await self.status()).get("queue_size")
        except AtroposError:
            return None
        return size if isinstance(size, int) else None

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
            data = group.to_wire()
            if env_id is not None:
                data["env_id"] = env_id
            payloads.append(data)
        if len(payloads) == 1:
            return await self.request("POST", "/scored_data", payloads[0])
        return await self.request("POST", "/scored_data_list", payloads)


# ---- the trainer side for blocking callers ----------------------------------------------------------


def _wait_reporter(
    url: str, batch_size: int, idle_timeout: float, on_wait: Callable[[str], None] | None
) -> Callable[[float, int | None], None] | None:
    """`next_batch`'s on_wait, turned into the trainer's one-line status."""
    if on_wait is None:
        return None

    def report(waited: float, queued: int | None) -> None:
        queue = f", {queued} groups queued" if queued is not None else ""
        on_wait(
            f"waiting for a batch of {batch_size} from the trajectory API at {url} "
            f"({waited:.0f}s so far{queue}; giving up after {idle_timeout:.0f}s)"
        )

    return report


def iter_batches(
    url: str,
    registration: TrainerRegistration,
    *,
    api_key: str | None = None,
    idle_timeout: float = 30.0,
    poll_interval: float = 1.0,
    reset: bool = False,
    timeout: float = 30.0,
    on_bad: OnBad | None = None,
    on_wait: Callable[[str], None] | None = None,
    wait_report_every: float = 30.0,
) -> Iterator[list[ScoredGroup]]:
    """Register as the trainer and yield each batch's valid groups; return after `idle_timeout` s without data.

    While no data comes, `on_wait` gets one status line every `wait_report_every` seconds (what it waits for,
    for how long, and until when).

    A group that does not validate goes to `on_bad(location, reason)` (counted and skipped by the caller), or
    raises RecordError when no callback is given. The caller stops early by not asking for the next batch
    (closing the generator closes the connection).
    """
    loop = asyncio.new_event_loop()  # private: this generator may be driven from any synchronous code
    client = ApiClient(url, api_key, timeout_s=timeout)
    index = 0
    try:
        loop.run_until_complete(client.register(registration, reset=reset))
        waiting = _wait_reporter(url, registration.batch_size, idle_timeout, on_wait)
        while (
            raw := loop.run_until_complete(client.next_batch(idle_timeout, poll_interval, waiting, wait_report_every))
        ) is not None:
            groups = _valid_groups(raw, client.base_url, index, on_bad)
            index += len(raw)
            if groups:
                yield groups
    finally:
        # RuntimeError: closed from inside another running loop (garbage collection); the loop goes anyway
        with contextlib.suppress(RuntimeError):
            loop.run_until_complete(client.close())
        loop.close()


class ApiSourceOptions(BaseModel):
    """Where `sft-gen` / `dpo-gen --api-url` pull groups from, registered as a trainer of this shape (their
    `--api-url` options are generated from these fields: the docstrings are the help texts)."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    url: str
    """Pull groups from a live trajectory API as a trainer would."""
    api_key: str | None = None
    """Key for --api-url."""
    group_size: int = Field(2, ge=1)
    """With --api-url: group size used for the registered batch size (Atropos' flag)."""
    tasks_per_step: int = Field(64, ge=1)
    """With --api-url: groups per batch; registered batch size = group_size x tasks_per_step (Atropos' flag)."""
    max_token_len: int = Field(2048, ge=1)
    """Max token length registered with the API."""
    num_steps: int = Field(1000, ge=1)
    """With --api-url: steps registered with the API (Atropos' flag)."""
    idle_timeout: float = Field(30.0, gt=0)
    """With --api-url: stop after this many seconds without data."""
    poll_interval: float = Field(1.0, gt=0)
    """With --api-url: seconds between GET /batch polls while the queue is empty."""
    reset: bool = False
    """With --api-url: wipe the API's queue first (GET /reset_data)."""
    timeout: float = Field(30.0, gt=0)
    """With --api-url: seconds one HTTP request may take."""

    @property
    def batch_size(self) -> int:
        """Sequences per batch, as Atropos' tools register it."""
        return self.group_size * self.tasks_per_step


def iter_api_groups(options: ApiSourceOptions, *, on_bad: OnBad | None = None) -> Iterator[SourcedGroup]:
    """Every group of every batch, in arrival order, until the API stays idle for `options.idle_timeout`."""
    registration = TrainerRegistration(
        wandb_group="atropos-datagen",
        wandb_project="atropos-datagen",
        batch_size=options.batch_size,
        max_token_len=options.max_token_len,
        num_steps=options.num_steps,
    )
    source = options.url.rstrip("/")
    batches = iter_batches(
        source,
        registration,
        api_key=options.api_key,
        idle_timeout=options.idle_timeout,
        poll_interval=options.poll_interval,
        reset=options.reset,
        timeout=options.timeout,
        on_bad=on_bad,
    )
    index = 0
    for batch in batches:
        for group in batch:
            yield SourcedGroup(source, index, group)
            index += 1


def _valid_groups(raw: list[dict[str, Any]], source: str, first: int, on_bad: OnBad | None) -> list[ScoredGroup]:
    groups = []
    for offset, data in enumerate(raw):
        try:
            groups.append(ScoredGroup.model_validate(data))
        except ValidationError as exc:
            location, reason = (
                f"{source}#group {first + offset}",
                f"not a valid group: {describe_validation_error(exc)}",
            )
            if on_bad is None:
                raise RecordError(f"{location}: {reason}", hint="the env posting it is broken") from None
            on_bad(location, reason)
    return groups


def _batch_of(payload: Any) -> list[dict[str, Any]] | None:
    if not isinstance(payload, dict):
        raise BadResponseError(
            f"GET /batch returned {type(payload).__name__}, expected a JSON object", hint=_NOT_AN_API_HINT
        )
    if payload.get("status") == "error":
        raise ApiRequestError(
            f"the trajectory API refused GET /batch: {payload.get('message')!r}", 400, hint="see the API's log"
        )
    batch = payload.get("batch")
    if batch is not None and not isinstance(batch, list):
        raise BadResponseError(
            f"GET /batch returned batch={type(batch).__name__}, expected a list or null", hint=_NOT_AN_API_HINT
        )
    return batch or None


def _refusal(method: str, path: str, resp: httpx.Response) -> AtroposError:
    status = resp.status_code
    message = f"the trajectory API answered {method} {path} with HTTP {status}: {_message(resp)}"
    if status == 503:
        return ApiUnavailableError(message, hint="the API queue is full; retry later")
    hint = _hint(resp) or (_AUTH_HINT if status in (401, 403) else None)
    return ApiRequestError(message, status, hint)


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
