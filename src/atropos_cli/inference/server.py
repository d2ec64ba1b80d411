"""`atropos inference`: an OpenAI-compatible HTTP server over the in-process `LocalBackend`.

`create_app(backend)` is a FastAPI factory. Endpoints: `GET /health` ({status, model, version}),
`GET /v1/models`, `GET /stats` (batching counters), `POST /v1/chat/completions`, `POST /v1/completions`,
and `POST /reload_weights {"path": DIR}` (what the trainer calls after a step: the backend swaps weights
between two batches and bumps `version`). Concurrent HTTP requests reach the backend concurrently; each is
announced to the batcher while its body is parsed, so a burst of requests becomes one batch.

Response shapes follow OpenAI (so the `openai` package parses them) plus vLLM's extensions: with
`"return_token_ids": true`, chat responses carry `prompt_token_ids` at the top level and `token_ids` per
choice; completion choices carry both. Logprobs are raw (before temperature), like vLLM's default.
Errors use real status codes with OpenAI's error body: an unsupported parameter, a bad value or a prompt
longer than the context is a 400 that names the parameter.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atropos_cli.errors import AtroposError, ModelLoadError
from atropos_cli.inference.base import Generation, SamplingParams
from atropos_cli.inference.local import BadRequestError, LocalBackend, LocalChoice

__all__ = ["create_app", "ChatRequest", "CompletionRequest"]

# OpenAI / vLLM parameters accepted only at their no-op value; anything else is a 400 naming the parameter.
NOOP_VALUES: dict[str, tuple[Any, ...]] = {
    "stream": (None, False),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
    "stream_options": (None,),
    "top_k": (None, -1, 0),
    "min_tokens": (None, 0),
    "skip_special_tokens": (None, True),
    "include_stop_str_in_output": (None, False),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
IGNORED = {"user", "metadata", "store", "service_tier", "model"}


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid")

    n: int = Field(1, ge=1, le=512)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: str | list[str] | None = None
    seed: int | None = None
    return_token_ids: bool = False

    def sampling(self, max_tokens: int | None) -> SamplingParams:
        stop = [self.stop] if isinstance(self.stop, str) else self.stop
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens, stop=stop or None,
            seed=self.seed, logprobs=True,
        )  # fmt: skip


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=20)


class _HTTPError(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def _parse(body: Any, model: type[BaseModel]) -> Any:
    if not isinstance(body, dict):
        raise _HTTPError(400, "request body must be a JSON object")
    kept = {}
    for key, value in body.items():
        if key in model.model_fields:
            kept[key] = value
        elif key in NOOP_VALUES:
            if value not in NOOP_VALUES[key]:
                raise _HTTPError(400, f"unsupported value for parameter {key!r}: {value!r}", param=key)
        elif key not in IGNORED:
            raise _HTTPError(400, f"unsupported parameter {key!r}", param=key)
    try:
        return model.model_validate(kept)
    except ValidationError as exc:
        err = exc.errors()[0]
        param = str(err["loc"][0]) if err["loc"] else None
        raise _HTTPError(400, f"bad value for parameter {param!r}: {err['msg']}", param=param) from None


def _text_content(message: dict[str, Any]) -> dict[str, Any]:
    """OpenAI allows content as a list of parts; the chat template wants a string."""
    content = message.get("content")
    if isinstance(content, list):
        texts = [p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content):
            raise _HTTPError(400, "only text content parts are supported", param="messages")
        return {**message, "content": "".join(texts)}
    if content is None:
        return {**message, "content": ""}
    return message


class _TokenText:
    """Text and UTF-8 bytes of single tokens, memoised per tokenizer (decoding is the costly part of logprobs)."""

    def __init__(self) -> None:
        self._tokenizer: Any = None
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, tokenizer: Any, token_id: int) -> tuple[str, list[int]]:
        if tokenizer is not self._tokenizer:  # a reload brought a new tokenizer
            self._tokenizer, self._cache = tokenizer, {}
        hit = self._cache.get(token_id)
        if hit is None:
            text = tokenizer.decode([token_id])
            hit = self._cache[token_id] = (text, list(text.encode("utf-8")))
        return hit


_token_text = _TokenText()


def _token_entry(tokenizer: Any, token_id: int, logprob: float) -> dict[str, Any]:
    text, raw = _token_text(tokenizer, token_id)
    return {"token": text, "logprob": logprob, "bytes": raw}


def _chat_logprobs(tokenizer: Any, choice: LocalChoice) -> dict[str, Any]:
    content = []
    for step, (tid, lp) in enumerate(zip(choice.token_ids or [], choice.logprobs or [], strict=True)):
        entry = _token_entry(tokenizer, tid, lp)
        alts = choice.top_logprobs[step] if choice.top_logprobs else []
        entry["top_logprobs"] = [_token_entry(tokenizer, a, alp) for a, alp in alts]
        content.append(entry)
    return {"content": content}


def _completion_logprobs(tokenizer: Any, choice: LocalChoice) -> dict[str, Any]:
    tokens = [_token_text(tokenizer, t)[0] for t in choice.token_ids or []]
    offsets, at = [], 0
    for token in tokens:
        offsets.append(at)
        at += len(token)
    top = None
    if choice.top_logprobs is not None:
        top = [{_token_text(tokenizer, a)[0]: alp for a, alp in alts} for alts in choice.top_logprobs]
    return {"tokens": tokens, "token_logprobs": choice.logprobs, "top_logprobs": top, "text_offset": offsets}


def _usage(generations: list[Generation]) -> dict[str, int]:
    prompt = sum(g.usage.prompt_tokens for g in generations)
    completion = sum(g.usage.completion_tokens for g in generations)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _chat_response(backend: LocalBackend, req: ChatRequest, gen: Generation) -> dict[str, Any]:
    choices = []
    for choice in gen.choices:
        assert isinstance(choice, LocalChoice)
        item: dict[str, Any] = {
            "index": choice.index,
            "message": {"role": "assistant", "content": choice.text},
            "logprobs": _chat_logprobs(backend.tokenizer, choice) if req.logprobs else None,
            "finish_reason": choice.finish_reason,
        }
        if req.return_token_ids:
            item["token_ids"] = choice.token_ids
        choices.append(item)
    body: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": backend.model_name,
        "choices": choices,
        "usage": _usage([gen]),
    }
    if req.return_token_ids:
        body["prompt_token_ids"] = gen.prompt_token_ids
    return body


def _completion_response(backend: LocalBackend, req: CompletionRequest, gens: list[Generation]) -> dict[str, Any]:
    choices = []
    for p, gen in enumerate(gens):
        for choice in gen.choices:
            assert isinstance(choice, LocalChoice)
            item: dict[str, Any] = {
                "index": p * req.n + choice.index,
                "text": choice.text,
                "logprobs": _completion_logprobs(backend.tokenizer, choice) if req.logprobs is not None else None,
                "finish_reason": choice.finish_reason,
            }
            if req.return_token_ids:
                item["token_ids"] = choice.token_ids
                item["prompt_token_ids"] = gen.prompt_token_ids
            choices.append(item)
    return {
        "id": f"cmpl-{uuid.uuid4().hex}",
        "object": "text_completion",
        "created": int(time.time()),
        "model": backend.model_name,
        "choices": choices,
        "usage": _usage(gens),
    }


def _prompts(prompt: Any) -> list[str | list[int]]:
    """A completions `prompt` is a string, a list of ids, or a list of either (one entry per prompt)."""
    if isinstance(prompt, str) or (prompt and all(isinstance(t, int) for t in prompt)):
        return [prompt]
    if not prompt:
        raise _HTTPError(400, "prompt is empty", param="prompt")
    return list(prompt)


def _error(exc: _HTTPError) -> JSONResponse:
    body = {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.status}}
    return JSONResponse(body, status_code=exc.status)


def create_app(backend: LocalBackend) -> FastAPI:
    """The FastAPI app serving `backend`. Closing the app (lifespan end) closes the backend."""

    @asynccontextmanager
    async def lifespan(_: FastAPI):
        yield
        await backend.aclose()

    app = FastAPI(title="atropos inference", lifespan=lifespan)

    @app.exception_handler(_HTTPError)
    async def _on_http_error(_: Request, exc: _HTTPError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(AtroposError)
    async def _on_atropos_error(_: Request, exc: AtroposError) -> JSONResponse:
        message = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
        if isinstance(exc, BadRequestError | ModelLoadError):
            return _error(_HTTPError(400, message))
        return _error(_HTTPError(500, message, kind="server_error"))

    async def _json(request: Request) -> Any:
        try:
            return await request.json()
        except ValueError:
            raise _HTTPError(400, "request body is not valid JSON") from None

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": backend.model_name, "version": backend.version}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """Batching counters: how many model calls served how many sequences (rows / batches = batch size)."""
        batcher = backend.batcher
        return {"version": backend.version, "batches": batcher.batches_run, "rows": batcher.rows_run}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {
            "id": backend.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "atropos",
            "root": backend.tokenizer_name,
            "max_model_len": backend.max_model_len,
            "version": backend.version,
        }
        return {"object": "list", "data": [card]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> JSONResponse:
        with backend.batcher.arriving():  # a burst of requests being parsed becomes one batch
            req: ChatRequest = _parse(await _json(request), ChatRequest)
            messages = [_text_content(m) for m in req.messages]
            top = (req.top_logprobs or 0) if req.logprobs else 0
            params = req.sampling(req.max_completion_tokens or req.max_tokens)
            generation = await backend.chat(messages, params, top_logprobs=top)
        # a JSONResponse skips FastAPI's jsonable_encoder walk over the nested body (measurably faster)
        return JSONResponse(_chat_response(backend, req, generation))

    @app.post("/v1/completions")
    async def complete(request: Request) -> JSONResponse:
        with backend.batcher.arriving():
            req: CompletionRequest = _parse(await _json(request), CompletionRequest)
            params = req.sampling(req.max_tokens)
            top = req.logprobs or 0
            prompts = _prompts(req.prompt)
            gens = await asyncio.gather(*(backend.complete(p, params, top_logprobs=top) for p in prompts))
        return JSONResponse(_completion_response(backend, req, list(gens)))

    class ReloadRequest(BaseModel):
        model_config = ConfigDict(extra="forbid")
        path: str

    @app.post("/reload_weights")
    async def reload_weights(request: Request) -> dict[str, Any]:
        req: ReloadRequest = _parse(await _json(request), ReloadRequest)
        version = await backend.areload(req.path)
        return {"status": "ok", "model": backend.model_name, "version": version, "path": req.path}

    return app
