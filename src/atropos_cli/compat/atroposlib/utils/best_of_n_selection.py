"""atroposlib.utils.best_of_n_selection: pick the best index by a primary score, ties by a secondary one."""

from __future__ import annotations

__all__ = ["select_best_index"]


def select_best_index(
    primary_scores: list[float],
    secondary_scores: list[float],
    primary_higher_is_better: bool = True,
    secondary_lower_is_better: bool = True,
) -> int:
    """The first index with the best primary score, ties broken by the secondary score."""
    if not primary_scores:
        raise ValueError("Input score lists cannot be empty.")
    if len(primary_scores) != len(secondary_scores):
        raise ValueError("Primary and secondary score lists must have the same length.")

    def key(i: int) -> tuple[float, float]:
        primary = primary_scores[i] if primary_higher_is_better else -primary_scores[i]
        secondary = -secondary_scores[i] if secondary_lower_is_better else secondary_scores[i]
        return primary, secondary

    best = 0
    for i in range(1, len(primary_scores)):
        if key(i) > key(best):
            best = i
    return best
