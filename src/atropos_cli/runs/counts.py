"""`RolloutCounts`: what became of a run's rollouts, the one tally `process`, `evaluate`, `serve` and `train` share.

Every rollout ends in exactly one place: in a kept group (written, sent or trained on), as a failed rollout,
in a group that failed as a whole, or in a group dropped for a reason (`filtered`, by reason: the env's
"identical scores", serve's "too long" and "rejected by the API", train's "no token ids", ...). Nothing is
dropped without being counted here, and `summary()` is the line the commands print.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from atropos_cli.types import ScoredGroup

if TYPE_CHECKING:
    from atropos_cli.runs.rollout import GroupOutcome

__all__ = ["RolloutCounts"]


@dataclass
class RolloutCounts:
    groups: int = 0  # groups kept: written (process), sent and acknowledged (serve), handed to the trainer (train)
    rollouts: int = 0  # rollouts in the kept groups
    failed_rollouts: int = 0  # rollouts that raised; their group may still be kept, smaller
    failed_groups: int = 0  # items that produced no group at all
    filtered: dict[str, int] = field(default_factory=dict)  # groups dropped, by reason
    tokens_missing: int = 0  # kept groups without token ids (fine for viewing and sft-gen)
    scores: list[float] = field(default_factory=list)

    @property
    def filtered_groups(self) -> int:
        return sum(self.filtered.values())

    @property
    def mean_score(self) -> float | None:
        return statistics.fmean(self.scores) if self.scores else None

    def add(self, outcome: GroupOutcome) -> None:
        """Tally one item's outcome: its groups are kept, its failures and filtered groups counted."""
        self.add_failures(outcome)
        for group in outcome.groups:
            self.add_group(group)

    def add_failures(self, outcome: GroupOutcome) -> None:
        """Tally only what went wrong with an item (for callers that keep its groups later, e.g. on send)."""
        self.failed_rollouts += sum(1 for f in outcome.failures if f.kind == "rollout")
        self.failed_groups += int(outcome.failed)
        for failure in outcome.filtered:
            self.drop(failure.error)

    def add_group(self, group: ScoredGroup) -> None:
        self.groups += 1
        self.rollouts += group.size
        self.scores.extend(group.scores)
        self.tokens_missing += int(not group.has_tokens)

    def add_scores(self, scores: Sequence[float | None]) -> None:
        """Tally one item given as one score per rollout, None for a failed one (evaluate's samples)."""
        kept = [s for s in scores if s is not None]
        self.failed_rollouts += len(scores) - len(kept)
        if not kept:
            self.failed_groups += 1
            return
        self.groups += 1
        self.rollouts += len(kept)
        self.scores.extend(kept)

    def drop(self, reason: str, groups: int = 1) -> None:
        """Count `groups` groups dropped for `reason`."""
        self.filtered[reason] = self.filtered.get(reason, 0) + groups

    def summary(self) -> str:
        """`12 groups (48 rollouts, mean score 0.500; 2 rollouts failed, 1 group failed, 3 groups filtered:
        identical scores 2, too long 1)`: the kept groups, then every way a rollout was lost."""
        parts = [f"{self.rollouts} rollouts"]
        if self.mean_score is not None:
            parts[0] += f", mean score {self.mean_score:.3f}"
        lost = [f"{self.failed_rollouts} rollouts failed"]
        if self.failed_groups:
            lost.append(f"{self.failed_groups} groups failed")
        if self.filtered:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(self.filtered.items()))
            lost.append(f"{self.filtered_groups} groups filtered: {reasons}")
        return f"{self.groups} groups ({'; '.join([*parts, ', '.join(lost)])})"
