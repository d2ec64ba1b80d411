"""atroposlib.envs.reward_fns.reward_function: `RewardFunction`, the base of every registered reward.

`fn(completions, **context)` calls `compute`, multiplies each score by `weight` and, when a W&B logger was
set (`set_wandb_logger`), logs `reward/<name>/{mean_raw,mean_weighted,min,max}`. As in atroposlib, an
exception in any of that is logged and scores every completion 0.0. `get_content` reads a completion given
as a string, an assistant message, `{"message": assistant message}` or a list of messages (its first
assistant message); anything else is "".
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from typing import Any

__all__ = ["RewardFunction"]

logger = logging.getLogger(__name__)


def _assistant_content(message: Any) -> str | None:
    if isinstance(message, dict) and message.get("role") == "assistant" and "content" in message:
        return message["content"]
    return None


class RewardFunction(ABC):
    def __init__(self, weight: float = 1.0, name: str | None = None, **kwargs: Any) -> None:
        self.weight = weight
        self._name = name
        self.config = kwargs
        self.wandb_logger: Any = None

    @property
    def name(self) -> str:
        return self._name or type(self).__name__.lower()

    @abstractmethod
    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        """One raw score per completion."""

    def __call__(self, completions: list[Any], **kwargs: Any) -> list[float]:
        try:  # as in atroposlib, anything failing here (a subclass that skipped __init__ included) scores 0.0
            raw = self.compute(completions, **kwargs)
            weighted = [r * self.weight for r in raw]
            if self.wandb_logger:
                self.log_metrics(raw, weighted)
            return weighted
        except Exception as exc:
            logger.error("Error in reward function %s: %s", getattr(self, "_name", None) or type(self).__name__, exc)
            return [0.0] * len(completions)

    def set_wandb_logger(self, logger: Any) -> None:
        self.wandb_logger = logger

    def log_metrics(self, raw_rewards: list[float], weighted_rewards: list[float]) -> None:
        if not self.wandb_logger or not raw_rewards:
            return
        prefix = f"reward/{self.name}"
        self.wandb_logger.log(
            {
                f"{prefix}/mean_raw": sum(raw_rewards) / len(raw_rewards),
                f"{prefix}/mean_weighted": sum(weighted_rewards) / len(weighted_rewards),
                f"{prefix}/min": min(raw_rewards),
                f"{prefix}/max": max(raw_rewards),
            }
        )

    @staticmethod
    def get_content(completion: Any) -> str:
        if isinstance(completion, str):
            return completion
        if isinstance(completion, dict):
            found = _assistant_content(completion)
            if found is None and isinstance(completion.get("message"), dict):
                found = _assistant_content(completion["message"])
            return found if found is not None else ""
        if isinstance(completion, list):
            for message in completion:
                found = _assistant_content(message)
                if found is not None:
                    return found
        return ""
