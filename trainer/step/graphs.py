"""CUDA graphs of whole micro-batches: one recording per shape replays the forward, the loss, the backward and the
gradient moves into the fp32 master, with no host work per layer.

Where it sits: `GRPOTrainer.step` hands each statically packed micro-batch to `MicroBatchGraphs` (when
`--cuda-graphs` is on: its default for one-process and replicated CUDA training, grpo.py), which copies it into
the static buffers of its shape and replays that shape's recording. Shapes are few because the rows are bucketed
(`batching.StaticShape.bucketed`: row widths and trained-position counts rounded up to `batching.bucket` sizes,
the loss layout fixed).

Why: on an H100 a mixed-length step of the 0.5B model was host-bound (benchmarks/results/trainer_gpu.md):
~9k kernel launches a step through 24 compiled layers, forward and backward, each call costing the host its
guards, its autograd wrapper and inductor's Python launches; the GPU idled ~30% of the step. A replay is one
launch: the host queues a whole micro-batch in microseconds and runs ahead, so the step becomes GPU-bound.
(Inductor's per-layer graph trees were tried (2026-11-27, 22d5d97) and were slower: their per-call bookkeeping stays on
the host. This records the whole micro-batch, outside any compiled function.)

A shape's life: the run's first micro-batch runs eagerly (it compiles and loads every kernel: nothing may
initialise lazily inside a recording); right after it (in the first step) every narrow row's shape (a step's
last row; its width fixes its shape, `batching.StaticShape.trained_count`) runs once with zero weight (compiling
what it needs) and is recorded; any other shape is recorded the first time it comes (a recording runs nothing, and waits
for nothing: the GPU goes on with the replays queued before it) and replayed, then only replayed. A shape whose
first run needs a compile cannot be recorded (a compile syncs with the host; on an H100 a row of 128-256 tokens
makes the compiled layers recompile once): it runs eagerly and is recorded the next time it comes. All
recordings share one memory pool; a replay's outputs (the loss and the loss stats) are added into the step's own
tensors right after it, before another replay can reuse that memory.

What a replay relies on, each kept by the trainer: every input is a tensor whose storage never moves: the
micro-batch (copied into the shape's buffers), the step's counts (`losses.Normaliser` as device scalars), the
weights (the optimizer's master is copied into them in place), the gradient accumulators (the fp32 master's
.grad, zeroed in place); and nothing inside syncs with the host (a recording fails on a sync).

Replicas (`replicate.OverlappedSum`): no collective is issued inside a recording. While a shape is recorded, each
gradient bucket that becomes final records an event into the graph; when the step's last micro-batch is a replay,
each bucket's all-reduce is queued behind its event (`start_after`), so the sum still overlaps that backward.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from .batching import MicroBatch
from .losses import LossStats, Normaliser

__all__ = ["MicroBatchGraphs", "CudaRecorder", "shape_key"]

# run(micro_batch, normaliser, stats) -> the micro-batch's detached loss: forward, loss, backward, gradient moves
Run = Callable[[MicroBatch, Normaliser, LossStats], torch.Tensor]
Outputs = tuple[torch.Tensor, dict[str, Any]]


def shape_key(mb: MicroBatch) -> tuple:
    """What a recording is specific to: every tensor's shape and dtype, which optional tensors are present, and
    the plain values the model reads (the longest piece). `real_tokens` is only counted outside."""
    key: list[tuple] = []
    for name, value in vars(mb).items():
        if isinstance(value, torch.Tensor):
            key.append((name, tuple(value.shape), value.dtype))
        elif name != "real_tokens":
            key.append((name, value))
    return tuple(key)


class CudaRecorder:
    """Records a function into a CUDA graph on a side stream; every recording shares one memory pool.

    Unlike `torch.cuda.graph`, a recording neither waits for the GPU nor empties the allocator's cache (it
    runs nothing, so it needs neither): the GPU goes on with the replays queued before it while the host
    records (a new shape costs the host about what an eager micro-batch does, and the GPU nothing)."""

    def __init__(self, mode: str = "global") -> None:
        self.pool: Any = None
        self.stream: Any = None
        # "thread_local" for many ranks: NCCL's watchdog thread may query its events while a recording runs
        self.mode = mode

    def capture_stream(self) -> Any:
        """The stream the next recording captures (work queued on it from any thread lands in the graph)."""
        if self.stream is None:
            self.stream = torch.cuda.Stream()
        return self.stream

    def record(self, fn: Callable[[], Outputs]) -> Callable[[], Outputs]:
        """`fn` recorded (not run); the returned replay runs it and gives the recording's own output tensors."""
        self.capture_stream()
        graph = torch.cuda.CUDAGraph()
        error: RuntimeError | None = None
        with torch.cuda.stream(self.stream):
            graph.capture_begin(pool=self.pool, capture_error_mode=self.mode)
            try:
                outputs = fn()
            except RuntimeError as exc:
                error = exc
            try:
                graph.capture_end()
            except RuntimeError as exc:  # the capture was invalidated (by `error`, if there was one)
                error = error or exc
        if error is not None:
            # an invalidated capture can leave its pool registered for recording on its stream: the next
            # recording gets a new stream and a new pool ("already recording to mempool_id" otherwise)
            self.pool = self.stream = None
            raise error
        if self.pool is None:
            self.pool = graph.pool()

        def replay() -> Outputs:
            graph.replay()
            return outputs

        return replay


class _Shape:
    """One shape's static input buffers (on the device) and, once recorded, its replay."""

    def __init__(self, mb: MicroBatch, device: str) -> None:
        fields = vars(mb).items()
        empty: dict[str, Any] = {
            k: torch.empty_like(v, device=device) if isinstance(v, torch.Tensor) else v for k, v in fields
        }
        self.mb = MicroBatch(**empty)
        self.counts = torch.ones(2, device=device)
        self.norm = Normaliser(self.counts[0], self.counts[1])
        self.replay: Callable[[], Outputs] | None = None
        self.marked = 0  # replicas: the gradient buckets its recording marked final (`OverlappedSum`)
        self.failures = 0  # recordings of this shape that failed
        self.ran = False  # ran eagerly at least once

    def load(self, mb: MicroBatch, norm: Normaliser) -> None:
        """Copy `mb` (host tensors) and the step's counts into the buffers, queued behind the GPU's work."""
        pin = self.counts.is_cuda
        for name, value in vars(mb).items():
            if isinstance(value, torch.Tensor):
                getattr(self.mb, name).copy_(value.pin_memory() if pin else value, non_blocking=pin)
        counts = torch.tensor([float(norm.num_sequences), float(norm.token_divisor)])
        self.counts.copy_(counts.pin_memory() if pin else counts, non_blocking=pin)

    def call(self, run: Run) -> Outputs:
        stats = LossStats()
        loss = run(self.mb, self.norm, stats)
        return loss, stats.sums


class MicroBatchGraphs:
    """Trains one micro-batch by replaying its shape's recording (`__call__`).

    The run's first micro-batch runs eagerly (it compiles and loads every kernel: nothing may initialise lazily
    inside a recording); after it, a shape is recorded the first time it comes. A shape whose recording fails
    runs eagerly (which initialises whatever it needed) and is recorded the next time it comes; if that fails
    too, the trainer goes on without graphs (a warning says why). A failed recording runs nothing: no gradient
    is lost or doubled."""

    def __init__(
        self,
        run: Run,
        device: str,
        recorder: Any = None,
        on_failure: Callable[[], None] | None = None,
        reducer: Any = None,
        ahead: Callable[[MicroBatch], list[MicroBatch]] | None = None,
    ) -> None:
        self.run, self.device = run, device
        # the shapes to run once and record right after the run's first micro-batch (`batching.narrow_warmups`:
        # every narrow width), so a step's last, narrow row is a replay from the first steps on; None once done
        self.ahead = ahead
        self.recorder = recorder if recorder is not None else CudaRecorder()
        self.on_failure = on_failure  # undoes what a failed recording left behind (pending gradient moves)
        # replicas (`replicate.OverlappedSum`): the step's last micro-batch starts the gradient sum, bucket by
        # bucket: eagerly through the backward's hooks; replayed behind the marks its recording put in the graph
        self.reducer = reducer
        self.shapes: dict[tuple, _Shape] = {}
        self.recorded = 0
        self.replayed = 0
        self.eager = 0
        self.warmups = 0  # zero-weight eager runs of the shapes recorded ahead
        self.failures = 0
        self.errors: list[str] = []  # each failed recording's error, first line
        self.failed: str | None = None  # set once graphs are off for the run: the last failure's first line

    def __call__(self, mb: MicroBatch, norm: Normaliser, stats: LossStats, last: bool = False) -> torch.Tensor:
        """Forward, loss and backward of host micro-batch `mb`; its loss (a device scalar), its stats added to
        `stats`. The gradient lands where the eager step puts it. `last`: the step's last micro-batch (replicas
        start their gradient sum in it)."""
        key = shape_key(mb)
        shape = self.shapes.get(key)
        if shape is None:
            shape = self.shapes[key] = _Shape(mb, self.device)
        shape.load(mb, norm)
        if self._should_record(shape):
            self._record(shape)
        if shape.replay is not None:
            loss, sums = shape.replay()
            self.replayed += 1
            if last and self.reducer is not None:
                self.reducer.start_after(shape.marked)
        else:
            # (the run's first micro-batch leaves its sum to the step's end: the narrow warm-ups follow it)
            if last and self.reducer is not None and self.eager:
                self.reducer.arm()
            loss, sums = shape.call(self.run)
            shape.ran = True
            self.eager += 1
        for name, value in sums.items():  # copied out of the pool before another replay may reuse it
            stats.add(name, value)
        loss = loss.clone()
        if self.ahead is not None:  # right after the run's first micro-batch: in step 1
            self._record_ahead(mb)
        return loss

    def _record_ahead(self, mb: MicroBatch) -> None:
        """Run once and record the shapes `ahead` gives for `mb`'s kind of micro-batch (zero-weight micro-batches:
        they add exactly nothing to the gradient) before any such micro-batch comes. The eager run compiles what
        the shape needs: a narrow row can make the compiled layers recompile, and a compile cannot happen inside
        a recording (it syncs with the host; H100: every narrow shape recorded without it failed that way)."""
        ahead, self.ahead = self.ahead, None  # once a run
        assert ahead is not None
        unit = Normaliser(1, 1)
        for warm in ahead(mb):
            key = shape_key(warm)
            if key in self.shapes or self.failed is not None:
                continue
            shape = self.shapes[key] = _Shape(warm, self.device)
            shape.load(warm, unit)
            shape.call(self.run)  # its loss and stats are dropped; its gradient is zero
            shape.ran = True
            self.warmups += 1
            self._record(shape)

    def _record(self, shape: _Shape) -> None:
        if self.reducer is not None:  # (a stand-in recorder on a CPU has no stream)
            capture = getattr(self.recorder, "capture_stream", None)
            self.reducer.arm_recording(capture() if capture is not None else None)
        try:
            shape.replay = self.recorder.record(lambda: shape.call(self.run))
            self.recorded += 1
        except RuntimeError as exc:
            self._failed(shape, exc)
        finally:
            if self.reducer is not None:
                shape.marked = self.reducer.recorded()

    def _should_record(self, shape: _Shape) -> bool:
        if self.failed is not None or shape.replay is not None or not self.eager:
            return False
        return shape.failures == 0 or (shape.failures == 1 and shape.ran)  # a retry once it ran eagerly

    def _failed(self, shape: _Shape, exc: RuntimeError) -> None:
        shape.failures += 1
        self.failures += 1
        text = str(exc).strip()
        self.errors.append(text.splitlines()[0] if text else type(exc).__name__)
        if self.on_failure is not None:
            self.on_failure()
        if shape.failures < 2:
            return
        self.failed = self.errors[-1]
        self.shapes.clear()
        warnings.warn(
            f"CUDA graphs turned off for this run: a micro-batch shape failed to record after running eagerly "
            f"({self.failed}); training goes on without them (pass --no-cuda-graphs to skip the attempt)",
            RuntimeWarning,
            stacklevel=3,
        )
