"""A training step's rollouts reach the in-process engine as ONE batch (issue 23, must 4): the batcher's
`expecting()` hold, and the one-command loop on the shipped model (32 groups x 8 = one batch of 256 rows, the
same seeded rollouts as when they were split in two batches, `engine_batches` in the step's metrics)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

from atropos_cli.inference.batching import RequestBatcher
from atropos_cli.resources import DEFAULT_MODEL
from atropos_cli.trainer.data.rollouts import EnvRollouts
from atropos_cli.trainer.run import RunOptions, run_training
from atropos_cli.trainer.step.grpo import GRPOConfig

LOCAL = {"server_type": "local", "model_name": DEFAULT_MODEL}


async def _late_pair(batcher: RequestBatcher[int, int], expect: int | None) -> list[int]:
    """Submit job 1, wait until the collector has taken it (its batch is open), then submit job 2."""
    with batcher.expecting(expect) if expect is not None else contextlib.nullcontext():
        first = asyncio.ensure_future(batcher.submit(1))
        deadline = time.monotonic() + 10
        while batcher._queue is None or not batcher._queue.empty():  # poll with a deadline: job 1 was taken
            assert time.monotonic() < deadline, "the collector never took the first job"
            await asyncio.sleep(0.001)
        for _ in range(5):  # let the collector run its quiet-gap wait (max_wait_s is tiny here)
            await asyncio.sleep(0.005)
        results = [await first, await batcher.submit(2)] if expect is None else await _both(first, batcher)
    await batcher.aclose()
    return results


async def _both(first: asyncio.Future[int], batcher: RequestBatcher[int, int]) -> list[int]:
    return list(await asyncio.gather(first, batcher.submit(2)))


def _batcher(seen: list[list[int]], **kw) -> RequestBatcher[int, int]:
    def work(jobs: list[int]) -> list[int]:
        seen.append(list(jobs))
        return [j * 10 for j in jobs]

    return RequestBatcher(work, size=lambda j: 4, max_batch_size=64, max_wait_s=0.0001, **kw)


def test_expected_rows_hold_the_batch_open_for_a_late_job():
    seen: list[list[int]] = []
    assert asyncio.run(_late_pair(_batcher(seen, expect_hold_s=30), expect=8)) == [10, 20]
    assert seen == [[1, 2]]  # one batch, although job 2 came long after the quiet gap
    alone: list[list[int]] = []
    assert asyncio.run(_late_pair(_batcher(alone), expect=None)) == [10, 20]
    assert alone == [[1], [2]]  # without the announcement the same arrivals are two batches


def test_expected_rows_that_never_come_hold_one_batch_only():
    seen: list[list[int]] = []
    batcher = _batcher(seen, expect_hold_s=0.05)

    async def main() -> list[int]:
        with batcher.expecting(100):  # 100 rows announced, 4 + 4 sent one after the other
            out = [await batcher.submit(1), await batcher.submit(2)]
        await batcher.aclose()
        return out

    assert asyncio.run(main()) == [10, 20]
    assert seen == [[1], [2]] and batcher.expect_timeouts == 1  # the second batch was not held again


def _step(rollouts: EnvRollouts, groups: int) -> tuple[list, int, list[int]]:
    batcher = rollouts.backend.batcher
    before, rows_before = batcher.batches_run, batcher.rows_run
    step = next(rollouts.batches(groups))
    return step, batcher.batches_run - before, [batcher.rows_run - rows_before]


@pytest.fixture(scope="module")
def one_batch_step():
    rollouts = EnvRollouts("arithmetic", [], None, dict(LOCAL))
    try:
        yield _step(rollouts, 32)
    finally:
        rollouts.close()


def test_a_steps_32_groups_of_8_are_one_engine_batch(one_batch_step):
    groups, batches, rows = one_batch_step
    assert len(groups) == 32 and batches == 1 and rows == [256]


def test_the_one_batch_samples_the_same_seeded_rollouts_as_two(one_batch_step):
    """The baseline (before issue 23's change): a batch cap of 128 rows and no announcement, so the step was two
    batches of 128; the seeded rollouts and their scores are the same either way."""
    rollouts = EnvRollouts("arithmetic", [], None, dict(LOCAL))
    try:
        rollouts._one_batch = lambda groups: contextlib.nullcontext()  # type: ignore[method-assign]
        assert rollouts.backend.batcher.max_batch_size == 128
        groups, batches, rows = _step(rollouts, 32)
    finally:
        rollouts.close()
    assert batches == 2 and rows == [256]
    one = one_batch_step[0]
    assert [g.tokens for g in groups] == [g.tokens for g in one]
    assert [g.scores for g in groups] == [g.scores for g in one]


def test_the_train_loop_reports_one_engine_batch_a_step(tmp_path: Path):
    opts = RunOptions(env="arithmetic", groups_per_step=32, inference="local")
    config = GRPOConfig(model=DEFAULT_MODEL, out=str(tmp_path / "run"), steps=2, lr=1e-4, save_every=0)
    seen: list[dict] = []
    run_training(opts, config, seen.append)
    assert [m["engine_batches"] for m in seen] == [1, 1]
    assert all(m["generate_s"] > 0 and "sync_s" in m for m in seen)
