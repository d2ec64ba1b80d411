"""`--inference-gpus auto`'s rule on given timings: the split of N GPUs whose slower side is fastest, from the
GPU-seconds of generation and training a step measured by a colocated or a split run."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from atropos_cli.trainer.scale.split import Measured, choose, measured  # noqa: E402


@pytest.mark.parametrize(
    ("world", "generate", "train", "engines", "step"),
    [
        (2, 5.0, 1.0, 1, 5.0),  # one of each is the only split
        (4, 9.0, 3.0, 3, 3.0),  # 3 + 1: max(3, 3); 2 + 2 would be max(4.5, 1.5)
        (4, 3.0, 9.0, 1, 3.0),  # training-heavy: 1 + 3
        (4, 6.0, 6.0, 2, 3.0),  # even: 2 + 2
        (8, 1.0, 20.0, 1, 20 / 7),  # generation nearly free: one engine
        (4, 4.0, 6.0, 2, 3.0),  # 1 + 3: max(4, 2) = 4; 2 + 2: max(2, 3) = 3; 3 + 1: max(1.33, 6) = 6
    ],
)
def test_the_split_balances_generation_against_training(world, generate, train, engines, step):
    split = choose(world, Measured(generate, train, 5))
    assert split.engines == engines and split.step_s == pytest.approx(step)
    line = split.describe()
    assert line.startswith(f"--inference-gpus auto: {engines} of {world} GPUs generate, {world - engines} train")


def test_a_tie_takes_fewer_engines():
    # 3 GPUs, G = 2, T = 2: 1 + 2 gives max(2, 1) = 2, 2 + 1 gives max(1, 2) = 2
    assert choose(3, Measured(2.0, 2.0, 1)).engines == 1


def test_times_from_a_colocated_and_a_split_runs_metrics():
    colocated = [
        {"step": 1, "loop_s": 9.0, "step_time_s": 1.0, "generate_s": 7.0},  # the warm-up step: left out
        {"step": 2, "loop_s": 3.5, "step_time_s": 1.0, "generate_s": 2.0, "sync_s": 0.2},
        {"step": 3, "loop_s": 5.5, "step_time_s": 1.0, "sync_s": 0.5},  # no generate_s: the rest of the loop
        {"step": 3, "skipped": True, "loop_s": 1.0, "step_time_s": 0.0},
        {"step": 4, "loop_s": 2.0, "step_time_s": 1.5, "generate_s": 6.0, "staleness_mean": 1.0},  # a split row
    ]
    got = measured(colocated, world=4, engines=0)
    # rank 0 sampled 2 s and 4 s (5.5 - 1 - 0.5) of its share on 4 GPUs: 12 GPU-s a step; training 1 s x 4
    assert got == Measured(generate_gpu_s=12.0, train_gpu_s=4.0, steps=2)
    split = [
        {"step": s, "loop_s": 2.0, "step_time_s": 1.5, "generate_s": 6.0, "staleness_mean": 1.0} for s in (1, 2, 3)
    ]
    assert measured(colocated + split, world=4, engines=2) == Measured(6.0, 3.0, 3)  # the split rows, one left out
    assert measured(colocated[:1], world=4, engines=0) is None
    with pytest.raises(ValueError):
        choose(1, Measured(1.0, 1.0, 1))


def test_auto_reads_the_steps_a_run_trained(tmp_path):
    import json

    from atropos_cli.errors import ConfigError
    from atropos_cli.trainer.scale.split import auto_split

    with pytest.raises(ConfigError, match="needs measured steps"):
        auto_split(tmp_path, 4)
    (tmp_path / "train_config.json").write_text(json.dumps({"run": {"nproc_per_node": 2, "inference_gpus": 0}}))
    rows = [{"step": s, "loop_s": 9.0, "step_time_s": 1.0, "generate_s": 3.0} for s in (1, 2, 3)]  # G = 6, T = 2
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    split = auto_split(tmp_path, 4)  # 3 + 1: max(2, 2)
    assert (split.engines, split.times) == (3, Measured(6.0, 2.0, 2))
    with pytest.raises(ConfigError, match="2 or more"):
        auto_split(tmp_path, 1)


def test_the_cli_resolves_auto_or_says_why_not(tmp_path):
    import os
    import subprocess
    import sys

    from atropos_cli.cli.train import _with_split

    assert _with_split(["x", "--inference-gpus", "auto", "--inference-gpus=auto"], 3) == [
        "x", "--inference-gpus", "3", "--inference-gpus=3"
    ]  # fmt: skip
    cmd = [sys.executable, "-m", "atropos_cli", "train", "--nproc-per-node", "2", "--inference-gpus", "auto"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*cmd, "--out", str(tmp_path / "run")], capture_output=True, text=True, env=env)
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "--inference-gpus auto needs measured steps" in done.stderr and "--resume" in done.stderr
    bad = subprocess.run([*cmd[:-1], "two", "--out", str(tmp_path / "r")], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and "inference_gpus" in bad.stderr
