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
        {"step": 1, "loop_s": 9.0, "step_time_s": 1.0},  # the warm-up step: left out
        {"step": 2, "loop_s": 3.0, "step_time_s": 1.0},
        {"step": 3, "loop_s": 5.0, "step_time_s": 1.0},
        {"step": 3, "skipped": True, "loop_s": 1.0, "step_time_s": 0.0},
    ]
    got = measured(colocated, world=4, engines=0)
    # sampling walls 2 and 4 s on 4 GPUs: 12 GPU-s a step; training 1 s on 4 GPUs: 4 GPU-s
    assert got == Measured(generate_gpu_s=12.0, train_gpu_s=4.0, steps=2)
    split = [{"step": s, "loop_s": 2.0, "step_time_s": 1.5, "generate_s": 6.0} for s in (1, 2, 3)]
    assert measured(split, world=4, engines=2) == Measured(6.0, 3.0, 2)
    assert measured(colocated[:1], world=4, engines=0) is None
    with pytest.raises(ValueError):
        choose(1, Measured(1.0, 1.0, 1))
