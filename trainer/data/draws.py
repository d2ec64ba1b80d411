"""A step's draw from the env: the groups to train and what the draw dropped, and the bound on draws in a row
that leave nothing to train.

Where it sits: `rollouts.EnvRollouts` yields one `Draw` a step (its share of the step's items); the many-rank
sources join the ranks' or engines' draws (`Draw.joined`); `grpo.train` puts each draw's counts in the step's
metrics (`groups_filtered`, `groups_failed`) and `EmptyDraws` stops the run with one line once
`--max-empty-draws` draws in a row had nothing to train on (every group filtered by the env, failed, or without
reward signal): such a run would never take a step, since only trained steps count towards --steps.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from atropos_cli.errors import EmptyDrawsError
from atropos_cli.types import ScoredGroup

__all__ = ["Draw", "draw_metrics", "EmptyDraws"]


class Draw(list[ScoredGroup]):
    """The groups of one step's draw (a list, so every batch consumer takes it as it is) with the groups the
    env dropped on the way, by reason (`filtered`: "identical scores", "collect_trajectories returned None",
    ...) and the items that produced no group (`failed`). Pickles with its counts (gloo messages)."""

    def __init__(
        self, groups: Iterable[ScoredGroup] = (), filtered: dict[str, int] | None = None, failed: int = 0
    ) -> None:
        super().__init__(groups)
        self.filtered: dict[str, int] = dict(filtered or {})
        self.failed = failed

    @classmethod
    def joined(cls, parts: Iterable[list[ScoredGroup]]) -> Draw:
        """The ranks' (or engines') draws of one step as one, in order, their counts summed."""
        draw = cls()
        for part in parts:
            draw.extend(part)
            draw.add_counts(part)
        return draw

    def drop(self, reason: str, groups: int = 1) -> None:
        """Count `groups` groups dropped for `reason`."""
        self.filtered[reason] = self.filtered.get(reason, 0) + groups

    def add_counts(self, other: list[ScoredGroup]) -> None:
        """Add `other`'s counts (if it is a Draw) to this draw's."""
        for reason, n in getattr(other, "filtered", {}).items():
            self.drop(reason, n)
        self.failed += getattr(other, "failed", 0)

    def kept(self, groups: Iterable[ScoredGroup]) -> Draw:
        """`groups` (a subset of this draw's) with this draw's counts."""
        draw = Draw(groups)
        draw.add_counts(self)
        return draw


def draw_metrics(batch: list[ScoredGroup]) -> dict[str, int]:
    """The step's `groups_filtered` and `groups_failed` (0 for a batch that is not a Draw: files, the API)."""
    filtered = getattr(batch, "filtered", {})
    return {"groups_filtered": sum(filtered.values()), "groups_failed": getattr(batch, "failed", 0)}


class EmptyDraws:
    """Counts the draws in a row that left nothing to train on; past `limit` (None: never) the run stops."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self.streak = 0
        self.dropped = Draw()  # the streak's counts
        self.unsignalled = 0

    def see(self, batch: list[ScoredGroup], metrics: dict[str, Any]) -> None:
        """One draw and its step's metrics (`skipped`: no step was taken); sets metrics' `empty_draws`."""
        if not metrics.get("skipped"):
            self.streak, self.dropped, self.unsignalled = 0, Draw(), 0
            return
        self.streak += 1
        self.dropped.add_counts(batch)
        self.unsignalled += len(batch)
        metrics["empty_draws"] = self.streak

    def check(self) -> None:
        """Raise once `limit` draws in a row had nothing to train on, saying what became of their groups."""
        if self.limit is None or self.streak < self.limit:
            return
        raise EmptyDrawsError(
            f"{self.streak} draws in a row gave nothing to train on ({self.describe()}); no step was taken",
            hint="check the env's scores on a few items (`atropos process ENV --env.total_steps 4`, then "
            "`atropos view`): a group trains only when its rollouts' scores differ; or raise --max-empty-draws",
        )

    def describe(self) -> str:
        """`64 groups filtered by the env: identical scores 60, ...; 2 items failed; 3 groups without signal`."""
        parts = []
        filtered, failed = self.dropped.filtered, self.dropped.failed
        if filtered:
            reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(filtered.items(), key=lambda kv: -kv[1]))
            parts.append(f"{sum(filtered.values())} groups filtered by the env: {reasons}")
        if failed:
            parts.append(f"{failed} items failed")
        if self.unsignalled:
            parts.append(f"{self.unsignalled} groups whose rewards were all equal")
        return "; ".join(parts) or "the env gave no groups"
