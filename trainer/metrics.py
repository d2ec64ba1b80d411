"""Where a step's numbers go: OUT/metrics.jsonl always (one JSON object per step, flushed), plus W&B and
TensorBoard only when installed and asked for. The console line is the CLI's job (`cli/train.py`).

Where it sits: `grpo.py`'s loop hands each step's metrics dict to `MetricsSink.write`; `plot.py` and
`atropos view` read metrics.jsonl back with `read_metrics`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from atropos_cli.errors import ConfigError

__all__ = ["MetricsSink", "read_metrics", "METRICS_FILE"]

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
    if path.is_dir():
        path = path / METRICS_FILE
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return rows
