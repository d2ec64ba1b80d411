"""What a server behind `inference.server.create_app` implements (`Served`), and `LocalServed`: the in-process
`LocalBackend` (a transformers model) answering in OpenAI's shapes plus vLLM's extensions.

With `"return_token_ids": true`, chat responses carry `prompt_token_ids` at the top level and `token_ids` per
choice; completion choices carry both. Logprobs are raw (before temperature), like vLLM's default. The fake
test server (`atropos_cli.testing.fake_server`) is the other `Served`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterator
from typing import Any, Protocol

from starlette.responses import Response

from atropos_cli.errors import AtroposError
from atropos_cli.inference.base import Generation
from atropos_cli.inference.local import LocalBackend, LocalChoice
from atropos_cli.inference.openai_schema import ChatRequest, CompletionRequest, HTTPError, prompt_list

__all__ = ["Served", "LocalServed"]


class Served(Protocol):
    """A model behind the OpenAI-compatible app. `strict`: unknown parameters are a 400 (else kept as extras)."""

    strict: bool
    model_name: str

    def health(self) -> dict[str, Any]: ...
    def model_card(self) -> dict[str, Any]: ...
    def stats(self) -> dict[str, Any]: ...
    def max_prompt_chars(self) -> int | None: ...
    def arriving(self) -> contextlib.AbstractContextManager[None]: ...
    async def chat(self, req: ChatRequest) -> dict[str, Any] | Response: ...
    async def complete(self, req: CompletionRequest) -> dict[str, Any] | Response: ...
    async def reload(self, path: str) -> dict[str, Any]: ...
    async def aclose(self) -> None: ...


class LocalServed:
    """`LocalBackend` as a `Served`: concurrent requests reach the backend concurrently; each is announced to the
    batcher while its body is parsed, so a burst of requests becomes one batch."""

    strict = True

    def __init__(self, backend: LocalBackend) -> None:
        self.backend = backend
        self.model_name = backend.model_name
        self._longest_token: tuple[Any, int] | None = None

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.backend.model_name, "version": self.backend.version}

    def model_card(self) -> dict[str, Any]:
        b = self.backend
        return {
            "id": b.model_name, "object": "model", "created": int(time.time()), "owned_by": "atropos",
            "root": b.tokenizer_name, "max_model_len": b.max_model_len, "version": b.version,
        }  # fmt: skip

    def stats(self) -> dict[str, Any]:
        """Batching counters: how many model calls served how many sequences (rows / batches = batch size)."""
        batcher = self.backend.batcher
        return {"version": self.backend.version, "batches": batcher.batches_run, "rows": batcher.rows_run}

    def max_prompt_chars(self) -> int:
        """Characters beyond which a prompt cannot fit the context whatever it says: no token decodes to more
        characters than the longest vocabulary entry, so refuse longer text before tokenizing it."""
        tokenizer = self.backend.tokenizer
        if self._longest_token is None or self._longest_token[0] is not tokenizer:
            longest = max((len(t) for t in tokenizer.get_vocab()), default=1)
            self._longest_token = (tokenizer, max(longest, 1))
        return self.backend.max_model_len * self._longest_token[1]

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        with self.backend.batcher.arriving():
            yield

    def _decode_one(self, token_id: int) -> str:
        return str(self.backend.tokenizer.decode([token_id]))

    async def chat(self, req: ChatRequest) -> dict[str, Any]:
        images = sum(m.images() for m in req.messages)
        if images and getattr(self.backend, "vision", None) is None:  # as vLLM answers a text-only model: an
            message = f"the served model reads text only; the request has {images} image part(s)"  # error, never
            raise HTTPError(400, message, "messages")  # the images silently dropped
        messages = [m.for_template(parts=bool(images)) for m in req.messages]
        top = (req.top_logprobs or 0) if req.logprobs else 0
        generation = await self.backend.chat(messages, req.sampling(req.budget, self._decode_one), top_logprobs=top)
        return _chat_response(self.backend, req, generation)

    async def complete(self, req: CompletionRequest) -> dict[str, Any]:
        params, top = req.sampling(req.max_tokens, self._decode_one), req.logprobs or 0
        prompts = prompt_list(req.prompt)
        gens = await asyncio.gather(*(self.backend.complete(p, params, top_logprobs=top) for p in prompts))
        return _completion_response(self.backend, req, list(gens))

    async def reload(self, path: str) -> dict[str, Any]:
        try:
            version = await self.backend.areload(path)
        except AtroposError:
            raise
        except Exception as exc:  # a directory that looks like a checkpoint but does not load
            message = f"cannot load the checkpoint in {path!r}: {type(exc).__name__}: {str(exc)[:300]}"
            raise HTTPError(400, message, param="path") from None
        return {"status": "ok", "model": self.backend.model_name, "version": version, "path": path}

    async def aclose(self) -> None:
        await self.backend.aclose()


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
