"""Pulling the final answer out of a completion: `\\boxed{...}`, `<answer>...</answer>`, `#### N`, last number.

math-verify does the equivalence check for gsm8k/math; these helpers only find the candidate text, so the
procedural envs (letter counting, text reversal, reasoning gym) stay free of heavy imports.
"""

from __future__ import annotations

import re

__all__ = ["last_boxed", "answer_tag", "last_number", "strip_think"]

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_THINK = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)


def strip_think(text: str) -> str:
    """Drop `<think>...</think>` blocks so reasoning is not mistaken for the answer."""
    return _THINK.sub("", text)


def last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}` (balanced braces), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def answer_tag(text: str) -> str | None:
    """Content of the last `<answer>...</answer>`, stripped, or None."""
    found = _ANSWER_TAG.findall(text)
    return found[-1].strip() if found else None


def last_number(text: str) -> str | None:
    """The last number in the text with thousands separators removed ("1,234.5" -> "1234.5"), or None."""
    found = _NUMBER.findall(text)
    return found[-1].replace(",", "") if found else None
