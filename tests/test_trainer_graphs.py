"""CUDA graphs of whole micro-batches (trainer/step/graphs.py): bucketed shapes, static buffers, and a step that
trains exactly like the eager one. A CUDA recording cannot run on this machine: a recorder that records by
keeping the function (and replays by calling it) stands in for it; the GPU check is
benchmarks/device/graphs_check.py."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from atropos_cli.errors import ConfigError
from atropos_cli.trainer.step.attention import use_varlen
from atropos_cli.trainer.step.batching import Deferred, StaticShape, bucket, prepare, static_rows
from atropos_cli.trainer.step.graphs import MicroBatchGraphs
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
from atropos_cli.types import ScoredGroup
from test_trainer_packing import VOCAB, tiny_qwen


class KeepingRecorder:
    """Records nothing and runs nothing at record time (like a CUDA capture); a replay calls the function. Its
    first `fail` recordings raise, as a capture that meets a host sync does."""

    def __init__(self, fail: int = 0) -> None:
        self.fail, self.recordings = fail, 0

    def record(self, fn):
        if self.fail:
            self.fail -= 1
            raise RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore")
        self.recordings += 1
        return fn


def test_bucket_sizes_are_few_and_close_above():
    assert [bucket(n) for n in (1, 128, 129, 1024, 1025, 2300, 15000, 16384)] == [
        128, 128, 256, 1024, 1280, 2560, 16384, 16384,
    ]  # fmt: skip
    sizes = {bucket(n) for n in range(1, 16385)}
    assert len(sizes) == 8 + 4 * 4  # 128..1024, then 4 an octave
    assert all(n <= bucket(n) < n + 128 for n in range(1, 1025))
    assert all(n <= bucket(n) <= n * 1.25 for n in range(1025, 16385))


def long_groups() -> list[ScoredGroup]:
    """Rollouts of 20-300 tokens (a quarter prompt): rows of several bucket widths and trained counts."""
    gen = torch.Generator().manual_seed(5)
    groups = []
    for temperature in (1.0, 0.8, 1.0, 1.2):
        lengths = torch.randint(20, 300, (4,), generator=gen).tolist()
        tokens = [torch.randint(1, VOCAB, (n,), generator=gen).tolist() for n in lengths]
        masks = [[-100] * (len(t) // 4) + t[len(t) // 4 :] for t in tokens]
        inference = [(-torch.rand(len(t), generator=gen)).tolist() for t in tokens]
        params = {"temperature": temperature}
        groups.append(ScoredGroup(tokens=tokens, masks=masks, scores=[1.0, 0.0, 0.5, 0.0], generation_params=params,
                                  inference_logprobs=inference))  # fmt: skip
    return groups


def test_bucketed_micro_batches_have_few_shapes_and_pad_into_an_empty_slot():
    samples = prepare(long_groups(), scale_rewards=True, dynamic_sampling=False, max_len=320).samples
    shape, exact = StaticShape.for_budget(512, 320, bucketed=True), StaticShape.for_budget(512, 320, exact=True)
    batches = list(Deferred(static_rows(samples, shape), shape))
    assert len(batches) > 1
    slots, span = shape.max_docs + 1, shape.max_doc_len
    for mb, ref in zip(batches, Deferred(static_rows(samples, exact), exact), strict=True):
        n = ref.input_ids.shape[1]  # the exact row's width: its samples' tokens
        assert mb.input_ids.shape == (1, bucket(n)) and int(mb.cu_seqlens[-1]) == bucket(n)
        assert mb.real_tokens == ref.real_tokens == n
        # the real positions are the exact row's own, the rest filler pieces
        assert torch.equal(mb.input_ids[:, :n], ref.input_ids) and torch.equal(mb.targets[:, :n], ref.targets)
        assert torch.equal(mb.position_ids[:, :n], ref.position_ids)
        assert mb.loss_mask.shape == mb.advantages.shape == mb.inference_logp.shape == (slots, span)
        rows, cols = ref.loss_mask.shape
        assert torch.equal(mb.loss_mask[:rows, :cols], ref.loss_mask) and float(mb.loss_mask[rows:].sum()) == 0
        trained = len(ref.select)
        assert len(mb.select) == len(mb.place) == bucket(trained)
        # padding reads position 0 and lands in the last slot, which holds no sample
        assert torch.equal(mb.place[trained:], torch.full((bucket(trained) - trained,), (slots - 1) * span))
        assert int(mb.select[trained:].abs().sum()) == 0
        if ref.inv_temperature is not None:
            assert torch.equal(mb.inv_temperature[:trained], ref.inv_temperature)
            assert bool((mb.inv_temperature[trained:] == 1).all())
        else:
            assert mb.inv_temperature is None


def _trainer(graphs: bool, recorder=None, dtype: str = "fp32") -> GRPOTrainer:
    model = tiny_qwen()
    config = GRPOConfig(out="unused", micro_batch_tokens=512, max_len=320, lr=1e-3, dtype=dtype, seed=0)
    trainer = GRPOTrainer(config, model=model)
    use_varlen(model)
    trainer.pack = "static"  # the CUDA default, on this CPU (the dense varlen attention)
    if graphs:
        trainer.static_shape = dataclasses.replace(trainer.static_shape, exact=True, bucketed=True)
        undo = trainer.precision.discard_pending
        trainer.graphs = MicroBatchGraphs(trainer._train_micro_batch, "cpu", recorder=recorder, on_failure=undo)
    return trainer


def _train(trainer: GRPOTrainer, steps: int = 3) -> list[dict]:
    return [trainer.step(long_groups()) for _ in range(steps)]


@pytest.mark.parametrize("dtype", ["fp32", "bf16-pure"])
def test_graphed_steps_train_like_eager_ones(dtype):
    """The bucketed, replayed step (filler up to the bucket, padded trained positions, counts as tensors) gives
    the eager step's loss, stats, gradient norm and weights; a shape runs eagerly once, is recorded once, then
    replayed."""
    recorder = KeepingRecorder()
    eager, graphed = _trainer(False, dtype=dtype), _trainer(True, recorder, dtype=dtype)
    tol = 1e-5 if dtype == "fp32" else 2e-2
    for a, b in zip(_train(eager), _train(graphed), strict=True):
        for name in ("loss", "grad_norm", "clip_fraction", "ratio_mean", "logprob_gap"):
            if name in a:
                assert b[name] == pytest.approx(a[name], rel=tol, abs=tol), name
        assert b["real_tokens"] == a["real_tokens"]
    for p, q in zip(eager.model.parameters(), graphed.model.parameters(), strict=True):
        assert torch.allclose(p.float(), q.float(), atol=tol, rtol=tol)
    graphs = graphed.graphs
    assert graphs is not None and graphs.failed is None
    shapes, rows = len(graphs.shapes), len(graphed._micro_batches(prepare(long_groups(), True, False, 320).samples))
    assert rows > shapes > 1  # several shapes, one recurring inside a step
    # the run's first micro-batch runs eagerly; every shape is recorded when it first comes, then replayed
    assert (graphs.eager, graphs.recorded, recorder.recordings, graphs.replayed) == (1, shapes, shapes, 3 * rows - 1)


def test_a_failed_recording_runs_eagerly_and_is_tried_again():
    eager, graphed = _trainer(False), _trainer(True, KeepingRecorder(fail=1))
    for a, b in zip(_train(eager), _train(graphed), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    graphs = graphed.graphs
    assert graphs is not None and graphs.failed is None and graphs.failures == 1
    assert graphs.recorded == len(graphs.shapes) and graphs.eager == 2  # the first micro-batch, the failed one


def test_recordings_that_keep_failing_turn_graphs_off_and_lose_nothing():
    eager = _trainer(False)
    graphed = _trainer(True, KeepingRecorder(fail=10**6))
    with pytest.warns(RuntimeWarning, match="CUDA graphs turned off .*after running eagerly .*operation not permitted"):
        results = _train(graphed)
    for a, b in zip(_train(eager), results, strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    graphs = graphed.graphs
    assert graphs is not None and graphs.failed == "CUDA error: operation not permitted when stream is capturing"
    assert graphs.replayed == 0 and graphs.failures >= 2  # a shape failed before and after running eagerly


def test_cuda_graphs_asked_for_where_they_cannot_run_is_a_config_error():
    config = GRPOConfig(out="unused", max_len=32, cuda_graphs=True)
    with pytest.raises(ConfigError, match="--cuda-graphs needs a CUDA device"):
        GRPOTrainer(config, model=tiny_qwen())
    assert GRPOTrainer(GRPOConfig(out="unused", max_len=32), model=tiny_qwen()).graphs is None  # auto: off
