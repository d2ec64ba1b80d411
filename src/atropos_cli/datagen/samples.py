"""Rollouts as text for the datasets: a chat split into prompt and completion turns, or token ids decoded.

`Sample` is one rollout's text, `Provenance` where its group came from (file or API, group id, env, model,
item). `datagen.select` turns groups into rows through these; `formats.dataset` writes them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from atropos_cli.tokens import MASKED
from atropos_cli.types import Message, ScoredGroup

__all__ = ["Provenance", "Sample", "Sourced", "decode_sample", "provenance_of", "split_messages"]


class Sourced(Protocol):
    """A group with where it came from (readers' `SourcedGroup` and the API source both fit)."""

    source: str
    index: int
    group: ScoredGroup


@dataclass(slots=True, frozen=True)
class Provenance:
    source: str
    group_id: str
    env: str | None
    model: str | None
    item_id: str | None


@dataclass(slots=True)
class Sample:
    """One rollout as text: the prompt turns and the completion turns, each message `{role, content}`."""

    prompt: list[Message]
    completion: list[Message]
    # Set when the text was decoded from token ids: Atropos' legacy text records use it verbatim.
    prompt_text: str | None = None
    completion_text: str | None = None

    def text_pair(self) -> tuple[str, str]:
        """(prefix, completion) strings for Atropos' legacy text records."""
        if self.prompt_text is not None and self.completion_text is not None:
            return self.prompt_text, self.completion_text
        return _join(self.prompt), _join(self.completion)


def _join(messages: list[Message]) -> str:
    return "\n\n".join(str(m["content"]) for m in messages)


def split_messages(messages: list[Message]) -> tuple[list[Message], list[Message]]:
    """Split a chat into (prompt, completion): the completion is everything after the last user turn.

    Normalises each message to `{role, content}` with string content; raises ValueError when the chat has no
    completion or a message is not plain text (those rollouts are counted as unparseable).
    """
    normal: list[Message] = []
    last_user = -1
    for i, message in enumerate(messages):
        content, role = message.get("content"), message.get("role")
        if content.__class__ is not str:
            raise ValueError(f"message {i} has non-text content ({type(content).__name__})")
        if len(message) != 2 or role.__class__ is not str:
            # Keep only role/content (fixed output schema); a plain {role, content} dict is reused as is.
            message = {"role": str(role), "content": content}
        normal.append(message)
        if role == "user":
            last_user = i
    if last_user < 0:
        # No user turn: the prompt is whatever precedes the first assistant turn (e.g. system-only prompts).
        last_user = next((i - 1 for i, m in enumerate(normal) if m["role"] == "assistant"), len(normal) - 1)
    prompt, completion = normal[: last_user + 1], normal[last_user + 1 :]
    if not completion:
        raise ValueError("the chat has no turn after the last user message")
    return prompt, completion


def decode_sample(group: ScoredGroup, i: int, tokenizer: Any) -> Sample:
    """Decode a tokens-only rollout: the untrained prefix (mask -100) is the prompt, the rest the completion."""
    tokens, mask = group.tokens[i], group.masks[i]
    cut = next((j for j, m in enumerate(mask) if m != MASKED), len(mask))
    if cut == len(tokens):
        raise ValueError("no trained (unmasked) tokens to use as the completion")
    prompt_raw = tokenizer.decode(tokens[:cut], skip_special_tokens=False)
    completion_raw = tokenizer.decode(tokens[cut:], skip_special_tokens=False)
    prompt = tokenizer.decode(tokens[:cut], skip_special_tokens=True).strip()
    completion = tokenizer.decode(tokens[cut:], skip_special_tokens=True).strip()
    return Sample(
        prompt=[{"role": "user", "content": prompt}],
        completion=[{"role": "assistant", "content": completion}],
        prompt_text=prompt_raw,
        completion_text=completion_raw,
    )


def provenance_of(item: Sourced) -> Provenance:
    meta = item.group.meta
    if meta is None:
        return Provenance(item.source, f"{item.source}:{item.index}", None, None, None)
    group_id = meta.group_id or f"{item.source}:{item.index}"
    return Provenance(item.source, group_id, meta.env, meta.model, meta.item_id)
