"""CUDA graphs of whole micro-batches (trainer/step/graphs.py): bucketed shapes, static buffers, and a step that
trains exactly like the eager one. A CUDA recording cannot run on this machine: a recorder that records by
keeping the function (and replays by calling it) stands in for it; the GPU check is
benchmarks/device/graphs_check.py."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from atropos_cli.errors import ConfigError
from atropos_cli.trainer.step.attention import use_varlen
from atropos_cli.trainer.step.batching import (
    Deferred,
    StaticShape,
    bucket,
    narrow_warmups,
    prepare,
    static_micro_batch,
    static_rows,
)
from atropos_cli.trainer.step.graphs import MicroBatchGraphs, shape_key
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
from atropos_cli.trainer.step.losses import LossStats, Normaliser
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
        trained, count = len(ref.select), shape.trained_count(bucket(n), len(ref.select))
        assert len(mb.select) == len(mb.place) == count
        assert count == (bucket(n) if bucket(n) <= shape.width // 2 else bucket(trained))  # narrow rows: all positions
        # padding reads position 0 and lands in the last slot, which holds no sample
        assert torch.equal(mb.place[trained:], torch.full((count - trained,), (slots - 1) * span))
        assert int(mb.select[trained:].abs().sum()) == 0
        if ref.inv_temperature is not None:
            assert torch.equal(mb.inv_temperature[:trained], ref.inv_temperature)
            assert bool((mb.inv_temperature[trained:] == 1).all())
        else:
            assert mb.inv_temperature is None


def test_narrow_shapes_are_known_before_their_rows_come():
    """Every width a narrow row can have is listed, and its zero-weight micro-batch has exactly the shapes a real
    narrow row of that width gets (what graphs.py runs and records ahead)."""
    for budget in (512, 16384, 12000):
        shape = StaticShape.for_budget(budget, 1025, bucketed=True)
        limit = shape.width // 2  # a narrow row: its bucket width at most half the budget
        assert shape.narrow_widths() == sorted({bucket(n) for n in range(1, limit + 1) if bucket(n) <= limit})
    shape = StaticShape.for_budget(512, 320, bucketed=True)
    samples = prepare(long_groups(), scale_rewards=True, dynamic_sampling=False, max_len=320).samples
    for row in ([min(samples, key=lambda s: len(s.tokens))], sorted(samples, key=lambda s: len(s.tokens))[:3]):
        mb = static_micro_batch(row, shape)
        assert mb.input_ids.shape[1] in shape.narrow_widths()
        warm = {w.input_ids.shape[1]: w for w in narrow_warmups(mb, shape)}
        assert shape_key(warm[mb.input_ids.shape[1]]) == shape_key(mb)
        assert all(float(w.advantages.abs().sum()) == 0 and w.teacher_mask is None for w in warm.values())
    assert len({shape_key(w) for w in warm.values()}) == len(shape.narrow_widths())


def _trainer(graphs: bool, recorder=None, dtype: str = "fp32", ahead: bool = True) -> GRPOTrainer:
    model = tiny_qwen()
    config = GRPOConfig(out="unused", micro_batch_tokens=512, max_len=320, lr=1e-3, dtype=dtype, seed=0)
    trainer = GRPOTrainer(config, model=model)
    use_varlen(model)
    trainer.pack = "static"  # the CUDA default, on this CPU (the dense varlen attention)
    if graphs:
        trainer.static_shape = dataclasses.replace(trainer.static_shape, exact=True, bucketed=True)
        undo = trainer.precision.discard_pending
        record_ahead = functools.partial(narrow_warmups, shape=trainer.static_shape) if ahead else None
        trainer.graphs = MicroBatchGraphs(trainer._train_micro_batch, "cpu", recorder, undo, ahead=record_ahead)
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
    rows = len(graphed._micro_batches(prepare(long_groups(), True, False, 320).samples))
    # the run's first micro-batch runs eagerly; the narrow shapes are recorded right after it, any other when it
    # first comes; then each is replayed
    ahead = graphed.static_shape.narrow_widths()
    assert ahead == [128, 256] and len(graphs.shapes) > len(ahead)
    assert (graphs.eager, graphs.recorded, recorder.recordings) == (1, len(graphs.shapes), len(graphs.shapes))
    assert graphs.warmups == len(ahead)  # their zero-weight runs changed nothing (the weights match eager's)
    assert graphs.replayed == 3 * rows - 1


@pytest.mark.parametrize("ahead", [False, True])
def test_a_failed_recording_runs_eagerly_and_is_tried_again(ahead):
    eager, graphed = _trainer(False), _trainer(True, KeepingRecorder(fail=1), ahead=ahead)
    for a, b in zip(_train(eager), _train(graphed), strict=True):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)
    graphs = graphed.graphs
    assert graphs is not None and graphs.failed is None and graphs.failures == 1
    if ahead:  # the first shape recorded ahead failed after its warm-up ran it: tried again when its row comes
        failed = [s for s in graphs.shapes.values() if s.failures]
        assert len(failed) == 1 and failed[0].ran and graphs.eager == 1
        assert graphs.recorded == sum(s.replay is not None for s in graphs.shapes.values())
    else:
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


@pytest.mark.parametrize("dtype", ["fp32", "bf16-pure"])
def test_a_narrow_warmup_adds_exactly_nothing_to_the_gradient(dtype):
    trainer = _trainer(True, KeepingRecorder(), dtype=dtype)
    samples = prepare(long_groups(), scale_rewards=True, dynamic_sampling=False, max_len=320).samples
    first = static_micro_batch([samples[0]], trainer.static_shape)
    warmups = list(narrow_warmups(first, trainer.static_shape))
    assert warmups, "no narrow warm-up for a long first micro-batch: the check below would see nothing"
    for warm in warmups:
        stats = LossStats()
        loss = trainer._train_micro_batch(warm, Normaliser(1, 1), stats)
        assert float(loss) == 0.0 and float(stats.sums["tokens"]) == warm.input_ids.shape[1]
    grads = trainer.precision.master or trainer.precision.params
    assert all(g.grad is None or not bool(g.grad.any()) for g in grads)
