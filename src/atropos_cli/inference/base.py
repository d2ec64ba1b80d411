"""The one protocol every inference backend implements, and the typed request/response models it speaks.

Backends (`openai_compat`: any OpenAI-compatible HTTP server incl. vLLM/SGLang; `local`: in-process
transformers) turn a chat or a prompt plus `SamplingParams` into a `Generation`: `n` choices, each with text,
finish reason and, where the backend has them, completion token ids and per-token logprobs. Retries, timeouts
and routing live in `router.py`, not here.

`Generation` is shaped like an OpenAI response where env code touches it (`.choices[i].message.content`,
`.choices[i].text`, `.choices[i].finish_reason`), so Atropos envs that call
`self.server.chat_completion(...)` keep working.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "SamplingParams",
    "ChatMessage",
    "Choice",
    "Usage",
    "Generation",
    "InferenceBackend",
    "seeded_requests",
    "next_request_seed",
]


class SamplingParams(BaseModel):
    """Sampling arguments shared by every backend. `logprobs` asks for token ids + logprobs when supported."""

    model_config = ConfigDict(extra="forbid")

    n: int = Field(1, ge=1)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    stop: list[str | int] | None = None
    """Stop strings; an int is a stop token id (vLLM takes them among the strings; Atropos envs send EOS's)."""
    seed: int | None = None
    logprobs: bool = True
    extra_body: dict[str, Any] | None = None
    """Vendor fields sent as-is in the request body by HTTP backends (e.g. vLLM's `top_k`); local ignores it."""


class ChatMessage(BaseModel):
    role: str = "assistant"
    content: str | None = None


class Choice(BaseModel):
    """One sampled completion. `token_ids`/`logprobs` cover completion tokens only, one logprob per token."""

    index: int = 0
    text: str
    finish_reason: str | None = None
    token_ids: list[int] | None = None
    logprobs: list[float] | None = None

    @property
    def message(self) -> ChatMessage:
        return ChatMessage(role="assistant", content=self.text)


class Usage(BaseModel):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Generation(BaseModel):
    """The answer to one request: `n` choices for one prompt, plus the prompt's token ids when known."""

    model: str
    choices: list[Choice]
    prompt_token_ids: list[int] | None = None
    usage: Usage = Field(default_factory=Usage)

    @property
    def has_tokens(self) -> bool:
        return self.prompt_token_ids is not None and all(c.token_ids is not None for c in self.choices)


@runtime_checkable
class InferenceBackend(Protocol):
    """What the router calls. Implementations raise `InferenceError` subclasses, never return errors."""

    model_name: str

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams) -> Generation: ...

    async def complete(self, prompt: str | list[int], params: SamplingParams) -> Generation: ...

    async def aclose(self) -> None: ...


# Reproducible sampling: `runs.rollout.collect_group` opens `seeded_requests(run_seed, key)` around one item's
# group; every request made inside it without an explicit seed (in the order the env makes them) gets the next
# seed of a stream derived from (run seed, key), so a rerun with the same seed samples the same completions.
_request_seeds: ContextVar[Iterator[int] | None] = ContextVar("request_seeds", default=None)


def _seed_stream(run_seed: int, key: str) -> Iterator[int]:
    for call in itertools.count():
        digest = hashlib.blake2b(f"{run_seed}:{key}:{call}".encode(), digest_size=8).digest()
        yield int.from_bytes(digest, "big") >> 3  # < 2**61: room for per-choice offsets, fits every server


@contextmanager
def seeded_requests(run_seed: int, key: str) -> Iterator[None]:
    """Requests made in this context (and in tasks it starts) without a seed get seeds derived from the key."""
    token = _request_seeds.set(_seed_stream(run_seed, key))
    try:
        yield
    finally:
        _request_seeds.reset(token)


def next_request_seed() -> int | None:
    """The next derived seed inside `seeded_requests`, else None (the backend then samples unseeded)."""
    stream = _request_seeds.get()
    return next(stream) if stream is not None else None
