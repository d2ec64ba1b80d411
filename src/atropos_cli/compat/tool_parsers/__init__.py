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

from atropos_cli.compat.tool_parsers import json_formats, tagged_formats  # noqa: F401  (they register)
from atropos_cli.compat.tool_parsers.base import ParseResult, ToolCallParser, get_parser, list_parsers, register_parser

__all__ = ["ToolCallParser", "ParseResult", "get_parser", "list_parsers", "register_parser"]
