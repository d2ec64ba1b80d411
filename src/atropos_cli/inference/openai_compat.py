"""The backend for any OpenAI-compatible HTTP server (OpenAI, vLLM, SGLang, TRL, our fake server).

One request in, one `Generation` out, no retries here: the router (`router.py`) owns retries, backoff,
routing and the `n` fallbacks. This module owns the wire details:

- request body: sampling args, plus `logprobs` when asked; for vLLM also `return_token_ids` (vLLM >= 0.10
  answers with top-level `prompt_token_ids` and per-choice `token_ids` on chat, per-choice `prompt_token_ids`
  and `token_ids` on completions);
- response parsing: we read the raw JSON ourselves, so vendor fields survive and a non-JSON body is caught;
- errors: HTTP failures become `RetryableError` (429, 5xx, timeout, connection) or `BadResponseError`
  (any other 4xx, garbage); a 400 that names `logprobs`/`return_token_ids` is retried once without them and
  the server is remembered as not supporting them.

Transport: one `aiohttp.ClientSession` per event loop (the transport the openai package offers as its faster
option) posting pre-serialized JSON (orjson), with the `Authorization: Bearer` header the openai package would
send. Its C HTTP parser and keyed connection pool cost ~0.25 ms of CPU a request at 64 in flight, where
httpx2's pool, which scans every connection twice a request, cost ~1.2 ms: the client's CPU is what bounds
`atropos process` on a 2-core machine (benchmarks/results/process.md). `timeout` bounds connecting (pool wait
included) and each wait for the server's bytes, as httpx's single timeout did.
"""

from __future__ import annotations

import asyncio
import json
import weakref
from typing import Any

import orjson

from atropos_cli.config import ServerConfig
from atropos_cli.errors import BadResponseError, InferenceError, RetryableError
from atropos_cli.httpclient import ReplyTooLarge, read_capped
from atropos_cli.inference.base import Choice, Generation, SamplingParams, Usage
from atropos_cli.retry import parse_retry_after

_NOT_OPENAI_HINT = "is --openai.base_url an OpenAI-compatible /v1 endpoint (vLLM, SGLang, `atropos inference`)?"

__all__ = ["OpenAICompatBackend", "RetryableError", "map_status_error", "parse_chat", "parse_completion"]

# Servers whose OpenAI API returns token ids when asked with `return_token_ids`.
_TOKEN_ID_SERVERS = ("vllm",)
_EXTRA_FIELDS = ("logprobs", "return_token_ids", "token_ids", "top_logprobs")


MAX_REPLY_BYTES = 1 << 30  # the largest answer read (n choices with logprobs of long completions)


class _StatusError(Exception):
    """A non-2xx answer, before it is mapped to a RetryableError or a BadResponseError."""

    def __init__(self, status: int, body: bytes, retry_after: str | None) -> None:
        super().__init__(status)
        self.status = status
        self.text = body.decode("utf-8", errors="replace")
        self.retry_after = retry_after


class OpenAICompatBackend:
    """`InferenceBackend` over an OpenAI-compatible HTTP API (no retries here: the router retries)."""

    def __init__(self, config: ServerConfig) -> None:
        if not config.base_url:
            raise InferenceError(
                f"server {config.model_name!r} of type {config.server_type!r} has no base_url",
                hint="pass --openai.base_url http://HOST:PORT/v1, or --openai.server_type local",
            )
        self.config = config
        self.model_name = config.model_name
        self.base_url = config.base_url.rstrip("/")
        self.tokenizer = None
        # Flipped when the server answers 400 to logprobs/return_token_ids; we stop asking.
        self.extras_supported = True
        self._client: Any = None
        self._client_loop: asyncio.AbstractEventLoop | None = None
        self._finalizer: weakref.finalize | None = None
        self._proxy = _env_proxy(self.base_url)

    def _session(self) -> Any:
        """This event loop's aiohttp session (a session belongs to one loop: a second asyncio.run gets a new one)."""
        loop = asyncio.get_running_loop()
        if self._finalizer is not None and self._client_loop is not loop:
            self._finalizer()  # `_discard`: its loop has ended, nothing there to wait for
        if self._finalizer is None or not self._finalizer.alive:
            self._client, self._client_loop = _new_session(self.config), loop
            # a backend dropped unclosed (env code's own ServerManager, say) lets go of its sockets quietly
            self._finalizer = weakref.finalize(self, _discard, self._client)
        return self._client

    def _sampling(self, params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.config.model_name,
            "n": params.n,
            "temperature": params.temperature,
            "top_p": params.top_p,
        }
        for key in ("max_tokens", "stop", "seed"):
            value = getattr(params, key)
            if value is not None:
                body[key] = value
        return body

    def _extra_body(self, params: SamplingParams, extras: bool) -> dict[str, Any] | None:
        extra = dict(params.extra_body or {})
        if extras and self.config.server_type in _TOKEN_ID_SERVERS:
            extra.setdefault("return_token_ids", True)
        return extra or None

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> Generation:
        async def send(extras: bool) -> Any:
            body = {**self._sampling(params), "messages": messages}
            if extras:
                body["logprobs"] = True
            return await self._post("/chat/completions", body, self._extra_body(params, extras))

        data = await self._send(send, params)
        return parse_chat(data, self.base_url, self.model_name)

    async def complete(self, prompt: str | list[int], params: SamplingParams) -> Generation:
        async def send(extras: bool) -> Any:
            body = {**self._sampling(params), "prompt": prompt}
            if extras:
                body["logprobs"] = 0  # legacy API: an int; 0 = only the sampled token's logprob
            return await self._post("/completions", body, self._extra_body(params, extras))

        data = await self._send(send, params)
        return parse_completion(data, self.base_url, self.model_name)

    async def _post(self, path: str, body: dict[str, Any], extra: dict[str, Any] | None) -> bytes:
        """POST plain JSON; a transport failure is retryable, a non-2xx answer raises `_StatusError`."""
        import aiohttp

        try:
            content = orjson.dumps({**body, **(extra or {})})
        except TypeError:  # a value orjson does not know (e.g. a subclass in extra_body): the stdlib tries harder
            content = json.dumps({**body, **(extra or {})}).encode()
        session = self._session()
        try:
            async with (
                asyncio.timeout(self.config.timeout),  # the whole call: a server dripping bytes cannot hold it
                session.post(self.base_url + path, data=content, proxy=self._proxy, allow_redirects=False) as response,
            ):
                raw = await read_capped(response.content, MAX_REPLY_BYTES)
        except ReplyTooLarge as exc:
            raise BadResponseError(
                f"inference server at {self.base_url!r}: {exc}", hint="is it an OpenAI-compatible server?"
            ) from None
        except asyncio.TimeoutError:  # aiohttp's connect and read timeouts are asyncio.TimeoutErrors
            raise RetryableError(
                f"inference server at {self.base_url!r} timed out", url=self.base_url, kind="timeout"
            ) from None
        except (aiohttp.ClientError, OSError):  # refused, reset, bad URL, broken HTTP
            raise RetryableError(
                f"no inference server answered at {self.base_url!r}", url=self.base_url, kind="connection"
            ) from None
        if response.status >= 300:
            raise _StatusError(response.status, raw, response.headers.get("retry-after"))
        return raw

    async def _send(self, send: Any, params: SamplingParams) -> dict[str, Any]:
        """Send once (once more without logprobs if the server rejects them); return the parsed JSON body."""
        extras = params.logprobs and self.extras_supported
        try:
            try:
                raw = await send(extras)
            except _StatusError as exc:
                if not (extras and exc.status == 400 and _names_extras(exc.text)):
                    raise
                self.extras_supported = False
                raw = await send(False)
        except _StatusError as exc:
            raise map_status_error(exc, self.base_url) from None
        return _json_body(raw, self.base_url)

    async def aclose(self) -> None:
        if self._finalizer is None or not self._finalizer.alive:
            return
        if self._client_loop is asyncio.get_running_loop():
            self._finalizer.detach()
            await self._client.close()
        else:
            self._finalizer()  # made on a loop that has ended (a closed loop can't be awaited on)
        self._client = None


def _new_session(config: ServerConfig) -> Any:
    import aiohttp

    return aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {config.api_key or 'EMPTY'}", "Content-Type": "application/json"},
        timeout=aiohttp.ClientTimeout(total=None, connect=config.timeout, sock_read=config.timeout),
        # the openai package's connection limit; idle connections dropped before uvicorn's (vLLM's) 5 s idle close
        connector=aiohttp.TCPConnector(limit=1000, keepalive_timeout=4.0),
    )


def _discard(session: Any) -> None:
    """Close a session's sockets now, without waiting and without aiohttp's 'Unclosed client session' log line
    (for a session whose loop has ended, or whose backend was dropped unclosed)."""
    connector = session.connector
    session.detach()
    if connector is not None:
        connector._close()  # the synchronous part of `close()`: closes the sockets, schedules nothing


def _env_proxy(url: str) -> str | None:
    """The HTTP(S)_PROXY that applies to `url` (None if unset or NO_PROXY covers it), as httpx honoured it.

    Looked up once per backend: aiohttp's `trust_env` looks it up per request in a worker thread, and that
    thread's GIL hand-offs cost more CPU than the request itself."""
    from urllib.parse import urlsplit
    from urllib.request import getproxies, proxy_bypass

    parts = urlsplit(url)
    if parts.hostname and proxy_bypass(parts.hostname):
        return None
    return getproxies().get(parts.scheme)


def _names_extras(text: str) -> bool:
    return any(field in text.lower() for field in _EXTRA_FIELDS)


def map_status_error(exc: _StatusError, url: str) -> InferenceError:
    """A non-2xx answer -> RetryableError (429, 5xx) or BadResponseError (other 4xx, with a hint)."""
    status, detail = exc.status, _detail(exc.text)
    if status == 429 or status >= 500:
        return RetryableError(
            f"inference server at {url!r} answered HTTP {status}: {detail}",
            url=url,
            kind="status",
            status=status,
            retry_after=parse_retry_after(exc.retry_after),
        )
    return BadResponseError(
        f"inference server at {url!r} rejected the request: HTTP {status}: {detail}", hint=_hint(status)
    )


def _detail(text: str) -> str:
    """The server's error message: OpenAI's `{"error": {"message"}}`, FastAPI's `detail`, or the raw text."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict):
        error = body.get("error")
        message = body.get("message") or (error.get("message") if isinstance(error, dict) else error)
        message = message or body.get("detail")
        if message:
            return repr(str(message)[:300])
    return repr(text.strip()[:300])


def _hint(status: int) -> str:
    if status in (401, 403):
        return "check --openai.api_key"
    if status == 404:
        return "check --openai.model_name and that --openai.base_url ends with /v1"
    return "check the sampling arguments and --openai.model_name against what the server accepts"


def _loads(content: bytes) -> Any:
    """orjson (4x faster), or the stdlib for what orjson refuses but Python servers send: NaN, -Infinity."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return json.loads(content)


def _json_body(content: bytes, url: str) -> dict[str, Any]:
    try:
        data = _loads(content)
    except (ValueError, UnicodeDecodeError):
        raise BadResponseError(
            f"inference server at {url!r} answered with something that is not JSON: {content[:120]!r}",
            hint="is --openai.base_url pointing at an OpenAI-compatible server (ending in /v1)?",
        ) from None
    if not isinstance(data, dict) or not isinstance(data.get("choices"), list) or not data["choices"]:
        raise BadResponseError(
            f"inference server at {url!r} answered without choices: {json.dumps(data)[:200]!r}",
            hint="is --openai.base_url pointing at an OpenAI-compatible server (ending in /v1)?",
        )
    if not all(isinstance(c, dict) for c in data["choices"]):
        raise BadResponseError(
            f"inference server at {url!r} answered malformed choices: {str(data)[:200]!r}", hint=_NOT_OPENAI_HINT
        )
    return data


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _usage(data: dict[str, Any]) -> Usage:
    raw = data.get("usage")
    if not isinstance(raw, dict):
        return Usage()
    return Usage(**{k: int(raw.get(k) or 0) for k in ("prompt_tokens", "completion_tokens", "total_tokens")})


def _chat_logprobs(choice: dict[str, Any]) -> list[float] | None:
    content = (choice.get("logprobs") or {}).get("content")
    if not isinstance(content, list):
        return None
    return [float(entry["logprob"]) for entry in content if isinstance(entry, dict) and "logprob" in entry]


def _completion_logprobs(choice: dict[str, Any]) -> list[float] | None:
    values = (choice.get("logprobs") or {}).get("token_logprobs")
    if not isinstance(values, list):
        return None
    return [float(v) for v in values if v is not None]


def parse_chat(data: dict[str, Any], url: str, model: str) -> Generation:
    """A chat.completion JSON body -> Generation (token ids/logprobs only where the server sent them)."""
    choices = []
    for index, raw in enumerate(data["choices"]):
        message = raw.get("message")
        if not isinstance(message, dict):
            raise BadResponseError(
                f"inference server at {url!r} answered a choice without a message: {raw!r}", hint=_NOT_OPENAI_HINT
            )
        choices.append(
            Choice(
                index=index,
                text=message.get("content") or "",
                finish_reason=raw.get("finish_reason"),
                token_ids=_int_list(raw.get("token_ids")),
                logprobs=_chat_logprobs(raw),
            )
        )
    return Generation(
        model=str(data.get("model") or model),
        choices=choices,
        prompt_token_ids=_int_list(data.get("prompt_token_ids")),
        usage=_usage(data),
    )


def parse_completion(data: dict[str, Any], url: str, model: str) -> Generation:
    """A text_completion JSON body -> Generation. vLLM puts `prompt_token_ids` on each choice here."""
    choices = []
    for index, raw in enumerate(data["choices"]):
        text = raw.get("text")
        if text is not None and not isinstance(text, str):
            raise BadResponseError(
                f"inference server at {url!r} answered a non-text choice: {raw!r}", hint=_NOT_OPENAI_HINT
            )
        choices.append(
            Choice(
                index=index,
                text=text or "",
                finish_reason=raw.get("finish_reason"),
                token_ids=_int_list(raw.get("token_ids")),
                logprobs=_completion_logprobs(raw),
            )
        )
    prompt_ids = _int_list(data.get("prompt_token_ids")) or _int_list(data["choices"][0].get("prompt_token_ids"))
    return Generation(
        model=str(data.get("model") or model), choices=choices, prompt_token_ids=prompt_ids, usage=_usage(data)
    )
