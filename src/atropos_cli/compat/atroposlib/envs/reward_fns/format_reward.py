"""atroposlib.envs.reward_fns.format_reward: `FormatReward` ("format"): 1.0 when a completion holds a
`<tag>...</tag>` block of any of `preferred_tags` (default think, answer; all of them with
`require_all_tags`), case-insensitive unless `case_sensitive`; the legacy function `format_reward`."""

from __future__ import annotations

import re
from typing import Any

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["FormatReward", "format_reward"]


@registry.register
class FormatReward(RewardFunction):
    def __init__(
        self,
        preferred_tags: list[str] | None = None,
        require_all_tags: bool = False,
        case_sensitive: bool = False,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.preferred_tags = preferred_tags or ["think", "answer"]
        self.require_all_tags = require_all_tags
        self.case_sensitive = case_sensitive

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        flags = re.DOTALL | (0 if self.case_sensitive else re.IGNORECASE)
        check = all if self.require_all_tags else any
        scores = []
        for completion in completions:
            content = self.get_content(completion)
            found = check(re.search(f"<{tag}>.*?</{tag}>", content, flags) for tag in self.preferred_tags)
            scores.append(1.0 if found else 0.0)
        return scores


def format_reward(completions: list[Any], preferred_tags: list[str] | None = None, **kwargs: Any) -> list[float]:
    return FormatReward(preferred_tags=preferred_tags).compute(completions, **kwargs)
