"""atroposlib.envs.reward_fns.combined_reward: `CombinedReward` ("combined"), the sum of several rewards.

Each sub-reward (a name or a config dict, built by the registry) contributes its raw `compute` scores (its
own weight is not applied); a sub-reward that raises is logged and left out. `normalization`: "none", "sum"
(divide by the sum of the sub-rewards' weights) or "minmax" (rescale the batch to [0, 1]).
"""

from __future__ import annotations

import logging
from typing import Any

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["CombinedReward"]

logger = logging.getLogger(__name__)


@registry.register
class CombinedReward(RewardFunction):
    def __init__(
        self, rewards: list[str | dict[str, Any]], normalization: str = "none", weight: float = 1.0, **kwargs: Any
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.normalization = normalization
        self.reward_functions = [registry.create(reward) for reward in rewards]

    @property
    def name(self) -> str:
        return f"combined({','.join(r.name for r in self.reward_functions)})"

    def set_wandb_logger(self, logger: Any) -> None:
        super().set_wandb_logger(logger)
        for reward in self.reward_functions:
            reward.set_wandb_logger(logger)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        if not completions:
            return []
        total = [0.0] * len(completions)
        for reward in self.reward_functions:
            try:
                scores = reward.compute(completions, **kwargs)
            except Exception as exc:
                logger.error("Error computing reward for %s: %s", reward.name, exc, exc_info=True)
                continue
            for i, score in enumerate(scores):
                total[i] += score
        if self.normalization == "sum":
            weights = sum(r.weight for r in self.reward_functions)
            if weights > 0:
                total = [t / weights for t in total]
        elif self.normalization == "minmax" and max(total) > min(total):
            low, high = min(total), max(total)
            total = [(t - low) / (high - low) for t in total]
        return total
