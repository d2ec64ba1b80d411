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

Transport: a plain `httpx2.AsyncClient` (one per event loop; httpx2 is the client the openai package itself
uses, and holds up better than httpx 0.28 at 64 requests in flight) posting pre-serialized JSON (orjson), with
the `Authorization: Bearer` header the openai package would send, without the openai package's per-request
machinery (~1-2 ms of CPU a request, the bottleneck of `atropos process` on 2 cores).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import orjson

from atropos_cli.config import ServerConfig
from atropos_cli.errors import BadResponseError, InferenceError, RetryableError
from atropos_cli.inference.base import Choice, Generation, SamplingParams, Usage
from atropos_cli.retry import parse_retry_after

_NOT_OPENAI_HINT = "is --openai.base_url an OpenAI-compatible /v1 endpoint (vLLM, SGLang, `atropos inference`)?"

__all__ = ["OpenAICompatBackend", "RetryableError", "map_status_error", "parse_chat", "parse_completion"]

# Servers whose OpenAI API returns token ids when asked with `return_token_ids`.
_TOKEN_ID_SERVERS = ("vllm",)
_EXTRA_FIELDS = ("logprobs", "return_token_ids", "token_ids", "top_logprobs")


class _StatusError(Exception):
    """A non-2xx answer, before it is mapped to a RetryableError or a BadResponseError."""

    def __init__(self, response: Any) -> None:
        super().__init__(response.status_code)
        self.status = response.status_code
        self.text = response.text
        self.retry_after = response.headers.get("retry-after")


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

    def _get_client(self) -> Any:
        # An httpx pool belongs to one event loop; a new loop (e.g. a second asyncio.run) needs a new client.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop:
            import httpx2 as httpx

            self._client = httpx.AsyncClient(
                base_url=self.base_url,
                headers={
                    "Authorization": f"Bearer {self.config.api_key or 'EMPTY'}",
                    "Content-Type": "application/json",
                },
                timeout=self.config.timeout,
                limits=httpx.Limits(max_connections=1000, max_keepalive_connections=100),  # the openai defaults
            )
            self._client_loop = loop
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
        import httpx2 as httpx

        try:
            content = orjson.dumps({**body, **(extra or {})})
        except TypeError:  # a value orjson does not know (e.g. a subclass in extra_body): the stdlib tries harder
            content = json.dumps({**body, **(extra or {})}).encode()
        try:
            response = await self._get_client().post(path, content=content)
        except httpx.TimeoutException:
            raise RetryableError(
                f"inference server at {self.base_url!r} timed out", url=self.base_url, kind="timeout"
            ) from None
        except httpx.TransportError:
            raise RetryableError(
                f"no inference server answered at {self.base_url!r}", url=self.base_url, kind="connection"
            ) from None
        if response.status_code >= 300:
            raise _StatusError(response)
        return response.content

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
        if self._client is not None:
            client, self._client = self._client, None
            # RuntimeError: its event loop is already closed, so there is nothing left to release
            with contextlib.suppress(RuntimeError):
                await client.aclose()


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


def _json_body(content: bytes, url: str) -> dict[str, Any]:
    try:
        data = json.loads(content)
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
