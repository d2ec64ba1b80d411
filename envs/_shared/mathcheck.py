"""Checking a math answer with math-verify: `\\boxed{}` answers, LaTeX, and plain numbers.

The completion's candidate is its last `\\boxed{}` when it has one, else its last number; the gold answer is
parsed the same way. `math_verify` (the `envs` extra) is imported on first use, so `atropos envs` and the
procedural envs never load it.
"""

from __future__ import annotations

import threading
from typing import Any

from atropos_cli.errors import ConfigError
from atropos_cli.quiet import log_once

from .answers import last_boxed, last_number, strip_think

__all__ = ["answers_match", "candidate_answer"]


def _math_verify() -> Any:
    try:
        import math_verify
    except ImportError:
        raise ConfigError(
            "the gsm8k/math envs need the `math-verify` package",
            hint='pip install "atropos[envs]"',
        ) from None
    for module in ("math_verify.parser", "math_verify.grader"):  # they warn on every call off the main thread
        log_once(module, "Timeout is disabled")
    return math_verify


def candidate_answer(completion: str) -> str | None:
    """The text math-verify should read: the last `\\boxed{}` content, else the last number."""
    text = strip_think(completion)
    boxed = last_boxed(text)
    if boxed is not None:
        return boxed
    return last_number(text)


def answers_match(completion: str, gold: str) -> bool:
    """True when the completion's final answer is mathematically equal to `gold`."""
    candidate = candidate_answer(completion)
    if candidate is None:
        return False
    mv = _math_verify()
    # math-verify's timeouts use signal.alarm, which only works on the main thread; elsewhere run without.
    timeout = 5 if threading.current_thread() is threading.main_thread() else None

    def parse(text: str) -> Any:
        # `$...$`-wrapped LaTeX parses most reliably; plain numbers parse either way.
        return mv.parse(f"${text}$", parsing_timeout=timeout) or mv.parse(text, parsing_timeout=timeout)

    gold_parsed, answer_parsed = parse(gold), parse(candidate)
    if not gold_parsed or not answer_parsed:
        return candidate.strip() == gold.strip()
    return bool(mv.verify(gold_parsed, answer_parsed, timeout_seconds=timeout))
