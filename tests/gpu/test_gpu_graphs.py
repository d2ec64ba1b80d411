"""CUDA graphs of whole micro-batches against the eager step, on the GPU: benchmarks/check_graphs.py trains a
Qwen2.5-0.5B-shaped model three times from one start (eager, eager again for the noise floor, graphed) and
prints PASS only if no recording failed and the graphed update is within 3x the eager run-to-run noise. With two
GPUs the same under torchrun, each rank a replica (the gradient sums start behind the recordings' marks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECK = ROOT / "benchmarks" / "check_graphs.py"


def _check(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=1500, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert done.stdout.rstrip().endswith("PASS") and "| step | run |" in done.stdout, done.stdout[-2000:]
    return done.stdout


def test_graphed_steps_update_the_weights_as_eager_ones(cuda):
    _check([sys.executable, str(CHECK), "--steps", "6"])


def test_graphed_replicas_update_the_weights_as_eager_ones(two_cudas):
    _check([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(CHECK),
            "--steps", "6"])  # fmt: skip
