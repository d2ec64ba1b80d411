"""The disaggregated loop's weight push (trainer/weights/weight_push.py) over NCCL between two GPUs, and over
gloo on the CPU: the engine rank ends with exactly the trainer's weights, in the engines' dtype, at the newest
version, then sees the trainer's stop."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RANKS = Path(__file__).with_name("weight_push_ranks.py")


def run_ranks(out: Path, *extra: str) -> list[dict]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(RANKS),
           str(out), *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


def check_pushed(trainer: dict, engine: dict) -> None:
    assert engine["arrived"] is True and engine["version"] == 2 and engine["error"] is None and engine["stopped"]
    assert engine["credited"]  # a batch taken without a step: the engine learns of it, no new weights
    assert engine["before"] != trainer["after"]  # the engine started elsewhere: the push moved it
    assert engine["after"] == trainer["after"]  # every tensor, bit for bit in bf16
    assert trainer["push1"]["push_bytes"] == trainer["push2"]["push_bytes"] > 0


def test_nccl_push_gives_the_engine_the_trainers_weights(two_cudas, tmp_path):
    check_pushed(*run_ranks(tmp_path))


def test_gloo_push_on_the_cpu_gives_the_engine_the_trainers_weights(tmp_path):
    """The same two ranks on the CPU (gloo), in the default suite. Version 2 lands while version 1 waits to be
    applied, in the other bucket set: the engine applies only the newest."""
    check_pushed(*run_ranks(tmp_path, "--cpu"))
