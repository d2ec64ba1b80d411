"""A step's numbers (`reward_metrics` of its groups, `loss_metrics` of its summed loss statistics) and where they
go: OUT/metrics.jsonl always (one JSON object per step, flushed), plus W&B and
TensorBoard only when installed and asked for. The console line is the CLI's job (`cli/train.py`).

Where it sits: `grpo.py`'s loop hands each step's metrics dict to `MetricsSink.write`; `plot.py` and
`atropos view` read metrics.jsonl back with `read_metrics`.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

from atropos_cli.errors import ConfigError

if TYPE_CHECKING:
    from .losses import Normaliser

__all__ = ["MetricsSink", "read_metrics", "METRICS_FILE", "reward_metrics", "loss_metrics"]

METRICS_FILE = "metrics.jsonl"


class MetricsSink:
    def __init__(self, out: Path, wandb_project: str | None = None, tensorboard: bool = False, config=None):
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / METRICS_FILE
        self._file = self.path.open("a", encoding="utf-8")
        self._wandb = _start_wandb(wandb_project, out, config) if wandb_project else None
        self._tb = _start_tensorboard(out) if tensorboard else None

    def write(self, metrics: dict[str, Any]) -> None:
        self._file.write(json.dumps(metrics) + "\n")
        self._file.flush()
        step = int(metrics.get("step", 0))
        numeric = {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and k != "step"}
        if self._wandb is not None:
            self._wandb.log(numeric, step=step)
        if self._tb is not None:
            for key, value in numeric.items():
                self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        self._file.close()
        if self._wandb is not None:
            self._wandb.finish()
        if self._tb is not None:
            self._tb.close()


def _start_wandb(project: str, out: Path, config: Any) -> Any:
    try:
        import wandb
    except ImportError:
        raise ConfigError(
            f"--wandb-project {project!r} needs the wandb package, which is not installed",
            hint="pip install wandb, or drop --wandb-project (metrics are always in metrics.jsonl)",
        ) from None
    return wandb.init(project=project, dir=str(out), config=config)


def _start_tensorboard(out: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError(
            "--tensorboard needs the tensorboard package, which is not installed",
            hint="pip install tensorboard, or drop --tensorboard (metrics are always in metrics.jsonl)",
        ) from None
    return SummaryWriter(log_dir=str(out / "tensorboard"))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of metrics.jsonl for the reward plot; a line that is not a JSON object (a torn write, a stray
    byte) is not plotted (the file keeps it)."""
    if path.is_dir():
        path = path / METRICS_FILE
    rows = []
    for line in path.read_bytes().splitlines():
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:  # JSONDecodeError and UnicodeDecodeError
            row = None
        if isinstance(row, dict):
            rows.append(row)
    return rows


def reward_metrics(prepared: Any) -> dict[str, Any]:
    scores = prepared.scores
    mean = sum(scores) / len(scores) if scores else 0.0
    std = math.sqrt(sum((s - mean) ** 2 for s in scores) / len(scores)) if scores else 0.0
    return {
        "reward_mean": mean,
        "reward_std": std,
        "groups": prepared.groups,
        "signal_fraction": prepared.groups_with_signal / prepared.groups if prepared.groups else 0.0,
        "dropped_no_signal": prepared.dropped_no_signal,
        "sequences": prepared.sequences,
        "truncated": prepared.truncated,
    }


def loss_metrics(sums: dict[str, float], norm: Normaliser) -> dict[str, Any]:
    tokens = max(sums.get("tokens", 0.0), 1.0)
    out = {
        "trained_tokens": int(sums.get("tokens", 0)),
        "padded_tokens": int(sums.get("padded_tokens", 0)),  # through the model, padding/filler included
        "real_tokens": int(sums.get("real_tokens", 0)),
        "clip_fraction": sums.get("clipped_tokens", 0.0) / tokens,
        "ratio_mean": sums.get("ratio_sum", 0.0) / tokens,
    }
    if "logprob_gap_sum" in sums:
        out["logprob_gap"] = sums["logprob_gap_sum"] / tokens
        out["logprob_gap_abs"] = sums["logprob_gap_abs_sum"] / tokens
    if "kl_sum" in sums:
        out["kl"] = sums["kl_sum"] / tokens
    if sums.get("distill_tokens"):
        out["distill_kl"] = sums["distill_kl_sum"] / sums["distill_tokens"]
    if "moe_aux_sum" in sums:  # router.py: each a mean over the step's trained tokens
        out["moe_aux_loss"] = sums["moe_aux_sum"] / tokens
        out["moe_load_max"] = sums["moe_load_max_sum"] / tokens
        out["moe_load_min"] = sums["moe_load_min_sum"] / tokens
    if "is_rejected_tokens" in sums:
        out["is_rejected_fraction"] = sums["is_rejected_tokens"] / tokens
    return out
