"""atroposlib.envs.reward_fns.crossword_format_reward: `CrosswordFormatReward` ("crossword_format"):
`reward_value` when the completion has `N-Across: WORD` / `N-Down: WORD` answers (any of `format_patterns`)
and, with `penalize_invalid_chars`, every answer's letters are in `valid_chars`."""

from __future__ import annotations

import re
from typing import Any

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["CrosswordFormatReward", "crossword_format_reward"]


@registry.register
class CrosswordFormatReward(RewardFunction):
    def __init__(
        self,
        format_patterns: list[re.Pattern[str]] | None = None,
        reward_value: float = 1.0,
        penalize_invalid_chars: bool = True,
        valid_chars: str = "ABCDEFGHIJKLMNOPQRSTUVWXYZ",
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.reward_value = reward_value
        self.penalize_invalid_chars = penalize_invalid_chars
        self.valid_chars = valid_chars.upper()
        self.format_patterns = format_patterns or [
            re.compile(r"\d+-(?:Across|Down):\s+[A-Z\s]+", re.IGNORECASE),
            re.compile(r"^(?:\d+-(?:Across|Down):\s+[A-Z\s]+[\s,]*)+$", re.IGNORECASE),
        ]

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for completion in completions:
            content = self.get_content(completion)
            formatted = any(pattern.search(content) for pattern in self.format_patterns)
            answers = re.findall(r"(?:Across|Down):\s+([A-Za-z]+)", content, re.IGNORECASE)
            valid = not self.penalize_invalid_chars or all(
                c.upper() in self.valid_chars for answer in answers for c in answer
            )
            scores.append(self.reward_value if formatted and valid else 0.0)
        return scores


def crossword_format_reward(completions: list[Any], **kwargs: Any) -> list[float]:
    return CrosswordFormatReward().compute(completions, **kwargs)
