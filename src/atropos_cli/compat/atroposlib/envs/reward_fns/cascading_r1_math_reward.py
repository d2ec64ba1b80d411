"""atroposlib.envs.reward_fns.cascading_r1_math_reward: `cascading_r1_math_reward(completions, solution)`
("cascading_r1_math", a function, wrapped by the registry): math accuracy (as accuracy_reward, text after the
last `</think>`, over 6 `\\boxed` scores 0) plus a format bonus of 0.5 for `<think>...</think>answer` (no other
tags) that only a correct answer earns. Completions here are read more loosely than RewardFunction does: a
dict's `content` whatever its role, a list's first message. Needs math-verify."""

from __future__ import annotations

import logging
import re
from typing import Any

import math_verify  # noqa: F401  (as in atroposlib, loading this reward without math-verify fails)

from atropos_cli.compat.atroposlib.envs.reward_fns._math import THINK_END, verify_answer

__all__ = ["cascading_r1_math_reward", "accuracy_reward", "format_reward", "get_completion_content"]

logger = logging.getLogger(__name__)


def get_completion_content(completion: Any) -> str:
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        if "content" in completion:
            return completion["content"]
        if isinstance(completion.get("message", {}), dict):
            return completion["message"].get("content", "")
    if isinstance(completion, list) and completion and isinstance(completion[0], dict) and "content" in completion[0]:
        return completion[0]["content"]
    return str(completion)


def format_reward(completions: list[Any], reward_value: float = 0.5, **kwargs: Any) -> list[float]:
    try:
        contents = [get_completion_content(c) for c in completions]
    except Exception:
        return [0.0] * len(completions)
    return [reward_value if re.match(r"^<think>[^<]*</think>[^<]*$", c, re.DOTALL) else 0.0 for c in contents]


def accuracy_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    golds = solution if isinstance(solution, list) else [solution] * len(completions)
    scores = []
    for completion, gold in zip(completions, golds, strict=False):
        try:
            content = get_completion_content(completion)
            answer = content.split(THINK_END)[-1] if THINK_END in content else content
            too_many = THINK_END in content and answer.count("\\boxed") > 6
            scores.append(0.0 if too_many else float(verify_answer(answer, gold)))
        except Exception as exc:
            logger.error("Error in accuracy_reward: %s", exc)
            scores.append(0.0)
    return scores


def cascading_r1_math_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    try:
        accuracy = accuracy_reward(completions, solution, **kwargs)
        formats = format_reward(completions)
    except Exception:
        return [0.0] * len(completions)
    return [a + (f if a > 0 else 0.0) for a, f in zip(accuracy, formats, strict=False)]
