"""atroposlib.utils.tool_call_parser: hermes tool calls, `<tool_call>{"name": ..., "arguments": ...}</tool_call>`.

`parse_tool_call(text, tools, tags)` -> `(name, arguments, is_error)`; the name is "-ERROR-" when there is no
call, the JSON does not parse, or (given `tools`) the name is not one of them. Single quotes are read as
double quotes, as models often write them.
The per-model parsers a ManagedServer uses (`tool_parser=`) are atropos_cli.compat.tool_parsers.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["extract_tool_call", "parse_tool_call"]

ERROR = "-ERROR-"


def extract_tool_call(text: str, preferred_tags: list[str] | None = None) -> str | None:
    """The stripped content of the first `<tag>...</tag>` block, trying each tag in order."""
    for tag in preferred_tags or ["tool_call"]:
        found = re.findall(f"<{tag}>(.*?)</{tag}>", text, re.DOTALL)
        if found:
            return found[0].strip()
    return None


def _tool_names(tools: list[dict[str, Any]]) -> set[str]:
    names = set()
    for tool in tools:
        if isinstance(tool, dict):
            name = tool.get("name") or (tool.get("function") or {}).get("name")
            if name:
                names.add(name)
    return names


def _decode(content: str) -> dict[str, Any] | None:
    try:
        call = json.loads(content.replace("'", '"'), strict=False)
    except json.JSONDecodeError:
        return None
    return call if isinstance(call, dict) else None


def parse_tool_call(
    response: str, available_tools: list[dict[str, Any]] | None = None, preferred_tags: list[str] | None = None
) -> tuple[str, dict[str, Any], bool]:
    """Parse the first tool call of `response`."""
    content = extract_tool_call(response, preferred_tags)
    if not content:
        return ERROR, {}, True
    call = _decode(content)
    if call is None:
        return ERROR, {}, True
    name = call.get("name", "")
    arguments = call.get("arguments", {})
    if available_tools and name not in _tool_names(available_tools):
        return ERROR, arguments, True
    return name, arguments, False
