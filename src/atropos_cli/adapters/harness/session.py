"""One harness rollout as the recording proxy sees it: every model call's prompt and completion token ids and
logprobs, kept as token-exact segments.

A harness (an agent program) sends whole chats on every call; the proxy never re-tokenises what was sampled:
- the first call renders the chat with the policy's chat template (`TokenTrace.start`, with the call's tools);
- a call whose messages are an earlier call's messages, then the reply the proxy returned, then new messages
  (tool results, a user turn) extends that segment: its prompt is the earlier prompt + the sampled completion
  ids + the bridge (`TokenTrace.add_messages`), so the prompt of turn k+1 starts with turn k's prompt and
  completion, token for token;
- any other call (the harness edited, dropped or compacted its history, or changed its tools) starts a new
  segment from a fresh render and is recorded as drift (kind `history_rewritten`), never merged silently;
- a backend that returns no completion token ids makes the proxy encode the reply text once: drift
  `retokenized` (the trained ids may differ from the sampled ones); prompt ids answered that differ from the
  ones sent: drift `prompt_mismatch`.

`rows()` gives one trainable row per segment: tokens, masks (-100 on prompt and bridge tokens, the token id on
sampled ones), logprobs (1.0 on masked positions; None when a reply came without them), and the conversation
as the harness saw it. Calls of one session run one at a time (a lock), so a segment grows in order.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel

from atropos_cli.compat.tool_parsers.base import call_parts
from atropos_cli.env.multiturn import TokenTrace
from atropos_cli.inference.base import Choice
from atropos_cli.types import Message

__all__ = ["Drift", "HarnessRow", "SessionRecord", "clean_message"]

DriftKind = Literal["history_rewritten", "retokenized", "prompt_mismatch"]
_KEYS = ("role", "content", "tool_calls", "tool_call_id", "name")


class Drift(BaseModel):
    call: int
    """The call (1-based, in the order the session answered them) where it was seen."""
    kind: DriftKind
    detail: str


class HarnessRow(BaseModel):
    """One segment: a trainable row."""

    tokens: list[int]
    masks: list[int]
    logprobs: list[float] | None
    messages: list[Message]
    calls: int
    exact: bool
    """Every trained token is a sampled one (no reply of the segment was re-encoded)."""
    finish_reason: str | None


def clean_message(message: dict[str, Any]) -> Message:
    """The keys a chat template reads (role, content, tool_calls, tool_call_id, name), without the nulls OpenAI
    clients echo back (`refusal`, `audio`, `function_call`, ...)."""
    return {k: message[k] for k in _KEYS if k in message and (message[k] is not None or k == "content")}


def _same(sent: Message, known: Message) -> bool:
    """The harness's copy of a message equals ours: role, text, tool names + arguments, tool_call_id."""

    def key(m: Message) -> tuple[Any, ...]:
        calls = [call_parts(c) for c in m.get("tool_calls") or []]
        args = tuple((name, json.dumps(value, sort_keys=True)) for name, value in calls)
        return m.get("role"), m.get("content") or "", args, m.get("tool_call_id")

    return key(sent) == key(known)


@dataclass
class _Segment:
    trace: TokenTrace
    tools: list[dict[str, Any]] | None
    seen: list[Message]  # the conversation as the harness sees it: its messages and the replies returned
    calls: int = 0
    exact: bool = True
    finish_reason: str | None = None

    def extended_by(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> list[Message] | None:
        """The new messages when `messages` continues this segment (after its last reply), else None."""
        n = len(self.seen)
        if tools != self.tools or len(messages) <= n or not self.seen or self.seen[-1]["role"] != "assistant":
            return None
        if all(_same(a, b) for a, b in zip(messages[:n], self.seen, strict=True)):
            return messages[n:]
        return None


def _first_difference(messages: list[Message], seen: list[Message]) -> str:
    for i, (sent, known) in enumerate(zip(messages, seen, strict=False)):
        if not _same(sent, known):
            return f"message {i + 1} ({sent.get('role')}) differs from the session's copy"
    if len(messages) <= len(seen):
        return f"the chat has {len(messages)} messages, no more than the {len(seen)} already answered"
    return "the tools changed"


@dataclass
class Prepared:
    segment: _Segment
    prompt_ids: list[int]
    new_segment: bool
    mark: tuple[int, int, int]  # lengths before the call: seen messages, tokens, trace messages


@dataclass
class SessionRecord:
    """What one session recorded; `prepare` then `record` for each call (under `lock`)."""

    tokenizer: Any
    segments: list[_Segment] = field(default_factory=list)
    drift: list[Drift] = field(default_factory=list)
    calls: int = 0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def prepare(self, messages: list[Message], tools: list[dict[str, Any]] | None) -> Prepared:
        """The segment this call belongs to and the prompt ids to sample from (a new segment if it extends none).
        A chat the template cannot render raises ValueError and leaves the record as it was."""
        for segment in reversed(self.segments):
            new = segment.extended_by(messages, tools)
            if new is not None:
                trace = segment.trace
                mark = (len(segment.seen), len(trace.tokens), len(trace.messages))
                ids = trace.add_messages(new)
                segment.seen.extend(new)
                self.calls += 1
                return Prepared(segment, ids, False, mark)
        trace = TokenTrace(self.tokenizer, tools)
        ids = trace.start(messages)
        self.calls += 1
        if self.segments:
            detail = _first_difference(messages, self.segments[-1].seen)
            self._drift("history_rewritten", f"{detail}: a new segment starts (a row of its own)")
        segment = _Segment(trace, tools, list(messages))
        self.segments.append(segment)
        return Prepared(segment, ids, True, (0, 0, 0))

    def undo(self, call: Prepared) -> None:
        """Forget a call that got no reply (the backend failed): the harness may send it again."""
        self.drift = [d for d in self.drift if d.call != self.calls]
        self.calls -= 1
        segment = call.segment
        if call.new_segment:
            self.segments.remove(segment)
            return
        seen, tokens, messages = call.mark
        trace = segment.trace
        del segment.seen[seen:], trace.tokens[tokens:], trace.masks[tokens:], trace.messages[messages:]
        if trace.logprobs is not None:
            del trace.logprobs[tokens:]

    def record(self, segment: _Segment, sent: list[int], prompt_ids: list[int] | None, choice: Choice,
               reply: Message) -> None:  # fmt: skip
        """Append the sampled reply to its segment; drift when the backend's ids do not line up with ours."""
        if prompt_ids is not None and prompt_ids != sent:
            self._drift("prompt_mismatch", f"the backend answered {len(prompt_ids)} prompt ids for {len(sent)} sent")
        if choice.token_ids is None:
            segment.exact = False
            self._drift("retokenized", "the backend returned no completion token ids: the reply text was encoded")
        segment.trace.add_reply(choice.text, choice.token_ids, choice.logprobs, choice.finish_reason)
        segment.seen.append(reply)
        segment.calls += 1
        segment.finish_reason = choice.finish_reason

    def _drift(self, kind: DriftKind, detail: str) -> None:
        self.drift.append(Drift(call=self.calls, kind=kind, detail=detail))

    def rows(self) -> list[HarnessRow]:
        """One row per segment that has a reply."""
        return [
            HarnessRow(
                tokens=list(s.trace.tokens),
                masks=list(s.trace.masks),
                logprobs=list(s.trace.logprobs) if s.trace.logprobs is not None else None,
                messages=[dict(m) for m in s.seen],
                calls=s.calls,
                exact=s.exact,
                finish_reason=s.finish_reason,
            )  # fmt: skip
            for s in self.segments
            if s.calls
        ]

    def report(self) -> dict[str, Any]:
        """The session as JSON: calls, drift events, rows."""
        return {
            "calls": self.calls,
            "drift": [d.model_dump() for d in self.drift],
            "rows": [r.model_dump() for r in self.rows()],
        }
