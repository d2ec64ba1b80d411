"""How a chat message becomes plain text: parquet's derived `prompt`/`completion` columns and the HTML viewer.

Content may be a string, a list of OpenAI-style parts (`{"type": "text", "text": ...}`, images) or None (a
tool-call message); all of them become one readable string. Lone surrogates (torn bytes from a detokenizer)
become U+FFFD so the text can always be stored as UTF-8.
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["content_text", "split_completion", "render_chat", "clean_text"]


def clean_text(text: str) -> str:
    """`text`, with anything that cannot be encoded as UTF-8 replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


def _part_text(part: Any) -> str:
    if isinstance(part, str):
        return part
    if isinstance(part, dict):
        kind = part.get("type")
        if kind == "text" or "text" in part:
            return str(part.get("text", ""))
        if kind in ("image_url", "image", "input_image"):
            return "[image]"
        if kind in ("audio", "input_audio"):
            return "[audio]"
    return json.dumps(part, ensure_ascii=False, default=str)


def content_text(message: dict[str, Any]) -> str:
    """The text of one message's content (parts joined; a tool call shown as its JSON)."""
    content = message.get("content")
    if isinstance(content, str):
        text = content
    elif isinstance(content, list):
        text = "".join(_part_text(p) for p in content)
    elif content is None:
        calls = message.get("tool_calls")
        text = json.dumps(calls, ensure_ascii=False, default=str) if calls else ""
    else:
        text = json.dumps(content, ensure_ascii=False, default=str)
    return clean_text(text)


def split_completion(chat: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """(the messages before the last assistant message, that message); (chat, None) when there is none."""
    for index in range(len(chat) - 1, -1, -1):
        if chat[index].get("role") == "assistant":
            return chat[:index], chat[index]
    return chat, None


def render_chat(messages: list[dict[str, Any]]) -> str:
    """Messages as "role: content" paragraphs separated by blank lines."""
    return "\n\n".join(f"{m.get('role', '?')}: {content_text(m)}" for m in messages)
