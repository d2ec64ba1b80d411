"""A chat answer streamed as OpenAI's server-sent events (`stream: true`), for clients that only stream.

The answer is generated whole, then sent as chunks the way OpenAI frames them: per choice one chunk with the
assistant's role, whole content and tool calls (its logprobs when asked), one with the finish reason; then, with
`stream_options.include_usage`, a chunk without choices carrying the usage; then `data: [DONE]`. A client
that accumulates deltas gets the same message as the non-streamed answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

__all__ = ["chat_events"]


def chat_events(body: dict[str, Any], include_usage: bool) -> Iterator[bytes]:
    """The SSE byte frames of a `chat.completion` body."""
    head = {"id": body["id"], "object": "chat.completion.chunk", "created": body["created"], "model": body["model"]}
    for choice in body["choices"]:
        message = choice["message"]
        delta: dict[str, Any] = {"role": "assistant", "content": message.get("content") or ""}
        if message.get("tool_calls"):  # whole calls, each with its index, as OpenAI's first delta of a call
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
        first = {"index": choice["index"], "delta": delta, "finish_reason": None, "logprobs": choice.get("logprobs")}
        yield _frame({**head, "choices": [first]})
        last = {"index": choice["index"], "delta": {}, "finish_reason": choice.get("finish_reason")}
        yield _frame({**head, "choices": [last]})
    if include_usage:
        yield _frame({**head, "choices": [], "usage": body.get("usage")})
    yield b"data: [DONE]\n\n"


def _frame(event: dict[str, Any]) -> bytes:
    return f"data: {json.dumps(event)}\n\n".encode()
