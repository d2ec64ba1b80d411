"""Eval statistics: the unbiased pass@k estimator, means with standard errors, and run-to-run comparison.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code"): with n samples of an item of
which c are correct, the probability that at least one of k samples drawn without replacement is correct is
`1 - C(n-c, k) / C(n, k)`; averaged over items it is an unbiased estimate of pass@k, unlike `1 - (1-p)^k`.
Standard errors are over items: sample standard deviation of the per-item values / sqrt(#items).

Used by `atropos_cli.runs.evaluate` (metrics.json) and `atropos evaluate --compare`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

__all__ = ["pass_at_k", "mean_stderr", "ItemResult", "summarise", "MetricDelta", "compare_metrics"]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k for one item with n samples, c correct (requires k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    # Product form of 1 - C(n-c, k) / C(n, k): exact and free of huge binomials.
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def mean_stderr(values: Sequence[float]) -> tuple[float, float]:
    """Mean and standard error of the mean (0.0 for fewer than two values)."""
    if not values:
        return math.nan, 0.0
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, 0.0
    return mean, statistics.stdev(values) / math.sqrt(len(values))


class ItemResult(BaseModel):
    """What one eval item contributes: its sample count, correct count and scores of the scored samples."""

    n: int
    correct: int
    scores: list[float]


def summarise(items: Sequence[ItemResult], k: int) -> dict[str, float]:
    """mean_score(+stderr), pass@1..k(+stderr), counts. Items with fewer than j samples skip pass@j."""
    metrics: dict[str, float] = {}
    item_means = [statistics.fmean(i.scores) for i in items if i.scores]
    if item_means:  # no NaN in metrics.json: with nothing scored there is no mean
        mean, err = mean_stderr(item_means)
        metrics["mean_score"], metrics["mean_score_stderr"] = _round(mean), _round(err)
    for j in range(1, k + 1):
        values = [pass_at_k(i.n, i.correct, j) for i in items if i.n >= j]
        if values:
            mean, err = mean_stderr(values)
            metrics[f"pass@{j}"], metrics[f"pass@{j}_stderr"] = _round(mean), _round(err)
    metrics["num_items"] = len(items)
    metrics["num_samples"] = sum(i.n for i in items)
    metrics["failed_samples"] = sum(i.n - len(i.scores) for i in items)
    return metrics


def _round(value: float) -> float:
    return value if math.isnan(value) else round(value, 6)


class MetricDelta(BaseModel):
    metric: str
    a: float | None
    b: float | None
    delta: float | None
    stderr: float | None
    """sqrt(se_a^2 + se_b^2) when both runs give a stderr: a delta within ~2 of these is noise."""


def compare_metrics(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[MetricDelta]:
    """Per-metric deltas (b - a) over the metrics either run has; stderr keys fold into their metric."""
    names = [m for m in dict.fromkeys([*a, *b]) if not str(m).endswith("_stderr")]
    rows = []
    for name in names:
        va, vb = _num(a.get(name)), _num(b.get(name))
        sa, sb = _num(a.get(f"{name}_stderr")), _num(b.get(f"{name}_stderr"))
        delta = round(vb - va, 6) if va is not None and vb is not None else None
        err = round(math.hypot(sa, sb), 6) if sa is not None and sb is not None else None
        rows.append(MetricDelta(metric=name, a=va, b=vb, delta=delta, stderr=err))
    return rows


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        return None
    return float(value)
