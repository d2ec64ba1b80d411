"""The process group of a many-GPU run: who this rank is, the few collectives the trainer uses, and how a
step's groups are split between ranks.

Where it sits: `atropos train --nproc-per-node N` (or plain `torchrun ... -m atropos_cli train ...`) starts one
process per GPU; each calls `init_from_env()`, which joins the group torchrun describes in its environment
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): NCCL on CUDA (one GPU per local rank), gloo on CPU. Every
collective carries the run's `--dist-timeout`: a rank that stops answering makes the others fail with an
error instead of waiting forever (and torchrun stops every rank when one process dies).

The data rule: every rank sees the WHOLE batch of a step (the same files in the same order, the batch rank 0
pulled from the trajectory API and broadcast, or every rank's env rollouts gathered), so advantages, metrics
and the loss normaliser are computed identically everywhere; each rank then trains the groups `assign_groups`
gives it. Groups are never split; when their count does not divide by the world size, ranks get unequal
numbers of groups (balanced by tokens, nothing dropped) and a rank with fewer micro-batches runs zero-weight
ones so every rank makes the same collective calls.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from atropos_cli.errors import ConfigError

__all__ = ["Dist", "init_from_env", "in_launcher", "assign_groups", "world_from_env"]


def in_launcher() -> bool:
    """True in a process started by torchrun (or `--nproc-per-node`)."""
    return "TORCHELASTIC_RUN_ID" in os.environ or ("RANK" in os.environ and "WORLD_SIZE" in os.environ)


def world_from_env() -> tuple[int, int]:
    """(rank, world size) torchrun set, or (0, 1) outside a launcher."""
    if not in_launcher():
        return 0, 1
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


@dataclass
class Dist:
    """This process's place in the run and the collectives the trainer needs (all with the run's timeout)."""

    rank: int
    world: int
    local_rank: int
    device: str  # cuda:<local rank> or cpu
    mesh: Any  # a 1-D DeviceMesh over all ranks (FSDP shards along it)
    _stop: threading.Event = field(default_factory=threading.Event)
    group: Any = None  # the process group of these collectives (None: every rank; async_loop.py: the trainers)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's `obj` on every rank (pickled)."""
        import torch.distributed as dist

        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]

    def gather(self, obj: Any) -> list[Any]:
        """Every rank's `obj`, in rank order, on every rank."""
        import torch.distributed as dist

        out: list[Any] = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def sum_floats(self, values: dict[str, float]) -> dict[str, float]:
        """Key-wise sums over ranks (a key missing on a rank counts as 0)."""
        total: dict[str, float] = {}
        for part in self.gather(values):
            for key, value in part.items():
                total[key] = total.get(key, 0.0) + value
        return total

    def max_int(self, value: int) -> int:
        import torch
        import torch.distributed as dist

        t = torch.tensor([value], device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        return int(t.item())

    def stop_requested(self) -> bool:
        """True on every rank once any rank got Ctrl-C or SIGTERM (`catch_stop_signals`): checked after each
        step, so all ranks stop at the same step and write one checkpoint together."""
        return bool(self.max_int(int(self._stop.is_set())))

    def catch_stop_signals(self) -> None:
        """Ctrl-C and SIGTERM set a flag instead of interrupting: a rank stopped in the middle of a collective
        would leave the others waiting, and the launcher forwards the signal to every rank anyway."""
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: self._stop.set())

    def stopped_by_launcher(self, grace_s: float = 10.0) -> bool:
        """Whether the launcher's stop signal came (waiting up to `grace_s` for it): after a collective failed,
        True means a peer rank died and the launcher, which names it in its one line, is stopping every rank;
        False, that this rank's own error is the news."""
        deadline = time.monotonic() + grace_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            time.sleep(0.2)  # polled: the flag is set by a signal handler on this very thread
        return self._stop.is_set()

    def barrier(self) -> None:
        import torch.distributed as dist

        if self.device.startswith("cuda"):
            dist.barrier(group=self.group, device_ids=[self.local_rank])
        else:
            dist.barrier(group=self.group)

    def close(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def init_from_env(device: str, timeout_s: float) -> Dist:
    """Join the process group torchrun describes (or a one-process group outside a launcher, so a sharded
    checkpoint can be resumed by a plain `atropos train --resume`)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    rank, world = world_from_env()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() if device == "auto" else device.startswith("cuda")
    if cuda:
        if local_rank >= torch.cuda.device_count():
            raise ConfigError(
                f"local rank {local_rank} has no GPU: this node has {torch.cuda.device_count()}",
                hint="pass --nproc-per-node at most the number of GPUs (or CUDA_VISIBLE_DEVICES)",
            )
        torch.cuda.set_device(local_rank)
    backend = "nccl" if cuda else "gloo"
    timeout = timedelta(seconds=timeout_s)
    if not dist.is_initialized():
        if in_launcher():
            dist.init_process_group(backend, timeout=timeout)
        else:
            store = dist.HashStore()
            dist.init_process_group(backend, store=store, rank=0, world_size=1, timeout=timeout)
    where = f"cuda:{local_rank}" if cuda else "cpu"
    mesh = init_device_mesh("cuda" if cuda else "cpu", (world,))
    return Dist(rank=rank, world=world, local_rank=local_rank, device=where, mesh=mesh)


def assign_groups(loads: list[int], world: int) -> list[list[int]]:
    """Group indices per rank: whole groups, the heaviest first onto the least loaded rank (ties: lower rank).

    Deterministic, so every rank computes the same split from the same batch without talking. With fewer
    groups than ranks some ranks get none (they run zero-weight micro-batches); nothing is dropped."""
    ranks: list[list[int]] = [[] for _ in range(world)]
    totals = [0] * world
    for index in sorted(range(len(loads)), key=lambda i: (-loads[i], i)):
        target = min(range(world), key=lambda r: (totals[r], r))
        ranks[target].append(index)
        totals[target] += loads[index]
    return [sorted(r) for r in ranks]
