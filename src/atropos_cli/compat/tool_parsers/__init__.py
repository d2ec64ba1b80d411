"""Tool-call parsers: a model family's raw tool-call text <-> OpenAI `tool_calls`, both ways.

The parsers Atropos (through vLLM's, by name) and its successor's `environments/tool_call_parsers` shipped,
written here from their documented formats: `hermes` (and `qwen`, the same format), `llama3_json` (and
`llama4_json`), `mistral`, `deepseek_v3`, `deepseek_v3_1`, `qwen3_coder`. `get_parser(name)` gives one;
`list_parsers()` names them.

- `parse(text, tools=None)` -> `(content, tool_calls)`: content is the text before the first call (None when
  empty), tool_calls a list of OpenAI entries `{"id", "type": "function", "function": {"name", "arguments"}}`
  with `arguments` a JSON string, or None when the text has no call. As vLLM's parsers do, a call that does not
  parse makes the whole text plain content (no partial list). Ids are `call_0`, `call_1`, ... (deterministic,
  so two runs of one env give the same groups).
- `render(content, tool_calls)` -> the raw text the model would have written (what a chat template puts in
  an assistant turn); `parse(render(c, calls))` gives back `c` and the same names and arguments (tested).
"""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from atropos_cli.errors import ConfigError

__all__ = ["ToolCallParser", "ParseResult", "get_parser", "list_parsers", "register_parser", "tool_call"]

ParseResult = tuple[str | None, list[dict[str, Any]] | None]


class ToolCallParser(ABC):
    """One model family's tool-call format."""

    names: ClassVar[tuple[str, ...]] = ()

    @abstractmethod
    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        """(content before the calls or None, the calls or None); unparseable calls -> (text, None)."""

    @abstractmethod
    def render(self, content: str | None, tool_calls: list[dict[str, Any]]) -> str:
        """The raw text of an assistant turn with `content` then `tool_calls`."""


_PARSERS: dict[str, type[ToolCallParser]] = {}


def register_parser(cls: type[ToolCallParser]) -> type[ToolCallParser]:
    for name in cls.names:
        _PARSERS[name] = cls
    return cls


def list_parsers() -> list[str]:
    _load()
    return sorted(_PARSERS)


def get_parser(name: str) -> ToolCallParser:
    _load()
    if name not in _PARSERS:
        raise ConfigError(
            f"unknown tool-call parser {name!r}",
            hint=f"use one of: {', '.join(sorted(_PARSERS))}",
        )
    return _PARSERS[name]()


def _load() -> None:
    from atropos_cli.compat.tool_parsers import json_formats, tagged_formats  # noqa: F401  (they register)


def tool_call(index: int, name: str, arguments: Any) -> dict[str, Any]:
    """An OpenAI `tool_calls` entry; `arguments` (dict or JSON string) becomes a JSON string."""
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return {"id": f"call_{index}", "type": "function", "function": {"name": name, "arguments": arguments}}


def call_parts(call: dict[str, Any]) -> tuple[str, Any]:
    """(name, arguments as a Python value) of an OpenAI entry or a bare `{"name", "arguments"}` dict."""
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(json.JSONDecodeError):
            arguments = json.loads(arguments)
    return function.get("name", ""), arguments


def before(text: str, marker: str) -> str | None:
    """The stripped text before `marker`, None when empty."""
    head = text[: text.find(marker)].strip() if marker in text else text.strip()
    return head or None


def prefix(content: str | None) -> str:
    return f"{content}\n" if content else ""
