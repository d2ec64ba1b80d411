"""Pure batching logic of the trajectory API: which queued groups go into the next batch. No HTTP, no I/O.

Sits between ingest (`store.py` hands us `QueuedGroup` handles, never payloads) and `GET /batch` (which turns
the chosen handles into bytes). The rules follow Atropos' `run-api` batching:

- every batch has exactly `batch_size` sequences and never splits a group (a group larger than batch_size is
  refused at ingest: no batch could hold it);
- groups smaller than the largest group size M are combined into "packs" of exactly M sequences (groups of
  one size bucket, FIFO), so a batch is a whole number of packs (sizes are expected to divide M);
- a registered env's group whose size differs from the env's `group_size` waits in a per-env buffer until
  buffered groups sum exactly to `group_size` (FIFO first, then a subset-sum search), then enters the queue;
- when that packing fails but some queued groups sum exactly to `batch_size` (sizes that do not divide M, e.g.
  one 12-rollout group among 8s), the oldest such groups form the batch (ours: Atropos would wait forever);
- `min_batch_allocation`: each env with a minimum first gets `int(batch_size * min)` sequences (scaled down
  proportionally when minimums exceed the batch), the rest is filled in queue order;
- optional `mix="weighted"`: a batch is split between connected envs in proportion to their weights (ours;
  off by default because Atropos' trainer expects plain FIFO).

Batches go out oldest first: groups are taken in arrival order. Packing walks the queue only until the batch
is full, so forming a batch is O(batch) in the common case, never O(queue^2).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["QueuedGroup", "EnvSlot", "BatchQueue", "find_subset", "exact_counts", "MixMode"]

MixMode = Literal["fifo", "weighted"]


@dataclass(slots=True)
class QueuedGroup:
    """A handle on one stored group: its id (arrival order), env and number of sequences."""

    gid: int
    env_id: int | None
    size: int


@dataclass(slots=True)
class EnvSlot:
    """What the queue needs to know about a registered env."""

    env_id: int
    group_size: int
    weight: float = 1.0
    min_batch_allocation: float | None = None
    max_token_length: int = 0
    connected: bool = True
    buffer: list[QueuedGroup] = field(default_factory=list)


def find_subset(sizes: list[int], target: int) -> list[int] | None:
    """Indices of sizes summing exactly to target: a FIFO greedy pass, then a DP preferring earlier indices."""
    total, picked = 0, []
    for i, size in enumerate(sizes):
        if total + size <= target:
            total += size
            picked.append(i)
            if total == target:
                return picked
    # reach[s] = indices forming sum s, built in index order so earlier indices win ties.
    reach: dict[int, list[int]] = {0: []}
    for i, size in enumerate(sizes):
        for s, idx in list(reach.items()):
            t = s + size
            if t <= target and t not in reach:
                reach[t] = [*idx, i]
        if target in reach:
            return reach[target]
    return None


class BatchQueue:
    """FIFO queue of group handles plus per-env buffers; forms exact-size batches."""

    def __init__(self, batch_size: int = -1, mix: MixMode = "fifo") -> None:
        self.batch_size = batch_size
        self.mix: MixMode = mix
        self.queue: OrderedDict[int, QueuedGroup] = OrderedDict()
        self.by_env: dict[int | None, OrderedDict[int, QueuedGroup]] = {}
        self.envs: dict[int, EnvSlot] = {}
        self._sizes: Counter[int] = Counter()
        self._env_seqs: Counter[int | None] = Counter()  # kept incrementally: /status-env is polled 10x/s
        self._no_exact: tuple[tuple[int, int], ...] | None = None  # queue sizes for which _exact found nothing

    # ---- ingest -------------------------------------------------------------------------------------
    def add(self, group: QueuedGroup) -> list[QueuedGroup]:
        """Queue a group (or buffer it, for a mixed-size env group). Returns the groups that entered the queue."""
        env = self.envs.get(group.env_id) if group.env_id is not None else None
        if env is None or group.size == env.group_size:
            self.enqueue(group)
            return [group]
        env.buffer.append(group)
        picked = find_subset([g.size for g in env.buffer], env.group_size)
        if picked is None:
            return []
        moved = [env.buffer[i] for i in picked]
        chosen = set(picked)
        env.buffer = [g for i, g in enumerate(env.buffer) if i not in chosen]
        for g in moved:
            self.enqueue(g)
        return moved

    def enqueue(self, group: QueuedGroup) -> None:
        self.queue[group.gid] = group
        self.by_env.setdefault(group.env_id, OrderedDict())[group.gid] = group
        self._sizes[group.size] += 1
        self._env_seqs[group.env_id] += group.size

    def remove(self, groups: Iterable[QueuedGroup]) -> None:
        for g in groups:
            del self.queue[g.gid]
            del self.by_env[g.env_id][g.gid]
            self._sizes[g.size] -= 1
            self._env_seqs[g.env_id] -= g.size
            if not self._sizes[g.size]:
                del self._sizes[g.size]

    def clear(self) -> None:
        self.queue.clear()
        self.by_env.clear()
        self._sizes.clear()
        self._env_seqs.clear()
        for env in self.envs.values():
            env.buffer.clear()

    # ---- counts -------------------------------------------------------------------------------------
    @property
    def max_group_size(self) -> int:
        return max(self._sizes, default=1)

    def buffered_count(self) -> int:
        return sum(len(e.buffer) for e in self.envs.values())

    def env_sequences(self, env_id: int | None) -> int:
        return self._env_seqs.get(env_id, 0)

    # ---- batch formation ----------------------------------------------------------------------------
    def take_batch(self) -> list[QueuedGroup] | None:
        """Remove and return the groups of the next exact-size batch, or None when the queue cannot fill one."""
        if self.batch_size <= 0 or not self.queue:
            return None
        minimums = self._minimums()
        if self.mix == "weighted":
            chosen = self._weighted()
        elif minimums:
            chosen = self._with_minimums(minimums)
        else:
            chosen = _fill(_packs(self.queue.values(), self.max_group_size), self.batch_size, set())
            chosen = chosen if chosen is not None else self._exact()
        if chosen is None:
            return None
        self.remove(chosen)
        return chosen

    def _exact(self) -> list[QueuedGroup] | None:
        """Fallback when packing by the largest size M fails because sizes do not divide M (a 12 among 8s): the
        oldest groups whose sizes sum exactly to batch_size, if any combination does. Remembered per multiset
        of queued sizes, so polling an unfillable queue costs nothing."""
        key = tuple(sorted(self._sizes.items()))
        if key == self._no_exact or sum(s * c for s, c in key) < self.batch_size:
            return None
        counts = exact_counts(dict(key), self.batch_size)
        if counts is None:
            self._no_exact = key
            return None
        taken: list[QueuedGroup] = []
        for g in self.queue.values():
            if counts.get(g.size, 0) > 0:
                counts[g.size] -= 1
                taken.append(g)
        return taken

    def _minimums(self) -> dict[int, int]:
        mins = {e.env_id: e.min_batch_allocation for e in self.envs.values() if e.connected and e.min_batch_allocation}
        if not mins:
            return {}
        total = sum(mins.values())
        scale = 1.0 / total if total > 1.0 else 1.0
        return {env_id: max(1, int(self.batch_size * m * scale)) for env_id, m in mins.items()}

    def _with_minimums(self, minimums: dict[int, int]) -> list[QueuedGroup] | None:
        m = self.max_group_size
        taken: list[QueuedGroup] = []
        seen: set[int] = set()
        for env_id, need in minimums.items():
            got = 0
            for pack in _packs(self.by_env.get(env_id, {}).values(), m):
                if got >= need:
                    break
                taken.extend(pack)
                got += sum(g.size for g in pack)
            if got == 0:
                return None  # an env with a minimum has no packable data: wait for it (as Atropos does)
            seen.update(g.gid for g in taken)
        rest = self.batch_size - sum(g.size for g in taken)
        if rest < 0:
            return None
        more = _fill(_packs((g for g in self.queue.values() if g.gid not in seen), m), rest, seen)
        return None if more is None else taken + more

    def _weighted(self) -> list[QueuedGroup] | None:
        """Split the batch between connected envs in proportion to weight; an env short of data yields its share."""
        m = self.max_group_size
        envs = [e for e in self.envs.values() if e.connected and e.weight > 0 and self.by_env.get(e.env_id)]
        total_w = sum(e.weight for e in envs)
        streams = {e.env_id: _packs(self.by_env[e.env_id].values(), m) for e in envs}
        target = {e.env_id: self.batch_size * e.weight / total_w for e in envs} if envs else {}
        got = dict.fromkeys(streams, 0)
        taken: list[QueuedGroup] = []
        total = 0
        while total < self.batch_size and streams:
            env_id = max(streams, key=lambda k: target[k] - got[k])
            pack = next(streams[env_id], None)
            n = sum(g.size for g in pack) if pack else 0
            if pack is None or total + n > self.batch_size:
                del streams[env_id]
                continue
            taken.extend(pack)
            got[env_id] += n
            total += n
        if total < self.batch_size:
            # Groups of unregistered envs (env_id None) may fill what the weighted envs could not.
            seen = {g.gid for g in taken}
            more = _fill(
                _packs((g for g in self.queue.values() if g.gid not in seen), m), self.batch_size - total, seen
            )
            if more is None:
                return None
            taken.extend(more)
        return sorted(taken, key=lambda g: g.gid)


def exact_counts(sizes: dict[int, int], target: int) -> dict[int, int] | None:
    """How many groups of each size (at most the count available) sum exactly to target; None if impossible.
    A bounded knapsack over the distinct sizes: O(distinct sizes x target x count)."""
    reach: dict[int, dict[int, int]] = {0: {}}
    for size, count in sorted(sizes.items(), reverse=True):
        for total, picked in list(reach.items()):
            for k in range(1, min(count, (target - total) // size) + 1):
                reach.setdefault(total + k * size, {**picked, size: k})
        if target in reach:
            return dict(reach[target])
    return None


def _packs(groups: Iterable[QueuedGroup], m: int) -> Iterator[list[QueuedGroup]]:
    """Lazily yield packs of exactly m sequences, bucketing groups by size in arrival order."""
    buckets: dict[int, list[QueuedGroup]] = {}
    for g in groups:
        if g.size > m:
            continue
        if g.size == m:
            yield [g]
            continue
        bucket = buckets.setdefault(g.size, [])
        bucket.append(g)
        if sum(x.size for x in bucket) == m:
            yield bucket
            buckets[g.size] = []


def _fill(packs: Iterator[list[QueuedGroup]], target: int, exclude: set[int]) -> list[QueuedGroup] | None:
    """Take packs in order until exactly `target` sequences; a pack that would overshoot is skipped."""
    if target == 0:
        return []
    taken: list[QueuedGroup] = []
    total = 0
    for pack in packs:
        n = sum(g.size for g in pack)
        if total + n > target or any(g.gid in exclude for g in pack):
            continue
        taken.extend(pack)
        total += n
        if total == target:
            return taken
    return None
