"""RolloutCounts: every rollout of an outcome lands in exactly one count, and the summary line names them all."""

from __future__ import annotations

from atropos_cli.runs.counts import RolloutCounts
from atropos_cli.runs.rollout import GroupOutcome
from atropos_cli.types import RolloutFailure, ScoredGroup


def _group(scores: list[float], tokens: bool = True) -> ScoredGroup:
    n = len(scores)
    if not tokens:
        return ScoredGroup(scores=scores, messages=[[{"role": "user", "content": "q"}]] * n)
    return ScoredGroup(tokens=[[1, 2]] * n, masks=[[-100, 2]] * n, scores=scores)


def _failure(kind: str, error: str = "boom") -> RolloutFailure:
    return RolloutFailure(kind=kind, error_type="Filtered" if kind == "group" else "ValueError", error=error)


def test_outcomes_are_tallied_by_kind_and_filter_reason() -> None:
    counts = RolloutCounts()
    counts.add(GroupOutcome(0, "a", groups=[_group([1.0, 0.0])], failures=[_failure("rollout")]))
    counts.add(GroupOutcome(1, "b", failures=[_failure("group")]))  # no group at all: a failed group
    counts.add(GroupOutcome(2, "c", filtered=[_failure("group", "identical scores")]))
    counts.add(GroupOutcome(3, "d", groups=[_group([0.5], tokens=False)]))
    counts.drop("too long", groups=2)
    assert (counts.groups, counts.rollouts, counts.failed_rollouts, counts.failed_groups) == (2, 3, 1, 1)
    assert counts.filtered == {"identical scores": 1, "too long": 2} and counts.filtered_groups == 3
    assert counts.tokens_missing == 1 and counts.mean_score == 0.5
    assert counts.summary() == (
        "2 groups (3 rollouts, mean score 0.500; 1 rollouts failed, 1 groups failed, "
        "3 groups filtered: identical scores 1, too long 2)"
    )


def test_scores_with_failed_samples() -> None:
    counts = RolloutCounts()
    counts.add_scores([1.0, None, 0.0])
    counts.add_scores([None, None])
    assert (counts.groups, counts.rollouts, counts.failed_rollouts, counts.failed_groups) == (1, 2, 3, 1)
    assert counts.summary() == "1 groups (2 rollouts, mean score 0.500; 3 rollouts failed, 1 groups failed)"
