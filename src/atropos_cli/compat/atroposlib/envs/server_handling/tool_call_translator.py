"""atroposlib.envs.server_handling.tool_call_translator: `ToolCallTranslator`, raw model text <-> OpenAI
`tool_calls` for one parser (`hermes`, `qwen`, `llama3_json`, `llama4_json`, `mistral`, `deepseek_v3`,
`deepseek_v3_1`, `qwen3_coder`: atropos_cli.compat.tool_parsers).

atroposlib 0.4.0 uses vLLM's parsers here (and parses nothing without vLLM installed); ours need no vLLM. As
atroposlib does: outbound, `parse_model_output` gives (content, tool_calls, finish_reason) and remembers
each call id's raw text; inbound, `convert_messages_for_template` turns an assistant message with
`tool_calls` back into the exact raw text it came from (else the parser's rendering of the calls after the
content), so a multi-turn prompt re-renders the tokens the model produced. An unknown parser name is a
ConfigError naming the known ones. Call ids are `call_0`, `call_1`, ... in the order this translator
parsed them (atroposlib's are random), unique within it.
"""

from __future__ import annotations

from typing import Any

from atropos_cli.compat.tool_parsers import get_parser

__all__ = ["ToolCallTranslator"]


class ToolCallTranslator:
    def __init__(self, tokenizer: Any, parser_name: str = "hermes") -> None:
        self.tokenizer = tokenizer
        self.parser_name = parser_name
        self.parser = get_parser(parser_name)
        self.call_id_to_raw_text: dict[str, str] = {}

    def parse_model_output(
        self, raw_text: str, tool_choice: str | None = None, tools: list[dict] | None = None
    ) -> tuple[str | None, list[dict[str, Any]] | None, str]:
        """(content, tool_calls or None, "tool_calls" | "stop"); no tools or tool_choice "none": the raw text."""
        if tool_choice == "none" or not tools:
            return raw_text, None, "stop"
        content, calls = self.parser.parse(raw_text, tools)
        if not calls:
            return raw_text, None, "stop"
        for call in calls:  # ids unique within this translator, so each maps back to its own raw text
            call["id"] = f"call_{len(self.call_id_to_raw_text)}"
            self.call_id_to_raw_text[call["id"]] = raw_text
        return content, calls, "tool_calls"

    def reconstruct_raw_text_from_tool_calls(self, tool_calls: list[dict]) -> str:
        if not tool_calls:
            return ""
        raw = self.call_id_to_raw_text.get(tool_calls[0].get("id", ""))
        return raw if raw is not None else self.parser.render(None, tool_calls)

    def convert_messages_for_template(self, messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
        converted = []
        for message in messages:
            calls = message.get("tool_calls") if message.get("role") == "assistant" else None
            if not calls:
                converted.append(message)
                continue
            raw = self.call_id_to_raw_text.get(calls[0].get("id", ""))
            text = raw if raw is not None else self.parser.render(message.get("content") or None, calls)
            converted.append({"role": "assistant", "content": text})
        return converted

    def decode_with_tool_awareness(self, token_ids: list[int], has_tools: bool = False) -> str:
        """Decoded text; special tokens kept while tools are active (some tokenizers make the tags special)."""
        return self.tokenizer.decode(token_ids, skip_special_tokens=not has_tools)
