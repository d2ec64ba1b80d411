"""The disaggregated loop: `atropos train ENV --nproc-per-node N --inference-gpus K [--max-staleness S]`.

Where it sits: `run.run_training` calls `split_roles` on every rank of such a run. The first N-K ranks train
(FSDP2 over their own group when there are several; one trainer rank trains exactly as one process does), the
last K run rollout engines (`engine_loop`): env workers on the local engine of their GPU
(`versioned_engine.VersionedBackend`), producing groups into a queue the trainers consume, without ever
waiting for a step to finish unless the staleness bound says so.

The protocol, per step u (the trainer is at version u-1 when it trains the batch of step u):
- engine e makes its share of batch u's groups once the trainer has taken batch u-1-S (after each batch the
  trainer pushes its new weights, or, for a batch with nothing to train, a credit without weights; every engine
  walks the env's one item stream and keeps its share of step u's items: `data/item_stream.py`), tags every
  token with the version that produced it and sends the groups to trainer rank 0 (gloo, pickled), with the
  digest of step u's items;
- trainer rank 0 (`EngineFeed`) takes step u's groups from every engine (the engines' digests must agree: the
  first step where they do not is a warning), checks that no rollout is older than
  S (a guard: the engines' pacing already ensures it; anything older is dropped and counted), trains, and
  `AsyncSync` pushes the new weights (`weight_push.py`) and reports the batch's staleness;
- S=0 is the synchronous schedule (each batch is sampled by the weights of the step before it); S>=1 lets the
  engines generate step u+1.. while step u trains.
At the end (or on Ctrl-C, or an error) rank 0 sends a stop; each engine finishes its batch, says "end" and
returns. A dead engine rank stops the run through torchrun (launch.py names the rank).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

from atropos_cli.errors import AtroposError, PeerLost
from atropos_cli.types import ScoredGroup

from .data.draws import Draw
from .data.item_stream import StreamCheck
from .scale.distributed import Dist
from .weights.weight_push import TrainerGone, WeightPusher, WeightReceiver

__all__ = ["Roles", "split_roles", "trainer_source", "engine_loop", "staleness_metrics", "StalenessProbe"]

POLL_S = 0.2  # how often a waiting trainer looks at the Ctrl-C flag
LAUNCHER_GRACE_S = 10.0  # how long a rank that lost a peer waits for the launcher to stop it


def peer_lost(world: Dist, what: str) -> PeerLost:
    """The error of a rank whose peer's connection broke: first wait (a little) for the launcher's stop signal,
    so its one line naming the failed rank is what the user reads (this rank then exits quietly)."""
    world.stopped_by_launcher(LAUNCHER_GRACE_S)
    return PeerLost(what, hint="the launcher's line names the rank that failed")


@dataclass
class Roles:
    """This rank's part in the run and the process groups of the loop (made on every rank, in one order)."""

    world: Dist
    trainers: int
    engines: int
    control: Any  # gloo: trainer rank 0 + the engines (weight headers, stop)
    data: Any  # the run's backend (NCCL on GPU): trainer rank 0 + the engines (weight buckets)
    rollouts: list[Any]  # gloo: (trainer rank 0, engine e), one per engine (groups)
    trainer_dist: Dist | None  # the trainers' own Dist (None with one trainer rank: it trains as one process)

    @property
    def is_engine(self) -> bool:
        return self.world.rank >= self.trainers

    @property
    def engine_index(self) -> int:
        return self.world.rank - self.trainers


def split_roles(world: Dist, engines: int, timeout_s: float) -> Roles:
    import torch.distributed as dist

    trainers = world.world - engines
    timeout = timedelta(seconds=timeout_s)
    hub = [0, *range(trainers, world.world)]
    trainer_group = dist.new_group(list(range(trainers)), timeout=timeout) if trainers > 1 else None
    control = dist.new_group(hub, backend="gloo", timeout=timeout)
    data = dist.new_group(hub, timeout=timeout)
    rollouts = [dist.new_group([0, e], backend="gloo", timeout=timeout) for e in range(trainers, world.world)]
    trainer_dist = None
    if trainer_group is not None and world.rank < trainers:
        from torch.distributed.device_mesh import DeviceMesh

        mesh = DeviceMesh.from_group(trainer_group, "cuda" if world.device.startswith("cuda") else "cpu")
        trainer_dist = replace(world, world=trainers, mesh=mesh, group=trainer_group)
    return Roles(world, trainers, engines, control, data, rollouts, trainer_dist)


HISTOGRAM_TOP = 8  # the largest staleness with a histogram key of its own


def staleness_metrics(groups: list[ScoredGroup], version: int, bound: int | None) -> dict[str, float]:
    """Per-sequence staleness (trainer version - the oldest version of its tokens, at least 0): mean, max and a
    histogram `staleness_<k>` (sequences k steps behind) for k = 0..bound (None: 0..HISTOGRAM_TOP; at most
    HISTOGRAM_TOP either way), and `staleness_more` for those further behind. The keys are fixed by the bound,
    never by a version a producer sent."""
    ages = []
    for group in groups:
        meta = group.meta
        per_rollout = meta.rollouts if meta is not None and meta.rollouts else [None] * group.size
        for rollout in per_rollout:
            versions = rollout.policy_versions if rollout is not None else None
            oldest = min(versions) if versions else (meta.policy_version if meta is not None else None)
            ages.append(max(0, version - oldest) if oldest is not None else 0)
    top = HISTOGRAM_TOP if bound is None else min(bound, HISTOGRAM_TOP)
    metrics: dict[str, float] = {f"staleness_{k}": float(ages.count(k)) for k in range(top + 1)}
    metrics["staleness_more"] = float(sum(age > top for age in ages))
    metrics["staleness_mean"] = sum(ages) / len(ages) if ages else 0.0
    metrics["staleness_max"] = float(max(ages, default=0))
    return metrics


@dataclass
class _Counts:
    """The env rollouts' failure counts, summed over the engines (what the run summary reports)."""

    by_engine: dict[int, tuple[int, int]] = field(default_factory=dict)

    @property
    def failed_rollouts(self) -> int:
        return sum(r for r, _ in self.by_engine.values())

    @property
    def failed_groups(self) -> int:
        return sum(g for _, g in self.by_engine.values())


class EngineFeed:
    """Trainer rank 0's end of the queue: one receiver thread per engine, batches assembled per step."""

    def __init__(
        self, roles: Roles, groups_per_step: int, bound: int, stop: threading.Event, on_event: Callable[[str], None]
    ) -> None:
        self.roles, self.bound = roles, bound
        # Ctrl-C: with one trainer rank the feed stops the loop; several check together after each step (grpo.train)
        self.stop_flag = stop if roles.trainer_dist is None else threading.Event()
        self.groups_per_step = groups_per_step
        self.inbox: queue.Queue[tuple[int, tuple[Any, ...]]] = queue.Queue()
        self.parts: dict[int, dict[int, list[ScoredGroup]]] = {}
        self.marks: dict[int, dict[int, tuple[str, str]]] = {}  # each engine's (span, digest) of a step's items
        self.stream_check, self.on_event = StreamCheck(), on_event
        self.counts = _Counts()
        self.ended: set[int] = set()
        self.last: dict[str, float] = {}  # staleness metrics of the batch handed out last
        self.dropped_stale = 0
        self.unmatched = 0
        self.generate_s: dict[int, float] = {}  # each engine's sampling seconds so far
        self._generate_reported = 0.0
        self._threads = [threading.Thread(target=self._receive, args=(i,), daemon=True) for i in range(roles.engines)]
        for thread in self._threads:
            thread.start()

    def _receive(self, index: int) -> None:
        import torch.distributed as dist

        rank = self.roles.trainers + index
        while True:
            box: list[Any] = [None]
            try:
                dist.recv_object_list(box, src=rank, group=self.roles.rollouts[index])
            except RuntimeError as exc:  # its connection broke: the engine process is gone
                self.inbox.put((index, ("lost", f"engine rank {rank} stopped answering ({type(exc).__name__})")))
                return
            self.inbox.put((index, box[0]))
            if box[0][0] in ("end", "error", "lost"):
                return

    def _next_message(self, timeout: float | None = None) -> tuple[int, tuple[Any, ...]] | None:
        try:
            return self.inbox.get(timeout=timeout if timeout is not None else POLL_S)
        except queue.Empty:
            return None

    def _handle(self, index: int, message: tuple[Any, ...]) -> None:
        kind = message[0]
        if kind == "groups":
            _, step, groups, failed, unmatched, generate_s, mark = message
            self.parts.setdefault(step, {})[index] = groups
            self.marks.setdefault(step, {})[index] = mark
            self.generate_s[index] = generate_s
            self.counts.by_engine[index] = failed
            self.unmatched += unmatched
        elif kind == "end":
            self.ended.add(index)
        elif kind == "error":
            self.ended.add(index)
            raise AtroposError(message[1], hint="the engine rank's own error above says why")
        elif kind == "lost":
            self.ended.add(index)
            raise peer_lost(self.roles.world, message[1])

    def batches(self, trainer: Any, credit: Callable[[int, int], None]) -> Iterator[list[ScoredGroup]]:
        """Batch by batch, every engine's share of the batch's groups (engine order), staleness-checked. A batch
        the trainer took without a step (nothing to train) is credited to the engines (`credit(version, drawn)`),
        which pace on the batches taken."""
        step = trainer.batches_seen
        while True:
            step += 1
            while True:
                if self.stop_flag.is_set():
                    raise KeyboardInterrupt
                if len(self.parts.get(step, {})) == self.roles.engines:
                    break
                if self.ended - self.parts.get(step, {}).keys():  # the env's stream ended (on every engine alike)
                    return
                got = self._next_message()
                if got is not None:
                    self._handle(*got)
            parts, marks = self.parts.pop(step), self.marks.pop(step)
            warning = self.stream_check.warning([marks[i] for i in range(self.roles.engines)])
            if warning:
                self.on_event(warning)
            batch = Draw.joined(parts[i] for i in range(self.roles.engines))
            version = trainer.step_count
            yield self._checked(batch, version)
            if trainer.step_count == version:  # taken without a step: no push will tell the engines
                credit(version, trainer.batches_seen)

    def _checked(self, batch: Draw, version: int) -> Draw:
        """Drop (and count) any group with a rollout older than the bound: a guard, the pacing prevents it."""
        kept = []
        for group in batch:
            oldest = group.oldest_policy_version  # per token list as per group
            if oldest is not None and version - oldest > self.bound:
                self.dropped_stale += 1
                continue
            kept.append(group)
        self.last = staleness_metrics(kept, version, self.bound)
        self.last.update(stale_dropped=float(self.dropped_stale), versions_unmatched=float(self.unmatched))
        total = sum(self.generate_s.values())  # the engines' sampling time since the last batch (all engines)
        self.last["generate_s"], self._generate_reported = total - self._generate_reported, total
        return batch.kept(kept)

    def close(self, stop_engines: Any, timeout: float) -> None:
        """Stop the engines and take their last messages until each said "end" (or `timeout` passed)."""
        if len(self.ended) == self.roles.engines:
            return
        try:
            stop_engines()
        except RuntimeError:  # an engine is gone: nothing to stop or to wait for
            return
        deadline = time.monotonic() + timeout
        while len(self.ended) < self.roles.engines and time.monotonic() < deadline:
            got = self._next_message(timeout=1.0)
            if got is not None and got[1][0] in ("end", "error", "lost"):
                self.ended.add(got[0])
        for thread in self._threads:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))


class StalenessProbe:
    """`atropos train --api-url`: the staleness of each batch whose groups carry `meta.policy_version` (posted by
    their producers), for the step's metrics."""

    def __init__(self) -> None:
        self.last: dict[str, float] = {}

    def watch(self, batches: Any, trainer: Any) -> Iterator[list[ScoredGroup]]:
        for batch in batches:
            versioned = any(g.meta is not None and g.meta.policy_version is not None for g in batch)
            self.last = staleness_metrics(batch, trainer.step_count, None) if versioned else {}
            yield batch


class AsyncSync:
    """After each step: push the weights to the engines (every trainer rank joins the gathers) and report the
    trained batch's staleness (rank 0)."""

    def __init__(self, pusher: WeightPusher, feed: EngineFeed | None, world: Dist) -> None:
        self.pusher, self.feed, self.world = pusher, feed, world

    def __call__(self, trainer: Any) -> dict[str, Any]:
        metrics: dict[str, Any] = dict(self.feed.last) if self.feed is not None else {}
        if trainer.step_count < trainer.config.steps:  # the last step's weights have no one left to sample
            metrics.update(self.push(trainer))
        metrics["weight_version"] = trainer.step_count
        return metrics

    def push(self, trainer: Any) -> dict[str, float]:
        try:
            return self.pusher.push(trainer.model, trainer.step_count, trainer.batches_seen)
        except RuntimeError as exc:  # gloo/NCCL: a peer's connection broke
            raise peer_lost(self.world, f"the weight push to the engines failed ({type(exc).__name__})") from None


def trainer_source(opts: Any, trainer: Any, roles: Roles, stack: Any, on_event: Any) -> tuple[Any, Any, Any]:
    """(batches, after-step sync, the feed) of a trainer rank; the initial weights go out first."""
    import torch

    from .data.sources import from_rank0

    is_src = roles.world.rank == 0
    dtype = torch.bfloat16 if trainer.device.startswith("cuda") else torch.float32
    pusher = WeightPusher(roles.control, roles.data, 0, is_src, dtype, trainer.device)
    if opts.max_staleness and trainer.loss_cfg.is_mode == "none" and trainer.config.is_mode is None:
        trainer.loss_cfg = replace(trainer.loss_cfg, is_mode="truncate")  # stale rollouts: correct by π_old/μ
        on_event("--max-staleness > 0: the importance-sampling correction is on (truncate; --is-correction sets it)")
    feed = None
    if is_src:
        feed = EngineFeed(roles, opts.groups_per_step, opts.max_staleness, roles.world._stop, on_event)
        stack.callback(feed.close, pusher.stop, opts.dist_timeout)
    sync = AsyncSync(pusher, feed, roles.world)
    sync.push(trainer)  # the engines start from the trainer's (maybe resumed) weights
    batches = feed.batches(trainer, pusher.credit) if feed is not None else None
    if roles.trainer_dist is not None:
        batches = from_rank0(batches, roles.trainer_dist)
    assert batches is not None
    return batches, sync, feed


def engine_loop(opts: Any, config: Any, roles: Roles) -> bool:
    """An engine rank's whole run: sample groups for step after step until the trainer says stop. Returns
    whether Ctrl-C reached this rank (the trainers saved the checkpoint)."""
    import torch.distributed as dist

    from atropos_cli.config import ServerConfig

    from .data.rollouts import EnvRollouts
    from .weights.versioned_engine import VersionedBackend, tag_versions

    index, world = roles.engine_index, roles.world
    receiver = WeightReceiver(roles.control, roles.data, 0, world.device)
    receiver.start()
    server = {"server_type": "local", "model_name": config.model, "device": world.device}
    backend = VersionedBackend(ServerConfig(**server))
    backend.swap = receiver.apply
    group = roles.rollouts[index]

    def send(*message: Any) -> None:
        try:
            dist.send_object_list([message], dst=0, group=group)
        except RuntimeError as exc:  # the trainer rank is gone
            raise peer_lost(world, f"engine rank {world.rank} lost the trainer ({type(exc).__name__})") from None

    rollouts = EnvRollouts(  # every engine walks the one item stream and samples its share of each step's items
        opts.env or "arithmetic", opts.dotted_args, opts.env_config_path, server, backend, index, roles.engines,
        on_exhausted=opts.on_exhausted, tokenizer=config.model,
    )  # fmt: skip
    try:
        if receiver.wait_for(0, opts.dist_timeout):
            step = receiver.drawn  # the batches the trainer took: a resumed run goes on from there
            batches = rollouts.batches(opts.groups_per_step)
            # paced on the trainer's batches, trained or not (a batch with nothing to train pushes no version)
            while receiver.wait_for(step - opts.max_staleness, opts.dist_timeout, drawn=True):
                step += 1
                floor = receiver.received
                groups = next(batches, None)
                if groups is None:
                    break
                unmatched = tag_versions(groups, backend.log, floor)
                backend.log.clear()
                counts = rollouts.counts
                failed = (counts.failed_rollouts, counts.failed_groups)
                send("groups", step, groups, failed, unmatched, backend.generate_s, rollouts.block_mark)
        send("end")
    except PeerLost:
        raise
    except TrainerGone as exc:
        raise peer_lost(world, f"engine rank {world.rank}: {exc}") from None
    except Exception as exc:
        send("error", f"engine rank {world.rank}: {exc}")
        raise
    finally:
        rollouts.close()
    return world._stop.is_set()
