"""Data parallelism without sharding: every rank holds the whole model, its fp32 master and AdamW, trains its
share of the step's groups as one process would, and the gradients are summed over ranks during the step's last
backward.

Where it sits: `GRPOTrainer` asks `choose()` which way a many-rank run trains (`--parallel`), and with
"replicate" hands `Precision.sum_over` an `OverlappedSum`, which then owns the fp32 gradients' storage: flat
buckets of BUCKET_BYTES in the order the backward finishes them. In the last micro-batch each bucket's all-reduce
starts asynchronously as its last gradient lands (DDP's scheme: NCCL runs it on its own stream beside the
backward); the step waits for them before clipping. FSDP2 (`fsdp.py`) is the other way.

Why both: FSDP2 pays host work on every layer of every micro-batch (its hooks, the all-gather copy-in/out of
each parameter: `benchmarks/results/fsdp_gpu.md`), which a 0.5B step, already host-bound, cannot hide. A
replicated step is the one-process step plus the gradient all-reduce, at the price of the whole training state
on every GPU (18 bytes a parameter, bf16-pure). Measured on 4 x H100 (NVLink), tokens/s per GPU against one
process: BEFORE the overlap (one all-reduce after the backward) 0.5B at 2 ranks replicate 89% vs FSDP 71%, at 4
ranks replicate 64% vs FSDP 69%; 1.5B at 4 ranks replicate 82% vs FSDP 99%. WITH the overlap (2026-11-27, an
otherwise idle host): 0.5B replicate 94.9% at 2 ranks and 102.0% at 4, FSDP 75.1% at 4. So "auto" replicates a
model under REPLICATE_MAX_PARAMS parameters on up to REPLICATE_MAX_WORLD ranks (the most measured) and shards
the rest.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import torch
import torch.distributed as dist

__all__ = ["choose", "state_bytes", "OverlappedSum", "broadcast_weights", "REPLICATE_FRACTION"]

Parallel = Literal["fsdp", "replicate"]
REPLICATE_FRACTION = 0.4  # replicate when the whole training state is at most this much of one GPU
REPLICATE_MAX_PARAMS = 1_000_000_000  # ... and the model is this small (larger: FSDP's collectives hide better)
REPLICATE_MAX_WORLD = 4  # ... on this many ranks at most (measured up to 4, see the module docstring)
BUCKET_BYTES = 256 * 2**20  # gradients summed per all-reduce


def state_bytes(
    total: int,
    trainable: int,
    parallel: Parallel,
    world: int,
    grad_sync: str = "step",
    gathered: int | None = None,
    frozen_bytes: int = 2,
) -> int:
    """Bytes of weights, gradients and AdamW moments one rank holds (activations not counted).

    One process or replicate (bf16-pure): bf16 weights (2 B) + for each trained parameter an fp32 master,
    its fp32 gradient and two moments (16 B). FSDP: fp32 shards of the trained parameters with their moments
    (12 B / world), shards of the frozen ones (`frozen_bytes` / world: bf16 under bf16 compute, `fsdp.shard`),
    the gathered bf16 weights (`gathered`, `fsdp.gathered_bytes`; by default every layer's, 2 B) and the fp32
    gradient: unsharded over a step (4 B) with `grad_sync` "step", sharded (4 B / world) when reduce-scattered
    after every micro-batch."""
    if parallel == "replicate" or world == 1:
        return 2 * total + 16 * trainable
    gradient = 4 * trainable if grad_sync == "step" else 4 * trainable // world
    shards = (12 * trainable + frozen_bytes * (total - trainable)) // world
    return shards + (2 * total if gathered is None else gathered) + gradient


def choose(requested: str, device: str, world: int, total: int, trainable: int, gpu_bytes: int | None) -> Parallel:
    """`--parallel` resolved: "auto" replicates on CUDA on 2-4 ranks when the model is under REPLICATE_MAX_PARAMS
    and its whole training state fits in REPLICATE_FRACTION of one GPU (a 0.5B model), else shards (the measured
    winner each way). On a CPU, and in a one-rank group (a sharded checkpoint resumed by one process), "auto"
    shards: the layout the checkpoints and tests of those runs use."""
    if requested in ("fsdp", "replicate"):
        return requested  # type: ignore[return-value]
    if not 1 < world <= REPLICATE_MAX_WORLD or not device.startswith("cuda") or gpu_bytes is None:
        return "fsdp"
    fits = state_bytes(total, trainable, "replicate", world) <= REPLICATE_FRACTION * gpu_bytes
    return "replicate" if fits and total < REPLICATE_MAX_PARAMS else "fsdp"


def _new_mark(flat: Any) -> Any:
    """A bucket's mark: on CUDA an external event (recorded inside a graph it becomes one of its nodes, which
    every replay records again), created by one record outside any recording; on a CPU nothing to record."""
    if not flat.is_cuda:
        return _HostMark()
    event = torch.cuda.Event(external=True)
    event.record()
    return event


class _HostMark:
    def record(self, stream: Any = None) -> None:
        pass


def broadcast_weights(model: Any, group: Any) -> None:
    """Rank 0's weights and buffers on every rank, so replicas start equal (a LoRA adapter's random init, say)."""
    source = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            dist.broadcast(tensor.data, src=source, group=group)


class OverlappedSum:
    """The replicas' gradients summed over the ranks of `group`, bucket by bucket, while the step's last backward
    still runs (DDP's scheme): the gradients live in flat buffers of about BUCKET_BYTES (`.grad` of each tensor is
    a view into one), laid out in reverse order, the order the backward finishes them; in the last micro-batch
    (`arm()`) each finished gradient is reported (`ready`) and a bucket whose every gradient is final starts its
    all-reduce at once (`async_op=True`: NCCL runs it on its own stream while the backward goes on). Buckets start
    strictly in order, so every rank issues the same collectives in the same order; `finish()` starts those left
    (a rank that trained nothing, a gradient that never came) and waits for all of them.

    Events: each tensor expects one `ready` per armed backward (its post-accumulate hook), or what `expect` says
    (the LM head's gradient also lands through a sink, `Precision.grad_sink`). A gradient reported after its
    bucket started would be lost to the sum: that raises instead."""

    def __init__(self, tensors: list[Any], group: Any, bucket_bytes: int | None = None) -> None:
        bucket_bytes = bucket_bytes or BUCKET_BYTES
        self.group = group
        self.flats: list[Any] = []
        self._slot: dict[int, int] = {}  # id(tensor) -> its bucket (ids only: hooks hold this object, no cycles)
        self._count: dict[int, int] = {}  # id(tensor) -> events it expects per armed backward
        members: list[list[Any]] = []
        size = 0
        for t in reversed(tensors):
            nbytes = t.numel() * t.element_size()
            if not members or t.dtype != members[-1][0].dtype or size + nbytes > bucket_bytes:
                members.append([])
                size = 0
            members[-1].append(t)
            size += nbytes
        for index, bucket in enumerate(members):
            flat = torch.zeros(sum(t.numel() for t in bucket), dtype=bucket[0].dtype, device=bucket[0].device)
            offset = 0
            for t in bucket:
                t.grad = flat[offset : offset + t.numel()].view_as(t)
                offset += t.numel()
                self._slot[id(t)] = index
                self._count[id(t)] = 1
            self.flats.append(flat)
        self.armed = False
        self._left: list[int] = []
        self._handles: list[Any] = []
        # inside a CUDA graph recording a finished bucket is marked instead (`arm_recording`): an event per bucket
        self._marks: list[Any] | None = None
        self._recording = False
        self._capture: Any = None  # the recording's stream
        self._side: Any = None  # the stream the replayed step's sums are started from (`start_after`)
        self.early = 0  # buckets of the last step started during the backward (the rest by finish())
        self.launch_order: list[int] = []  # the last step's buckets in the order they started
        self.launch_times: list[float] = []  # and when (time.perf_counter())

    def expect(self, tensor: Any, events: int) -> None:
        """`tensor`'s gradient is final after this many `ready` reports per armed backward."""
        self._count[id(tensor)] = events

    def arm(self) -> None:
        """The next backward is the step's last: report gradients and start buckets as they complete."""
        self._left = [0] * len(self.flats)
        for key, index in self._slot.items():
            self._left[index] += self._count[key]
        self._handles, self.launch_order, self.launch_times, self.early, self.armed = [], [], [], 0, True

    def arm_recording(self, stream: Any = None) -> None:
        """A CUDA graph of a micro-batch is about to be recorded on `stream` (`graphs.MicroBatchGraphs`): a bucket
        that completes inside it is marked, not started: an event recorded into the graph where its gradients are
        final (on `stream` explicitly: the backward's hooks run on autograd's own thread). A replay runs no
        Python, so no hook can start a sum then; `start_after` starts each bucket behind its mark once the step's
        last micro-batch was replayed. No collective is issued inside a recording."""
        if self._marks is None:  # created (and recorded once) outside any recording
            self._marks = [_new_mark(flat) for flat in self.flats]
        self.arm()
        self._recording, self._capture = True, stream

    def recorded(self) -> int:
        """The recording ended (or failed): how many buckets, in order, it marked as final; disarmed."""
        marked = len(self._handles) if self._recording else 0  # (a mark each, in `_launch`)
        self._handles, self.armed, self._recording, self._capture = [], False, False, None
        return marked

    def start_after(self, marked: int) -> None:
        """The step's last micro-batch was a replay whose recording marked its first `marked` buckets final:
        start each one's sum behind its mark (on a side stream: the replay's remaining work goes on beside it);
        `finish` starts the others. The marks are the latest the GPU recorded: that replay's own."""
        self.arm()  # (a replay runs no hooks: nothing reports to it)
        marks = self._marks or []
        for index in range(min(marked, len(marks))):
            if self.flats[index].is_cuda:
                if self._side is None:
                    self._side = torch.cuda.Stream(device=self.flats[index].device)
                self._side.wait_event(marks[index])
                with torch.cuda.stream(self._side):
                    self._launch()
            else:  # gloo on a CPU: the replay has already finished
                self._launch()
            self.early += 1

    def ready(self, tensors: list[Any]) -> None:
        if not self.armed:
            return
        for t in tensors:
            index = self._slot.get(id(t))
            if index is None:
                continue
            if index < len(self._handles):
                raise RuntimeError(f"a gradient came after its bucket's all-reduce started (bucket {index})")
            self._left[index] -= 1
        while len(self._handles) < len(self.flats) and self._left[len(self._handles)] <= 0:
            self._launch()
            self.early += 1

    def _launch(self) -> None:
        index = len(self._handles)
        if self._recording and self._marks is not None:
            self._marks[index].record(self._capture)  # into the recording, behind the bucket's gradient kernels
            self._handles.append(None)
            return
        self.launch_order.append(index)
        self.launch_times.append(time.perf_counter())
        self._handles.append(dist.all_reduce(self.flats[index], group=self.group, async_op=True))

    def finish(self) -> None:
        """Start the buckets not started yet (in order) and wait for every one; the gradients are then summed."""
        if not self.armed:  # no backward this step on this rank: its zeros still join the sum
            self.arm()
        while len(self._handles) < len(self.flats):
            self._launch()
        for handle in self._handles:
            handle.wait()
        self.armed = False

    def zero(self) -> None:
        torch._foreach_zero_(self.flats)
