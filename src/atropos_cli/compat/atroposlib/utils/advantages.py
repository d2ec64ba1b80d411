"""atroposlib.utils.advantages: group statistics and process-supervision advantages (numpy).

`compute_grpo_process_supervision_advantages(rewards, gamma)`: normalise every step reward by the mean and
standard deviation of all steps of all trajectories, then per trajectory take the reverse cumulative sum
(gamma None) or the discounted returns G_t = r_t + gamma * G_{t+1}.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "allclose_to_first",
    "compute_stats",
    "compute_discounted_returns",
    "compute_grpo_process_supervision_advantages",
]


def allclose_to_first(
    values: Any, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False, return_vector: bool = False
) -> Any:
    """Whether every entry of `values` is close to `values[0]` (or, with return_vector, one bool each)."""
    array = np.asarray(values)
    close = np.isclose(array, array[0], rtol=rtol, atol=atol, equal_nan=equal_nan)
    per_entry = np.all(close.reshape(close.shape[0], -1), axis=1)
    return per_entry if return_vector else bool(np.all(per_entry))


def _flatten(data: Any) -> list[float]:
    if isinstance(data, int | float):
        return [data]
    if isinstance(data, list):
        return [x for item in data for x in _flatten(item)]
    raise ValueError(f"Invalid element type encountered: {type(data)}")


def compute_stats(data: Sequence[Any]) -> dict[str, float]:
    """Mean and (population) variance of a possibly jagged nested list of numbers."""
    flat = _flatten(list(data))
    if not flat:
        raise ValueError("No numerical elements found in the input data.")
    mean = sum(flat) / len(flat)
    return {"mean": mean, "var": sum(x * x for x in flat) / len(flat) - mean * mean}


def compute_discounted_returns(rewards: Any, gamma: float) -> np.ndarray:
    """G_t = r_t + gamma * G_{t+1}, computed from the end."""
    rewards = rewards if isinstance(rewards, np.ndarray) else np.array(rewards, dtype=np.float32)
    returns = np.empty_like(rewards)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        returns[t] = running
    return returns


def compute_grpo_process_supervision_advantages(
    rewards: Sequence[Sequence[float]], gamma: float | None = None, std_tol: float = 1e-8
) -> list[np.ndarray]:
    """Per-step advantages of each trajectory from per-step rewards (see the module docstring)."""
    stats = compute_stats([list(r) for r in rewards])
    std = stats["var"] ** 0.5
    if std < std_tol:
        raise ValueError(f"`std` is smaller than tolerance of {std_tol}.")
    normalized = [(np.array(r) - stats["mean"]) / std for r in rewards]
    if gamma is None:
        return [np.flip(np.cumsum(np.flip(r, axis=0), axis=0), axis=0) for r in normalized]
    return [compute_discounted_returns(r, gamma) for r in normalized]
