"""atroposlib.utils.message_history_utils: keep `<think>` blocks from filling a multi-turn history.

- `strip_thinking(text)`: drop the first `<think>...</think>` block.
- `truncate_thinking(text, tokenizer, max_think_tokens)`: keep at most the last `max_think_tokens` tokens of it.
- `ensure_trajectory_token_limit(trajectory, tokenizer, max_trajectory_tokens)`: drop the steps (groups) whose
  longest sequence is over the limit. (atroposlib first tries to cut older turns from every alternative of a
  step; here such a step is dropped whole, so nothing over the limit reaches the trainer either way.)
"""

from __future__ import annotations

from typing import Any

__all__ = ["strip_thinking", "truncate_thinking", "ensure_trajectory_token_limit"]

OPEN, CLOSE = "<think>", "</think>"


def strip_thinking(response_text: str) -> str:
    start, end = response_text.find(OPEN), response_text.find(CLOSE)
    if start == -1 or end == -1:
        return response_text
    return response_text[:start] + response_text[end + len(CLOSE) :]


def truncate_thinking(response_text: str, tokenizer: Any, max_think_tokens: int) -> str:
    start, end = response_text.find(OPEN), response_text.find(CLOSE)
    if start == -1 or end == -1:
        return response_text
    inner = response_text[start + len(OPEN) : end]
    ids = tokenizer.encode(inner, add_special_tokens=False)
    if len(ids) <= max_think_tokens:
        return response_text
    kept = tokenizer.decode(ids[-max_think_tokens:]) if max_think_tokens > 0 else ""
    return response_text[:start] + OPEN + kept + response_text[end:]


def ensure_trajectory_token_limit(trajectory: list[Any], tokenizer: Any, max_trajectory_tokens: int) -> list[Any]:
    kept = []
    for step in trajectory or []:
        if step and all(len(tokens) <= max_trajectory_tokens for tokens in step.get("tokens", [])):
            kept.append(step)
    return kept
