"""atroposlib.envs.reward_fns.accuracy_reward: `AccuracyReward` ("accuracy"): 1.0 when a completion's answer
equals the gold (`ground_truth=`, else `solution=`; one value or one per completion) by math-verify or, for a
numeric gold, numerically (see _math.verify_answer). With `split_on_think_tag` only the text after the last
`</think>` counts, and more than `max_boxed_threshold` `\\boxed` there scores 0.0. Needs math-verify."""

from __future__ import annotations

import logging
from typing import Any

import math_verify  # noqa: F401  (as in atroposlib, loading this reward without math-verify fails)

from atropos_cli.compat.atroposlib.envs.reward_fns._math import THINK_END, verify_answer
from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["AccuracyReward", "accuracy_reward"]

logger = logging.getLogger(__name__)


def golds(gold: Any, n: int) -> list[Any]:
    return gold if isinstance(gold, list) else [gold] * n


@registry.register
class AccuracyReward(RewardFunction):
    def __init__(
        self,
        tolerance: float = 1e-6,
        split_on_think_tag: bool = True,
        max_boxed_threshold: int = 6,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.tolerance = tolerance
        self.split_on_think_tag = split_on_think_tag
        self.max_boxed_threshold = max_boxed_threshold

    def compute(
        self, completions: list[Any], solution: Any = None, ground_truth: Any = None, **kwargs: Any
    ) -> list[float]:
        if solution is None and ground_truth is None:
            logger.warning("No solution or ground_truth provided to accuracy_reward")
            return [0.0] * len(completions)
        answers = golds(ground_truth if ground_truth is not None else solution, len(completions))
        return [self._score(completion, gold) for completion, gold in zip(completions, answers, strict=False)]

    def _score(self, completion: Any, gold: Any) -> float:
        try:
            content = self.get_content(completion)
            split = self.split_on_think_tag and THINK_END in content
            answer = content.split(THINK_END)[-1] if split else content
            if split and answer.count("\\boxed") > self.max_boxed_threshold:
                return 0.0
            return float(verify_answer(answer, gold, self.tolerance))
        except Exception as exc:
            logger.warning("Error in accuracy_reward: %s", exc)
            return 0.0


def accuracy_reward(
    completions: list[Any], solution: Any = None, ground_truth: Any = None, **kwargs: Any
) -> list[float]:
    return AccuracyReward().compute(completions, solution=solution, ground_truth=ground_truth, **kwargs)
