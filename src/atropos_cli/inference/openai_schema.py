"""The one request schema of our OpenAI-compatible servers (`atropos inference` and the fake test server).

`parse_request(body, model, strict)` validates a JSON body into `ChatRequest` / `CompletionRequest`. Strict
(a real model): a parameter we do not implement is a 400 naming it unless sent at its no-op value. Lenient
(the fake, which plays vLLM): unknown parameters are kept in the request's extras. Either way a bad value is
a 400 that names the parameter: `"content": 5`, `seed` outside int64, `n` over 512.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atropos_cli.inference.base import SamplingParams

__all__ = [
    "HTTPError", "ChatMessage", "ChatRequest", "CompletionRequest", "parse_request", "prompt_list", "NOOP_VALUES",
]  # fmt: skip

# OpenAI / vLLM parameters accepted only at their no-op value; anything else is a 400 naming the parameter.
NOOP_VALUES: dict[str, tuple[Any, ...]] = {
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "tool_choice": (None, "none", "auto"),
    "parallel_tool_calls": (None, True, False),
    "response_format": (None, {"type": "text"}),
    "top_k": (None, -1, 0),
    "min_tokens": (None, 0),
    "skip_special_tokens": (None, True),
    "include_stop_str_in_output": (None, False),
    "echo": (None, False),
    "best_of": (None, 1),
    "suffix": (None, ""),
}
IGNORED = {"user", "metadata", "store", "service_tier"}
INT64 = 2**63


class HTTPError(Exception):
    """An error answered with OpenAI's error body and a real status code."""

    def __init__(
        self, status: int, message: str, param: str | None = None, kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
    ) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.param, self.kind, self.headers = status, message, param, kind, headers


class TextPart(BaseModel):
    type: Literal["text"]
    text: str


class ImagePart(BaseModel):
    """An image content part (`{"type": "image_url", "image_url": {"url": ...}}`), as vision envs send it."""

    type: Literal["image_url"]
    image_url: dict[str, Any]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")  # name, tool_calls, tool_call_id, ... pass through to the template

    role: str
    content: str | list[TextPart | ImagePart] | None = None

    def text(self) -> str:
        """The message's text (its text parts joined; image parts carry none)."""
        if isinstance(self.content, list):
            return "".join(p.text for p in self.content if isinstance(p, TextPart))
        return self.content or ""

    def images(self) -> int:
        return sum(isinstance(p, ImagePart) for p in self.content) if isinstance(self.content, list) else 0

    def for_template(self, parts: bool = False) -> dict[str, Any]:
        """The message as the chat template takes it: its text, or with `parts` (a vision-language model) its
        content parts, images included, in order."""
        content: Any = self.text()
        if parts and isinstance(self.content, list):
            content = [p.model_dump() for p in self.content]
        return {**(self.model_extra or {}), "role": self.role, "content": content}


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    n: int = Field(1, ge=1, le=512)
    temperature: float = Field(1.0, ge=0.0, le=10.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    max_tokens: int | None = Field(None, ge=1)
    # vLLM takes token ids among the stop strings too (Atropos envs send `stop=[tokenizer.eos_token_id]`)
    stop: str | list[str | int] | None = None
    seed: int | None = Field(None, ge=-INT64, lt=INT64)  # int64 like OpenAI's; torch takes seed + choice
    return_token_ids: bool = False

    @property
    def stop_list(self) -> list[str]:
        """The stop strings (token ids in `stop` are in `stop_token_ids`)."""
        return [self.stop] if isinstance(self.stop, str) else [s for s in self.stop or [] if isinstance(s, str)]

    @property
    def stop_token_ids(self) -> list[int]:
        return [s for s in self.stop or [] if isinstance(s, int)] if isinstance(self.stop, list) else []

    def sampling(self, max_tokens: int | None, decode: Callable[[int], str] | None = None) -> SamplingParams:
        """The backend's sampling arguments; a stop token id becomes its text through `decode` (the model's
        tokenizer: a special token such as EOS decodes to its marker, and the model stops there anyway)."""
        stops = self.stop_list + [decode(t) for t in self.stop_token_ids if decode is not None]
        return SamplingParams(
            n=self.n, temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens,
            stop=[s for s in stops if s] or None, seed=self.seed, logprobs=True,
        )  # fmt: skip


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: bool = False


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=20)
    stream: bool = False
    """Answer as server-sent events (the whole answer, framed as OpenAI's chunks: inference/sse.py)."""
    stream_options: StreamOptions | None = None

    @property
    def budget(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def prompt_chars(self) -> int:
        return sum(len(m.text()) for m in self.messages)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(16, ge=1)  # OpenAI's default for completions
    logprobs: int | None = Field(None, ge=0, le=20)

    def prompt_chars(self) -> int:
        return sum(len(p) for p in prompt_list(self.prompt) if isinstance(p, str))


def _check_extras(body: dict[str, Any], model: type[BaseModel]) -> None:
    for key, value in body.items():
        if key in model.model_fields or key in IGNORED:
            continue
        if key not in NOOP_VALUES:
            raise HTTPError(400, f"unsupported parameter {key!r}", param=key)
        if value not in NOOP_VALUES[key]:
            raise HTTPError(400, f"unsupported value for parameter {key!r}: {value!r}", param=key)


def parse_request(body: Any, model: type[_Common], strict: bool) -> Any:
    if not isinstance(body, dict):
        raise HTTPError(400, "request body must be a JSON object")
    if strict:
        _check_extras(body, model)
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        param = str(err["loc"][0]) if err["loc"] else None
        raise HTTPError(400, f"bad value for parameter {loc!r}: {err['msg']}", param=param) from None


def prompt_list(prompt: Any) -> list[str | list[int]]:
    """A completions `prompt` is a string, a list of ids, or a list of either (one entry per prompt)."""
    if isinstance(prompt, str) or (prompt and all(isinstance(t, int) for t in prompt)):
        return [prompt]
    if not prompt:
        raise HTTPError(400, "prompt is empty", param="prompt")
    return list(prompt)
