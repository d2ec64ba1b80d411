"""atroposlib.envs.reward_fns.reasoning_steps_reward: `ReasoningStepsReward` ("reasoning_steps"): for each
pattern (numbered "Step N", "1." list lines, bullets, transition words), min(1, matches / min_steps) times
its weight (0.5, 0.5, 0.4, 0.3; `pattern_weights` overrides), plus `base_score` past `min_words` words,
capped at 1.0."""

from __future__ import annotations

import re
from typing import Any

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["ReasoningStepsReward", "reasoning_steps_reward"]

TRANSITIONS = (
    "First|Second|Third|Fourth|Fifth|Next|Then|Finally|Subsequently|Afterward|Lastly|Initially|To begin|"
    "Let\\'s begin|I\\'ll first|After that|In conclusion|Eventually|Subsequently|To solve|begin by|understand|"
    "analyze|apply|compute"
)
PATTERNS = {
    "numbered_steps": r"Step\s+\d+[\s:]+",
    "list_numbers": r"(?:^|\n)\s*\d+\.\s+",
    "bullet_points": r"(?:^|\n)\s*[\-\*•]\s+",
    "transition_words": rf"\b(?:{TRANSITIONS})\b",
}


@registry.register
class ReasoningStepsReward(RewardFunction):
    def __init__(
        self,
        min_words: int = 10,
        min_steps: int = 3,
        base_score: float = 0.1,
        pattern_weights: dict[str, float] | None = None,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.min_words = min_words
        self.min_steps = min_steps
        self.base_score = base_score
        self.pattern_weights = {
            "numbered_steps": 0.5,
            "list_numbers": 0.5,
            "bullet_points": 0.4,
            "transition_words": 0.3,
        }
        self.pattern_weights.update(pattern_weights or {})
        self.patterns = dict(PATTERNS)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for completion in completions:
            content = self.get_content(completion)
            score = 0.0
            for kind, pattern in self.patterns.items():
                matches = len(re.findall(pattern, content, re.IGNORECASE | re.MULTILINE))
                score += min(1.0, matches / self.min_steps) * self.pattern_weights.get(kind, 0.3)
            if len(content.split()) > self.min_words:
                score += self.base_score
            scores.append(min(1.0, score))
        return scores


def reasoning_steps_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return ReasoningStepsReward().compute(completions, **kwargs)
