"""atroposlib.envs.reward_fns.r1_reward: DeepSeek-R1-style rewards.

- `FormatReasoningReward` ("formatreasoning"): `reward_value` when the completion has one `<think>` block
  with content and a response after it (each requirement switchable), else 0.0.
- `AccuracyXReward` ("accuracyx"): `reward_value` when the solution is in (or, `exact_match`, equals) the
  response after the thinking block, case-insensitive unless `case_sensitive`.
- `R1Reward`: `format_weight * format + accuracy_weight * accuracy`.
Asked for by name, "r1" gives `AccuracyXReward` (the registry's atroposlib rule; see registry.py). Legacy
functions: `format_reasoning_reward` (0.5 per good format), `accuracy_reward`, `r1_reward`.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = [
    "parse_reasoning_response",
    "FormatReasoningReward",
    "AccuracyXReward",
    "R1Reward",
    "format_reasoning_reward",
    "accuracy_reward",
    "r1_reward",
]

logger = logging.getLogger(__name__)


def parse_reasoning_response(text: Any) -> dict[str, Any]:
    """{thinking_content, response, multiple_thinking} of a `<think>...</think>response` text."""
    if not isinstance(text, str):
        return {"thinking_content": "", "response": str(text), "multiple_thinking": False}
    if len(re.findall(r"<think>.*?</think>", text, re.DOTALL)) > 1:
        return {"thinking_content": "", "response": text, "multiple_thinking": True}
    found = re.search(r"<think>\s*(.*?)\s*</think>\s*(.*)", text, re.DOTALL)
    if not found:
        return {"thinking_content": "", "response": text, "multiple_thinking": False}
    return {"thinking_content": found.group(1).strip(), "response": found.group(2).strip(), "multiple_thinking": False}


def _parsed(reward: RewardFunction, completions: list[Any]) -> list[dict[str, Any]]:
    return [parse_reasoning_response(reward.get_content(completion)) for completion in completions]


@registry.register
class FormatReasoningReward(RewardFunction):
    def __init__(
        self,
        reward_value: float = 0.5,
        require_thinking: bool = True,
        require_response: bool = True,
        allow_multiple_thinking: bool = False,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.reward_value = reward_value
        self.require_thinking = require_thinking
        self.require_response = require_response
        self.allow_multiple_thinking = allow_multiple_thinking

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for parsed in _parsed(self, completions):
            bad = (
                (self.require_thinking and not parsed["thinking_content"])
                or (self.require_response and not parsed["response"])
                or (not self.allow_multiple_thinking and parsed["multiple_thinking"])
            )
            scores.append(0.0 if bad else self.reward_value)
        return scores


@registry.register
class AccuracyXReward(RewardFunction):
    def __init__(
        self,
        exact_match: bool = False,
        case_sensitive: bool = False,
        reward_value: float = 1.0,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.exact_match = exact_match
        self.case_sensitive = case_sensitive
        self.reward_value = reward_value

    def compute(self, completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
        if solution is None:
            logger.warning("No solution provided for accuracy reward")
            return [0.0] * len(completions)
        parsed = _parsed(self, completions)
        solutions = solution if isinstance(solution, list) else [solution] * len(parsed)
        return [self._score(p["response"], s) for p, s in zip(parsed, solutions, strict=False)]

    def _score(self, response: str, solution: Any) -> float:
        # a non-string solution is read like a completion (atroposlib: a number becomes "", found everywhere)
        wanted = solution if isinstance(solution, str) else self.get_content(solution)
        if not self.case_sensitive:
            wanted, response = wanted.lower(), response.lower()
        found = response == wanted if self.exact_match else wanted in response
        return self.reward_value if found else 0.0


@registry.register
class R1Reward(RewardFunction):
    def __init__(self, format_weight: float = 0.5, accuracy_weight: float = 1.0, weight: float = 1.0, **kwargs: Any):
        super().__init__(weight=weight, **kwargs)
        self.format_weight = format_weight
        self.accuracy_weight = accuracy_weight
        self.format_reward_fn = FormatReasoningReward(reward_value=1.0, weight=1.0)
        self.accuracy_reward_fn = AccuracyXReward(reward_value=1.0, weight=1.0)

    def compute(self, completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
        try:
            formats = self.format_reward_fn.compute(completions, **kwargs)
            accuracy = self.accuracy_reward_fn.compute(completions, solution=solution, **kwargs)
        except Exception as exc:
            logger.error("Error in r1_reward: %s", exc)
            return [0.0] * len(completions)
        return [f * self.format_weight + a * self.accuracy_weight for f, a in zip(formats, accuracy, strict=False)]


def format_reasoning_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return FormatReasoningReward(reward_value=0.5).compute(completions, **kwargs)


def accuracy_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    return AccuracyXReward().compute(completions, solution=solution, **kwargs)


def r1_reward(completions: list[Any], solution: Any, **kwargs: Any) -> list[float]:
    return R1Reward().compute(completions, solution=solution, **kwargs)
