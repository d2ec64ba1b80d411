"""Data parallelism without sharding: every rank holds the whole model, its fp32 master and AdamW, trains its
share of the step's groups as one process would, and the gradients are summed over ranks once per step.

Where it sits: `GRPOTrainer` asks `choose()` which way a many-rank run trains (`--parallel`), and with
"replicate" hands `Precision` a `GradientSum` to call before clipping. FSDP2 (`fsdp.py`) is the other way.

Why both: FSDP2 pays host work on every layer of every micro-batch (its hooks, the all-gather copy-in/out of
each parameter: `benchmarks/results/fsdp_gpu.md`), which a 0.5B step, already host-bound, cannot hide. A
replicated step is the one-process step plus one bucketed all-reduce of the gradients at its end (not overlapped
with the backward), at the price of the whole training state on every GPU (18 bytes a parameter, bf16-pure).
Measured on 4 x H100 (NVLink), tokens/s per GPU against one process: 0.5B at 2 ranks replicate 89% vs FSDP 71%;
at 4 ranks replicate 64% vs FSDP 69%; 1.5B at 4 ranks replicate 82% vs FSDP 99%. The end-of-step all-reduce
grows with the gradient's size and the rank count while FSDP's collectives hide behind compute, so "auto"
replicates only where it won: under REPLICATE_MAX_PARAMS parameters on two ranks.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.distributed as dist

__all__ = ["choose", "state_bytes", "GradientSum", "broadcast_weights", "REPLICATE_FRACTION"]

Parallel = Literal["fsdp", "replicate"]
REPLICATE_FRACTION = 0.4  # replicate when the whole training state is at most this much of one GPU
REPLICATE_MAX_PARAMS = 1_000_000_000  # ... and the model is this small (larger: FSDP's collectives hide better)
REPLICATE_MAX_WORLD = 2  # ... on this many ranks at most (4 ranks: FSDP won, see the module docstring)
BUCKET_BYTES = 256 * 2**20  # gradients summed per all-reduce


def state_bytes(total: int, trainable: int, parallel: Parallel, world: int) -> int:
    """Bytes of weights, gradients and AdamW moments one rank holds (activations not counted).

    One process or replicate (bf16-pure): bf16 weights (2 B) + for each trained parameter an fp32 master,
    its fp32 gradient and two moments (16 B). FSDP: fp32 shards with their moments (12 B / world), the
    unsharded fp32 gradient of a step (4 B) and a layer-kept bf16 copy (2 B)."""
    if parallel == "replicate" or world == 1:
        return 2 * total + 16 * trainable
    return 12 * trainable // world + 2 * total + 4 * trainable


def choose(requested: str, device: str, world: int, total: int, trainable: int, gpu_bytes: int | None) -> Parallel:
    """`--parallel` resolved: "auto" replicates on CUDA on two ranks when the model is under REPLICATE_MAX_PARAMS
    and its whole training state fits in REPLICATE_FRACTION of one GPU (a 0.5B model), else shards (the measured
    winner each way). On a CPU, and in a one-rank group (a sharded checkpoint resumed by one process), "auto"
    shards: the layout the checkpoints and tests of those runs use."""
    if requested in ("fsdp", "replicate"):
        return requested  # type: ignore[return-value]
    if not 1 < world <= REPLICATE_MAX_WORLD or not device.startswith("cuda") or gpu_bytes is None:
        return "fsdp"
    fits = state_bytes(total, trainable, "replicate", world) <= REPLICATE_FRACTION * gpu_bytes
    return "replicate" if fits and total < REPLICATE_MAX_PARAMS else "fsdp"


def broadcast_weights(model: Any, group: Any) -> None:
    """Rank 0's weights and buffers on every rank, so replicas start equal (a LoRA adapter's random init, say)."""
    source = dist.get_global_rank(group, 0) if group is not None else 0
    with torch.no_grad():
        for tensor in (*model.parameters(), *model.buffers()):
            dist.broadcast(tensor.data, src=source, group=group)


class GradientSum:
    """Sums a list of gradients over the ranks of `group` in place: flattened into buckets of BUCKET_BYTES
    (one all-reduce each, not one per parameter), in the list's order, which every rank shares."""

    def __init__(self, group: Any) -> None:
        self.group = group

    def __call__(self, grads: list[Any]) -> None:
        bucket: list[Any] = []
        size = 0
        for grad in grads:
            if bucket and grad.dtype != bucket[0].dtype:  # one dtype a flat bucket
                self._reduce(bucket)
                bucket, size = [], 0
            bucket.append(grad)
            size += grad.numel() * grad.element_size()
            if size >= BUCKET_BYTES:
                self._reduce(bucket)
                bucket, size = [], 0
        if bucket:
            self._reduce(bucket)

    def _reduce(self, bucket: list[Any]) -> None:
        flat = torch.cat([g.reshape(-1) for g in bucket])
        dist.all_reduce(flat, group=self.group)
        pieces = flat.split([g.numel() for g in bucket])
        torch._foreach_copy_(bucket, [piece.view_as(g) for piece, g in zip(pieces, bucket, strict=True)])
