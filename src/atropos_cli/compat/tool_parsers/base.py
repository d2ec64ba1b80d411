"""The tool-call parser contract (`ToolCallParser`: parse + render), the registry, and the helpers the
formats share. See the package docstring."""

from __future__ import annotations

import contextlib
import json
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from atropos_cli.errors import ConfigError

__all__ = [
    "ToolCallParser",
    "ParseResult",
    "get_parser",
    "list_parsers",
    "register_parser",
    "tool_call",
    "call_parts",
    "before",
    "prefix",
]

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
    return sorted(_PARSERS)


def get_parser(name: str) -> ToolCallParser:
    if name not in _PARSERS:
        raise ConfigError(
            f"unknown tool-call parser {name!r}",
            hint=f"use one of: {', '.join(sorted(_PARSERS))}",
        )
    return _PARSERS[name]()


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
