"""Weights from the trainer ranks to the rollout-engine ranks over the process group: flat buckets, no disk.

Where it sits: the disaggregated loop (`async_loop.py`, `--inference-gpus K`). After every optimizer step each
trainer rank calls `WeightPusher.push(model, version)`: the sharded parameters are gathered one at a time
(`fsdp.full_weights`, a collective among the trainer ranks), and trainer rank 0 casts each to the engines'
dtype, lays them end to end in flat buckets of `BUCKET_BYTES` and broadcasts each bucket to the engine ranks
(NCCL on GPU, gloo on CPU). A small header goes first on a gloo group (the version, the layout: key, shape and
place of every tensor, and the bucket sizes), so an engine knows what to receive.

On an engine rank a `WeightReceiver` thread receives into one of two bucket sets while the engine keeps
generating; the received set becomes `pending`. The engine applies it at its next swap point (`apply`, called
in the model thread between two decode steps: a plain copy into the model's tensors), so a forward never sees
half-old, half-new weights. On CUDA the copy is queued on the engine's stream (behind a decode replay in
flight); the next push into the same bucket set waits for it on the GPU. A newer push that lands before the
older one was applied replaces it (the engine skips a version, it never goes back). A header with version -1
is the trainer's stop.

Every header also carries `drawn`: the batches the trainer has taken so far, trained or not (a draw with nothing
to train takes no step, so no new version: `WeightPusher.credit` then sends a header without weights). The
engines pace their draws on it (`wait_for(..., drawn=True)`), so a skipped draw never leaves them waiting for a
version that will not come.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from ..scale.fsdp import full_weights

__all__ = ["WeightPusher", "WeightReceiver", "Layout", "STOP", "BUCKET_BYTES", "TrainerGone"]

BUCKET_BYTES = 256 << 20  # one broadcast's payload: big enough to reach the link's bandwidth, small to stage
STOP = -1
POLL_S = 0.0005  # how often the receiver checks that a push's buckets have landed on the engine's GPU


class TrainerGone(RuntimeError):
    """The receiver's connection to the trainer broke (the trainer rank died)."""


@dataclass(frozen=True)
class Layout:
    """Where each tensor sits: (key, shape, bucket, offset) in push order, and each bucket's element count."""

    entries: tuple[tuple[str, tuple[int, ...], int, int], ...]
    bucket_numels: tuple[int, ...]
    dtype: str  # torch dtype name, e.g. "float32"


def _plan(shapes: list[tuple[str, tuple[int, ...]]], element_bytes: int, dtype: str) -> Layout:
    limit = max(1, BUCKET_BYTES // element_bytes)
    entries: list[tuple[str, tuple[int, ...], int, int]] = []
    numels: list[int] = []
    used = 0
    for key, shape in shapes:
        n = 1
        for d in shape:
            n *= d
        if not numels or (used + n > limit and used > 0):
            numels.append(0)
            used = 0
        entries.append((key, tuple(shape), len(numels) - 1, used))
        used += n
        numels[-1] = used
    return Layout(tuple(entries), tuple(numels), dtype)


class WeightPusher:
    """The trainer's side: every trainer rank calls `push` (the gathers are collective); `src` broadcasts."""

    def __init__(self, control: Any, data: Any, src: int, is_src: bool, dtype: Any, device: str) -> None:
        self.control, self.data, self.src, self.is_src = control, data, src, is_src
        self.dtype, self.device = dtype, device
        self.layout: Layout | None = None

    def push(self, model: Any, version: int, drawn: int) -> dict[str, float]:
        """Send `model`'s weights as `version`, after `drawn` batches; returns {push_s, push_bytes} (rank `src`;
        zeros elsewhere)."""
        import torch
        import torch.distributed as dist

        started = time.perf_counter()
        weights = full_weights(model)
        if not self.is_src:
            for _ in weights:  # join the gathers
                pass
            return {}
        if self.layout is None:  # the first push learns the layout (one materialised copy, at start-up only)
            tensors = [(k, t.detach().to(self.device, self.dtype)) for k, t in weights]
            element = torch.empty((), dtype=self.dtype).element_size()
            self.layout = _plan([(k, tuple(t.shape)) for k, t in tensors], element, str(self.dtype).split(".")[-1])
            weights = iter(tensors)
        layout = self.layout
        header = {"version": version, "layout": layout, "drawn": drawn}
        dist.broadcast_object_list([header], src=self.src, group=self.control)
        sent = 0
        bucket, filling = None, -1
        for (key, shape, index, offset), (name, tensor) in zip(layout.entries, weights, strict=True):
            if name != key or tuple(tensor.shape) != shape:
                raise RuntimeError(f"weight push: expected {key} {shape}, got {name} {tuple(tensor.shape)}")
            if index != filling:
                if bucket is not None:
                    dist.broadcast(bucket, src=self.src, group=self.data)
                    sent += bucket.numel() * bucket.element_size()
                bucket = torch.empty(layout.bucket_numels[index], dtype=self.dtype, device=self.device)
                filling = index
            assert bucket is not None
            bucket[offset : offset + tensor.numel()].copy_(tensor.detach().reshape(-1))
        if bucket is not None:
            dist.broadcast(bucket, src=self.src, group=self.data)
            sent += bucket.numel() * bucket.element_size()
        return {"push_s": time.perf_counter() - started, "push_bytes": float(sent)}

    def credit(self, version: int, drawn: int) -> None:
        """Tell the engines the trainer took a batch without a step (nothing to train): still `version`, now
        `drawn` batches (rank `src` only)."""
        import torch.distributed as dist

        header = {"version": version, "layout": None, "drawn": drawn}
        dist.broadcast_object_list([header], src=self.src, group=self.control)

    def stop(self) -> None:
        """Tell the engines the run is over (rank `src` only)."""
        import torch.distributed as dist

        if self.is_src:
            dist.broadcast_object_list([{"version": STOP, "layout": None}], src=self.src, group=self.control)


@dataclass
class _Received:
    version: int
    layout: Layout
    buckets: list[Any]


@dataclass
class WeightReceiver:
    """The engine's side: a thread receives pushes; `apply(model)` swaps the newest in between decode steps."""

    control: Any
    data: Any
    src: int
    device: str
    version: int = -1  # the version the model computes with (-1: the engine's own load, before the first push)
    received: int = -1  # the newest version received (applied or pending)
    drawn: int = -1  # the batches the trainer had taken at the newest header
    stopped: bool = False
    error: str | None = None
    _pending: _Received | None = None
    _sets: list[list[Any] | None] = field(default_factory=lambda: [None, None])
    _applying: int = -1  # the bucket set being copied into the model
    _copied: list[Any] = field(default_factory=lambda: [None, None])  # CUDA: each set's last copy, as an event
    _cond: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None
    _stream: Any = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="atropos-weight-receiver", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        try:
            if self.device.startswith("cuda"):
                import torch

                torch.cuda.set_device(self.device)  # a thread starts on cuda:0 whatever the process chose
                self._stream = torch.cuda.Stream()
            while self._receive_one():
                pass
        except Exception as exc:  # the trainer died or the group broke: the engine stops with this reason
            with self._cond:
                self.error = f"{type(exc).__name__}: {exc}"
                self._cond.notify_all()

    def _receive_one(self) -> bool:
        import torch
        import torch.distributed as dist

        box: list[Any] = [None]
        dist.broadcast_object_list(box, src=self.src, group=self.control)
        header = box[0]
        if header["version"] == STOP:
            with self._cond:
                self.stopped = True
                self._cond.notify_all()
            return False
        if header["layout"] is None:  # a credit: a batch taken without a step, no new weights
            with self._cond:
                self.drawn = header["drawn"]
                self._cond.notify_all()
            return True
        layout: Layout = header["layout"]
        with self._cond:  # a set that is neither pending nor being applied (waits while both are busy)
            while True:
                pending = self._pending
                free = [i for i in (0, 1) if i != self._applying and not (pending and self._sets[i] is pending.buckets)]
                if free:
                    break
                self._cond.wait()
        slot = free[0]
        if self._stream is not None and self._copied[slot] is not None:  # the copy out of this set may still be
            self._stream.wait_event(self._copied[slot])  # queued behind a decode replay: receive after it (GPU side)
        buckets = self._sets[slot]
        if buckets is None or [b.numel() for b in buckets] != list(layout.bucket_numels):
            # both sets at once, at the first push: no allocation later, while the engine may capture a CUDA graph
            dtype = getattr(torch, layout.dtype)
            self._sets = [
                [torch.empty(n, dtype=dtype, device=self.device) for n in layout.bucket_numels] for _ in (0, 1)
            ]
            buckets = self._sets[slot]
        assert buckets is not None
        if self._stream is not None:  # NCCL on a side stream of the engine's GPU; complete before the swap reads
            with torch.cuda.stream(self._stream):
                for bucket in buckets:
                    dist.broadcast(bucket, src=self.src, group=self.data)
                done = torch.cuda.Event()
                done.record()
            # polled, not synchronize(): a blocking sync in this thread is forbidden while the engine's thread
            # captures a CUDA graph (global capture mode); a query is not
            while not done.query():
                time.sleep(POLL_S)
        else:
            for bucket in buckets:
                dist.broadcast(bucket, src=self.src, group=self.data)
        with self._cond:
            self._pending = _Received(header["version"], layout, buckets)
            self.received, self.drawn = header["version"], header["drawn"]
            self._cond.notify_all()
        return True

    def apply(self, model: Any) -> int:
        """In the model thread, between forwards: copy the newest received weights in; returns the version."""
        import torch

        with self._cond:
            got, self._pending = self._pending, None
            if got is None:
                return self.version
            self._applying = next(i for i, s in enumerate(self._sets) if s is got.buckets)  # by identity
        try:
            state = model.state_dict()
            with torch.no_grad():
                for key, shape, index, offset in got.layout.entries:
                    n = 1
                    for d in shape:
                        n *= d
                    state[key].copy_(got.buckets[index][offset : offset + n].view(shape))
            if self._stream is not None:  # the copies are queued (maybe behind a replay in flight)
                done = torch.cuda.Event()
                done.record()
                self._copied[self._applying] = done
        finally:
            with self._cond:
                self._applying = -1
                self.version = got.version
                self._cond.notify_all()
        return got.version

    def wait_for(self, version: int, timeout: float, drawn: bool = False) -> bool:
        """Block until a push of at least `version` arrived (`drawn`: until the trainer has taken at least that
        many batches); False when the trainer stopped the run first. A broken connection to the trainer raises
        TrainerGone."""
        from atropos_cli.errors import AtroposError

        deadline = time.monotonic() + timeout
        with self._cond:
            while (self.drawn if drawn else self.received) < version and not self.stopped and self.error is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    what = f"{version} batches taken" if drawn else f"weights of version {version}"
                    raise AtroposError(
                        f"no word of {what} from the trainer after {timeout:.0f}s",
                        hint="the trainer rank is stuck or gone; raise --dist-timeout for very slow steps",
                    )
                self._cond.wait(min(left, 1.0))
            if self.error is not None and not self.stopped:
                raise TrainerGone(f"the trainer stopped pushing weights ({self.error})")
            return not self.stopped
