"""A fake-server rule that answers in the format a prompt asks for (for `atropos port`'s live check and tests).

`format_aware_answer(prompt, k)` reads the prompt's own format instructions and answers in them: a tool call
when the prompt lists tools, `\\boxed{}` when it asks for one, `<answer>` tags, `<think>` blocks, a letter for
multiple choice, else a short number. Answers alternate with `k` (the k-th request of that prompt), so a group
gets different answers and an env's scores can differ, as with a real model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

__all__ = ["format_aware_answer", "CountingRule", "FormatAwareRule"]

_TOOL_NAME = re.compile(r'"name"\s*:\s*"([A-Za-z_][\w.-]*)"')


def format_aware_answer(prompt: str, k: int) -> str:
    """The k-th answer to `prompt`, in the format the prompt asks for."""
    value = str(k % 3)
    think = "<think>Let me work through this step by step.</think>\n" if "<think>" in prompt else ""
    if "<tool_call>" in prompt or "<tools>" in prompt:
        tools = _TOOL_NAME.findall(prompt)
        if tools and k % 2 == 0:
            call = {"name": tools[0], "arguments": {}}
            return f"{think}<tool_call>\n{json.dumps(call)}\n</tool_call>"
        return f"{think}I can answer without a tool: {value}"
    if "\\boxed" in prompt:
        return f"{think}The answer is \\boxed{{{value}}}"
    if "<answer>" in prompt:
        return f"{think}<answer>{value}</answer>"
    if re.search(r"(^|\n)\s*\(?[A-D][).:]\s", prompt):
        return f"{think}The answer is {'ABCD'[k % 4]}"
    return f"{think}{value}"


class CountingRule:
    """A fake-server rule: `answer_fn(prompt, times this prompt was seen before)`, so answers depend only on the
    prompt and its count, whatever order concurrent requests arrive in."""

    def __init__(self, answer_fn: Callable[[str, int], str]) -> None:
        self.seen: dict[str, int] = {}
        self.answer_fn = answer_fn

    def __call__(self, prompt: str, _index: int) -> str:
        k = self.seen.get(prompt, 0)
        self.seen[prompt] = k + 1
        return self.answer_fn(prompt, k)


def FormatAwareRule() -> CountingRule:  # noqa: N802 - a rule factory, used like a class
    return CountingRule(format_aware_answer)
