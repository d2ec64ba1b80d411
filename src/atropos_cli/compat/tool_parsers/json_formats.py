"""Tool-call formats whose calls are JSON objects: hermes/qwen, llama3_json/llama4_json, mistral.

- hermes (Hermes 2 Pro+, Qwen 2.5, ...): `<tool_call>\\n{"name": N, "arguments": {...}}\\n</tool_call>`, one
  block per call after the content; an unclosed last block (a generation cut at max_tokens) still parses.
- llama3_json (Llama 3.1-3.3, 4): `{"name": N, "parameters": {...}}` (or `"arguments"`), optionally after
  `<|python_tag|>`, several separated by `;`. Any JSON object in the text with a name and parameters is a call;
  other braces are prose.
- mistral: `[TOOL_CALLS]` then either a JSON list `[{"name": N, "arguments": {...}}, ...]` (tokenizers before
  v11) or `N{...}` per `[TOOL_CALLS]` (v11+); renders the JSON list.
"""

from __future__ import annotations

import json
import re
from typing import Any

from atropos_cli.compat.tool_parsers.base import (
    ParseResult,
    ToolCallParser,
    before,
    call_parts,
    prefix,
    register_parser,
    tool_call,
)

__all__ = ["HermesParser", "Llama3JsonParser", "MistralParser"]


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _objects(text: str) -> list[tuple[int, Any]]:
    """Every JSON value that starts at a `{` or `[` of `text` and decodes, with its start (outermost only)."""
    decoder, found, end = json.JSONDecoder(), [], -1
    for match in re.finditer(r"[{\[]", text):
        if match.start() < end:
            continue
        try:
            value, length = decoder.raw_decode(text[match.start() :])
        except json.JSONDecodeError:
            continue
        found.append((match.start(), value))
        end = match.start() + length
    return found


@register_parser
class HermesParser(ToolCallParser):
    names = ("hermes", "qwen")
    BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)$", re.DOTALL)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        if "<tool_call>" not in text:
            return text, None
        calls: list[dict[str, Any]] = []
        for closed, unclosed in self.BLOCK.findall(text):
            body = (closed or unclosed).strip()
            if not body:
                continue
            try:
                call = json.loads(body)
            except json.JSONDecodeError:
                return text, None
            if not isinstance(call, dict) or not call.get("name"):
                return text, None
            calls.append(tool_call(len(calls), call["name"], call.get("arguments", {})))
        return (before(text, "<tool_call>"), calls) if calls else (text, None)

    def render(self, content: str | None, tool_calls: list[dict[str, Any]]) -> str:
        blocks = []
        for call in tool_calls:
            name, arguments = call_parts(call)
            blocks.append(f"<tool_call>\n{_dumps({'name': name, 'arguments': arguments})}\n</tool_call>")
        return prefix(content) + "\n".join(blocks)


@register_parser
class Llama3JsonParser(ToolCallParser):
    names = ("llama3_json", "llama4_json")
    TAG = "<|python_tag|>"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        calls: list[dict[str, Any]] = []
        first = -1
        for start, value in _objects(text):
            if not isinstance(value, dict) or not value.get("name"):
                continue
            arguments = value.get("arguments", value.get("parameters"))
            if arguments is None:
                continue
            first = start if first < 0 else first
            calls.append(tool_call(len(calls), value["name"], arguments))
        if not calls:
            return text, None
        cut = text.find(self.TAG) if 0 <= text.find(self.TAG) < first else first
        return text[:cut].strip() or None, calls

    def render(self, content: str | None, tool_calls: list[dict[str, Any]]) -> str:
        rendered = []
        for call in tool_calls:
            name, arguments = call_parts(call)
            rendered.append(_dumps({"name": name, "parameters": arguments}))
        return prefix(content) + "; ".join(rendered)


@register_parser
class MistralParser(ToolCallParser):
    names = ("mistral",)
    TAG = "[TOOL_CALLS]"

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        if self.TAG not in text:
            return text, None
        head, *raw = text.split(self.TAG)
        first = raw[0].strip()
        parsed = self._json_list(first) if first.startswith(("[", "{")) else self._named(raw)
        return (head.strip() or None, parsed) if parsed else (text, None)

    @staticmethod
    def _json_list(raw: str) -> list[dict[str, Any]] | None:
        """Before v11: one JSON list (or object) of `{"name", "arguments"}`."""
        values = [v for _, v in _objects(raw)]
        entries = values[0] if len(values) == 1 and isinstance(values[0], list) else values
        calls: list[dict[str, Any]] = []
        for entry in entries:
            if not isinstance(entry, dict) or not entry.get("name"):
                return None
            calls.append(tool_call(len(calls), entry["name"], entry.get("arguments", {})))
        return calls or None

    @staticmethod
    def _named(raw: list[str]) -> list[dict[str, Any]] | None:
        """v11+: `NAME{arguments}` after each [TOOL_CALLS]."""
        calls: list[dict[str, Any]] = []
        for part in (p.strip() for p in raw):
            brace = part.find("{")
            if brace <= 0:
                return None
            try:
                arguments = json.loads(part[brace:])
            except json.JSONDecodeError:
                return None
            calls.append(tool_call(len(calls), part[:brace].strip(), arguments))
        return calls or None

    def render(self, content: str | None, tool_calls: list[dict[str, Any]]) -> str:
        entries = [dict(zip(("name", "arguments"), call_parts(call), strict=True)) for call in tool_calls]
        return (content or "") + self.TAG + _dumps(entries)
