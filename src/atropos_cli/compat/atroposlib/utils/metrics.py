"""atroposlib.utils.metrics: the `name`, `name_std`, `name_max`, `name_min` summary of a list (W&B style)."""

from __future__ import annotations

import statistics

__all__ = ["get_std_min_max_avg"]


def get_std_min_max_avg(name: str, data: list, metrics_dict: dict) -> dict:
    metrics_dict[f"{name}_mean"] = statistics.fmean(data)
    metrics_dict[f"{name}_std"] = statistics.pstdev(data)
    metrics_dict[f"{name}_max"] = max(data)
    metrics_dict[f"{name}_min"] = min(data)
    return metrics_dict
