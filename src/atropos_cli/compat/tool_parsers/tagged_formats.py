"""Tool-call formats built from special markers: deepseek_v3, deepseek_v3_1, qwen3_coder.

- deepseek_v3: `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\\n```json\\nARGS\\n```
  <｜tool▁call▁end｜>` (calls joined by a newline) `<｜tool▁calls▁end｜>`.
- deepseek_v3_1: `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>ARGS<｜tool▁call▁end｜>` inside the same outer markers.
- qwen3_coder: `<tool_call>\\n<function=NAME>\\n<parameter=KEY>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>`.
  Values are text: with the request's `tools`, a parameter's JSON-schema type converts it (string stays text,
  integer/number/boolean/object/array are read); without a schema, JSON, then Python's `True`/`False`/`None`
  (as the Qwen3-Coder template writes them), then the text. Rendering writes strings as they are,
  objects and lists as JSON, anything else as Python's `str`, as that template does.
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
    register_parser,
    tool_call,
)

__all__ = ["DeepSeekV3Parser", "DeepSeekV31Parser", "Qwen3CoderParser"]

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def _json_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


class _DeepSeek(ToolCallParser):
    PATTERN: re.Pattern[str]

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        if CALLS_BEGIN not in text:
            return text, None
        calls: list[dict[str, Any]] = []
        for name, arguments in self.PATTERN.findall(text):
            try:
                json.loads(arguments)
            except json.JSONDecodeError:
                return text, None
            calls.append(tool_call(len(calls), name.strip(), arguments.strip()))
        return (before(text, CALLS_BEGIN), calls) if calls else (text, None)

    def render(self, content: str | None, tool_calls: list[dict[str, Any]]) -> str:
        body = "\n".join(self._call(*call_parts(call)) for call in tool_calls)
        return (content or "") + CALLS_BEGIN + body + CALLS_END

    def _call(self, name: str, arguments: Any) -> str:
        raise NotImplementedError


@register_parser
class DeepSeekV3Parser(_DeepSeek):
    names = ("deepseek_v3",)
    PATTERN = re.compile(
        re.escape(CALL_BEGIN) + r".*?" + re.escape(SEP) + r"(.*?)\n```json\n(.*?)\n```" + re.escape(CALL_END), re.DOTALL
    )

    def _call(self, name: str, arguments: Any) -> str:
        return f"{CALL_BEGIN}function{SEP}{name}\n```json\n{_json_text(arguments)}\n```{CALL_END}"


@register_parser
class DeepSeekV31Parser(_DeepSeek):
    names = ("deepseek_v3_1",)
    PATTERN = re.compile(re.escape(CALL_BEGIN) + r"(.*?)" + re.escape(SEP) + r"(.*?)" + re.escape(CALL_END), re.DOTALL)

    def _call(self, name: str, arguments: Any) -> str:
        return f"{CALL_BEGIN}{name}{SEP}{_json_text(arguments)}{CALL_END}"


def _schema_types(tools: list[dict[str, Any]] | None, name: str) -> dict[str, str]:
    for tool in tools or []:
        function = tool.get("function", tool)
        if function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties") or {}
            return {key: str(spec.get("type", "")) for key, spec in properties.items() if isinstance(spec, dict)}
    return {}


PYTHON_WORDS: dict[str, Any] = {"True": True, "False": False, "None": None}


def _untyped(value: str) -> Any:
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return PYTHON_WORDS.get(value.strip(), value)


def _typed(value: str, kind: str) -> Any:
    if kind in ("string", "str", "text"):
        return value
    if value.strip().lower() == "null":
        return None
    try:
        if kind in ("integer", "int"):
            return int(value)
        if kind in ("number", "float"):
            number = float(value)
            return int(number) if number.is_integer() and "." not in value and "e" not in value.lower() else number
        if kind in ("boolean", "bool"):
            return {"true": True, "false": False}.get(value.strip().lower(), value)
    except ValueError:
        return value
    return _untyped(value)


@register_parser
class Qwen3CoderParser(ToolCallParser):
    names = ("qwen3_coder",)
    BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)$", re.DOTALL)
    FUNCTION = re.compile(r"<function=(.*?)</function>|<function=(.*)$", re.DOTALL)
    PARAMETER = re.compile(r"<parameter=(.*?)(?:</parameter>|(?=<parameter=)|(?=</function>)|$)", re.DOTALL)

    def parse(self, text: str, tools: list[dict[str, Any]] | None = None) -> ParseResult:
        if "<function=" not in text:
            return text, None
        blocks = [closed or unclosed for closed, unclosed in self.BLOCK.findall(text)] or [text]
        functions = [closed or unclosed for block in blocks for closed, unclosed in self.FUNCTION.findall(block)]
        calls: list[dict[str, Any]] = []
        for function in functions:
            if ">" not in function:
                return text, None
            name, body = function.split(">", 1)
            calls.append(tool_call(len(calls), name.strip(), self._arguments(name.strip(), body, tools)))
        marker = "<tool_call>" if "<tool_call>" in text else "<function="
        return (before(text, marker), calls) if calls else (text, None)

    def _arguments(self, name: str, body: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
        types, arguments = _schema_types(tools, name), dict[str, Any]()
        for parameter in self.PARAMETER.findall(body):
            if ">" not in parameter:
                continue
            key, value = parameter.split(">", 1)
            value = value.removeprefix("\n").removesuffix("\n")
            key = key.strip()
            arguments[key] = _typed(value, types[key]) if key in types else _untyped(value)
        return arguments

    def render(self, content: str | None, tool_calls: list[dict[str, Any]]) -> str:
        out = content or ""
        for call in tool_calls:
            name, arguments = call_parts(call)
            out += f"\n<tool_call>\n<function={name}>\n"
            for key, value in (arguments or {}).items():
                text = json.dumps(value, ensure_ascii=False) if isinstance(value, dict | list) else str(value)
                out += f"<parameter={key}>\n{text}\n</parameter>\n"
            out += "</function>\n</tool_call>"
        return out if content else out.removeprefix("\n")
