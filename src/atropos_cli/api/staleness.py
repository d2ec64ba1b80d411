"""The trajectory API's staleness bound: how far behind the trainer a queued group's policy may be.

A producer posts the policy version that sampled a group in `meta.policy_version` (the trainer step of its
oldest token; optional, Atropos' envs do not send it). The batch formed as step k is trained by a trainer at
version k-1, so a group with version v served in it is `k-1-v` steps stale. With `--max-staleness S`:
- `hold` (the default) never drops work: `/status` and `/status-env` carry `max_staleness`, and producers
  (`atropos serve`) pause new rollouts while the queue already holds S+1 batches, so what they post next is
  served within S steps; groups served staler anyway are counted (`stale_served`);
- `drop`: a group that is already more than S steps stale is refused at ingest (answered `dropped`) or
  removed from the queue before a batch forms; every drop is counted (`stale_dropped`), never silent.
Groups without a version are never dropped. A group's version is the oldest of `meta.policy_version` and every
per-token list (`meta.rollouts[i].policy_versions`), so an old token list cannot hide behind a new group version;
versions are JSON integers in [0, 2**31-1] (`types.PolicyVersion`) and a version ahead of the trainer's step by
more than `VERSION_MARGIN` is refused (422): no policy has it yet, and it could never count as stale.
Pure logic; `service.py` calls it and persists what it removes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from atropos_cli.api.queue import BatchQueue, QueuedGroup

__all__ = ["StaleMode", "StalenessGuard", "VERSION_MARGIN"]

VERSION_MARGIN = 1
"""How far ahead of the API's step a posted policy version may be (a trainer registers its step; a producer
posts the step whose weights sampled, at most the step just served)."""

StaleMode = Literal["hold", "drop"]


@dataclass
class StalenessGuard:
    bound: int | None = None  # None: no bound (Atropos' behaviour)
    mode: StaleMode = "hold"
    versions: dict[int, int] = field(default_factory=dict)  # gid -> policy version (groups that sent one)
    dropped: int = 0
    served_stale: int = 0

    def note(self, gid: int, version: int | None) -> None:
        if version is not None:
            self.versions[gid] = version

    def refuses(self, version: int | None, step: int) -> bool:
        """Drop mode: a group arriving more than `bound` steps behind the trainer's next step is refused."""
        if self.mode != "drop" or self.bound is None or version is None or step - version <= self.bound:
            return False
        self.dropped += 1
        return True

    def purge(self, queue: BatchQueue, step: int) -> list[QueuedGroup]:
        """Drop mode: remove queued groups that a batch formed now (trained at version `step`) would serve
        more than `bound` steps stale; returns them (the caller deletes their payloads)."""
        if self.mode != "drop" or self.bound is None:
            return []
        bound = self.bound
        stale = [g for g in queue.queue.values() if g.gid in self.versions and step - self.versions[g.gid] > bound]
        queue.remove(stale)
        self.dropped += len(stale)
        for g in stale:
            self.versions.pop(g.gid, None)
        return stale

    def served(self, groups: list[QueuedGroup], step: int) -> None:
        """A batch trained at version `step` took `groups`: count the stale ones, forget their versions."""
        for g in groups:
            version = self.versions.pop(g.gid, None)
            if self.bound is not None and version is not None and step - version > self.bound:
                self.served_stale += 1

    def status(self) -> dict[str, Any]:
        """The extra `/status` fields (none without a bound: Atropos' exact answer)."""
        if self.bound is None:
            return {}
        return {"max_staleness": self.bound, "stale_dropped": self.dropped, "stale_served": self.served_stale}
