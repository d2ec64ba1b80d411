"""The trajectory API's state and operations, without HTTP: registration, ingest, batches, status.

`app.py` parses requests and calls these methods; `store.py` persists every change before the method
returns; `queue.py` decides batch composition. Semantics follow Atropos' `run-api` (atroposlib's
`api/server.py`; recorded exchanges in tests/data/atroposlib/), with three
deliberate differences: a bounded queue (`ApiBusy` -> 503), groups refused until a trainer registered
(`ApiConflict` -> 409), and batches formed one (plus `prefetch`) at a time and served oldest first.
"""

from __future__ import annotations

import json
import math
import uuid
from collections import deque
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from atropos_cli.api.metrics import ApiMetrics, QueueGauges
from atropos_cli.api.queue import BatchQueue, EnvSlot, QueuedGroup
from atropos_cli.api.staleness import VERSION_MARGIN, StaleMode, StalenessGuard
from atropos_cli.api.store import GROUP_BUFFERED, GROUP_QUEUED, Store
from atropos_cli.errors import ApiBusy, ApiConflict, ApiInvalid, ApiNotFound

__all__ = [
    "ApiSettings", "ApiService", "ApiBusy", "ApiConflict", "ApiNotFound", "ApiInvalid", "Registration", "RegisterEnv",
]  # fmt: skip


class ApiSettings(BaseModel):
    state_dir: str | None = None
    max_queue_groups: int = 10_000
    max_body_mb: float = 64.0
    api_key: str | None = None
    disable_reset: bool = False
    fsync: bool = False
    mix: Literal["fifo", "weighted"] = "fifo"
    prefetch_batches: int = 1
    host: str = "127.0.0.1"
    """The address the server is bound to: a `Host` naming it is answered (see `httpguard.HostPolicy`)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Names besides loopback and the bound address that requests may use in `Host` (`*`: any)."""
    max_staleness: int | None = Field(None, ge=0)  # staleness.py: None = no bound
    stale_mode: StaleMode = "hold"


class Registration(BaseModel):
    """Atropos' trainer `Registration` body (POST /register)."""

    wandb_group: str
    wandb_project: str
    batch_size: int = Field(ge=1)
    max_token_len: int
    checkpoint_dir: str
    save_checkpoint_interval: int
    starting_step: int
    num_steps: int
    vocab_size: int | None = Field(None, ge=1)
    """Ours (Atropos' trainers leave it out): the model's vocabulary size; posted token ids must be below it."""


class RegisterEnv(BaseModel):
    """Atropos' `RegisterEnv` body (POST /register-env)."""

    max_token_length: int
    desired_name: str
    weight: float = Field(ge=0, allow_inf_nan=False)
    group_size: int = Field(ge=1)
    min_batch_allocation: float | None = Field(None, ge=0, le=1)
    """The share of every batch reserved for this env (a fraction of batch_size)."""


@dataclass
class IngestItem:
    """A validated group ready to store: its env, size and the exact ScoredData JSON bytes a batch carries."""

    env_id: int | None
    size: int
    payload: bytes
    policy_version: int | None = None  # the oldest policy version of any token: the group's staleness
    newest_version: int | None = None  # the newest: no later than the trainer's step + VERSION_MARGIN


class ApiService:
    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self.store = Store(settings.state_dir, fsync=settings.fsync)
        self.metrics = ApiMetrics()
        self.queue = BatchQueue(mix=settings.mix)
        self.registration: Registration | None = None
        self.step = 0
        self.started = False
        self.env_info: dict[int, dict[str, Any]] = {}
        self.pending: deque[tuple[int, list[QueuedGroup]]] = deque()
        self.latest: bytes | None = None  # one group's bytes: /latest_example outlives the batch
        self.restore_notes: list[str] = []  # what the restore had to repair (the CLI prints them)
        self.staleness = StalenessGuard(settings.max_staleness, settings.stale_mode)
        self._restore()

    # ---- lifecycle ----------------------------------------------------------------------------------
    def _restore(self) -> None:
        state = self.store.load()
        if "registration" in state.kv:
            self.registration = Registration.model_validate(state.kv["registration"])
            self.queue.batch_size = self.registration.batch_size
        self.step = int(state.kv.get("step", 0))
        self.started = bool(state.kv.get("started", False))
        for env_id, info in sorted(state.envs.items()):
            self._add_env_slot(env_id, info)
        for gid, group_env, size, status in state.groups:
            group = QueuedGroup(gid, group_env, size)
            slot = self.queue.envs.get(group_env) if group_env is not None else None
            if status == GROUP_BUFFERED and slot is not None:
                slot.buffer.append(group)
            else:
                self.queue.enqueue(group)
            if self.staleness.bound is not None:
                self.staleness.note(gid, _policy_version(self.store.payload(gid)))
        for batch_id, members in state.batches:
            self.pending.append((batch_id, [QueuedGroup(gid, None, size) for gid, size in members]))
        self._next_gid = self.store.max_gid() + 1
        self._next_batch = self.store.max_batch_id() + 1

    def close(self) -> None:
        self.store.close()

    def _add_env_slot(self, env_id: int, info: dict[str, Any]) -> None:
        try:
            RegisterEnv.model_validate({k: info.get(k) for k in RegisterEnv.model_fields if k in info})
        except ValidationError as exc:  # written by an older version that did not validate: neutralise it
            note = exc.errors()[0]
            self.restore_notes.append(
                f"env {env_id} ({info.get('real_name')}): stored {'.'.join(map(str, note['loc']))} is invalid "
                f"({note['msg']}); restored as disconnected, without a minimum allocation"
            )
            info = {**info, "connected": False, "min_batch_allocation": None, "weight": 0.0, "group_size": 1}
        self.env_info[env_id] = info
        self.queue.envs[env_id] = EnvSlot(
            env_id=env_id,
            group_size=info["group_size"],
            weight=info["weight"],
            min_batch_allocation=info.get("min_batch_allocation"),
            max_token_length=info["max_token_length"],
            connected=info.get("connected", True),
        )

    def reset(self) -> None:
        self.store.reset()
        self.queue = BatchQueue(mix=self.settings.mix)
        self.registration, self.step, self.started = None, 0, False
        self.env_info.clear()
        self.pending.clear()
        self.latest = None
        self.staleness = StalenessGuard(self.settings.max_staleness, self.settings.stale_mode)

    # ---- registration -------------------------------------------------------------------------------
    def register(self, reg: Registration) -> int:
        """The first trainer registration initialises the run; later ones (other ranks) only get an id."""
        if self.registration is None:
            self.registration = reg
            self.queue.batch_size = reg.batch_size
            self.step = reg.starting_step
            self.store.set_kv("registration", reg.model_dump())
            self.store.set_kv("step", self.step)
        return uuid.uuid4().int

    def register_env(self, req: RegisterEnv) -> dict[str, Any]:
        if self.registration is None or not self.started:
            return {"status": "wait for trainer to start"}
        env_id = len(self.env_info)
        same = sum(1 for info in self.env_info.values() if info["desired_name"] == req.desired_name)
        info = {**req.model_dump(), "real_name": f"{req.desired_name}_{same}", "connected": True}
        self.store.put_env(env_id, info)
        self._add_env_slot(env_id, info)
        reg = self.registration
        return {
            "status": "success",
            "env_id": env_id,
            "wandb_name": info["real_name"],
            "checkpoint_dir": reg.checkpoint_dir,
            "starting_step": self.step,
            "checkpoint_interval": reg.save_checkpoint_interval,
            "num_steps": reg.num_steps,
        }

    def disconnect_env(self, env_id: int) -> dict[str, Any]:
        if env_id not in self.env_info:
            raise ApiNotFound(f"no env with env_id {env_id!r}", hint="use the env_id that /register-env returned")
        self.env_info[env_id]["connected"] = False
        self.queue.envs[env_id].connected = False
        self.store.put_env(env_id, self.env_info[env_id])
        return {"status": "success"}

    # ---- ingest -------------------------------------------------------------------------------------
    def vocab_size(self) -> int | None:
        """The registered trainer's vocabulary size, when it sent one (posted token ids must be below it)."""
        return self.registration.vocab_size if self.registration is not None else None

    def outstanding_groups(self) -> int:
        return len(self.queue.queue) + self.queue.buffered_count() + sum(len(b[1]) for b in self.pending)

    def check_accepting(self, n_groups: int) -> None:
        if self.registration is None:
            raise ApiConflict(
                "no trainer has registered yet; groups would have no batch size to go into",
                hint="start the trainer (POST /register) before posting groups",
            )
        if self.outstanding_groups() + n_groups > self.settings.max_queue_groups:
            raise ApiBusy(
                f"queue is full ({self.outstanding_groups()} groups, limit {self.settings.max_queue_groups})",
                hint="retry after the trainer pulls batches (see Retry-After)",
            )

    def check_servable(self, items: list[IngestItem]) -> None:
        """Refuse groups no batch can ever take (larger than batch_size, or than their env's group_size, which
        Atropos' buffering could never complete) or for an env that does not exist."""
        batch_size = self.registration.batch_size if self.registration else None
        for index, item in enumerate(items):
            where = "group" if len(items) == 1 else f"group {index}"
            if batch_size is not None and item.size > batch_size:
                raise ApiInvalid(
                    f"{where} has {item.size} sequences, more than the trainer's batch_size of {batch_size}: "
                    "no batch could ever hold it (groups are never split)",
                    hint=f"use a group_size of at most {batch_size}",
                )
            if item.env_id is not None and item.env_id not in self.env_info:
                raise ApiInvalid(
                    f"{where} names env_id {item.env_id}, which is not registered",
                    hint="use the env_id that /register-env returned (ids are reset by /reset_data)",
                )
            if item.newest_version is not None and item.newest_version > self.step + VERSION_MARGIN:
                raise ApiInvalid(
                    f"{where} has policy_version {item.newest_version}, ahead of the trainer's step {self.step} "
                    f"by more than {VERSION_MARGIN}: no policy has that version yet",
                    hint="post the trainer step (GET /status current_step) whose weights sampled the group",
                )
            env = self.queue.envs.get(item.env_id) if item.env_id is not None else None
            if env is not None and item.size > env.group_size:
                raise ApiInvalid(
                    f"{where} has {item.size} sequences, more than env {item.env_id}'s group_size of "
                    f"{env.group_size}: it could only wait in the env's buffer forever (buffered groups must sum "
                    "exactly to group_size)",
                    hint=f"post groups of {env.group_size} (or fewer that add up to it), or register the env "
                    "with the group_size it posts",
                )

    async def ingest(self, items: list[IngestItem]) -> list[dict[str, Any]]:
        """Store and queue validated groups in one transaction; one Atropos-shaped answer per group."""
        self.check_accepting(len(items))
        self.check_servable(items)
        rows: list[tuple[int, int | None, int, int, bytes]] = []
        moved: list[int] = []
        answers: list[dict[str, Any]] = []
        for item in items:
            if self.staleness.refuses(item.policy_version, self.step):
                behind = self.step - (item.policy_version or 0)
                answers.append({"status": "dropped", "reason": f"stale: {behind} steps behind the trainer"})
                self.metrics.on_reject("stale")
                continue
            gid = self._next_gid
            self._next_gid += 1
            self.staleness.note(gid, item.policy_version)
            entered = self.queue.add(QueuedGroup(gid, item.env_id, item.size))
            in_queue = any(g.gid == gid for g in entered)
            rows.append((gid, item.env_id, item.size, GROUP_QUEUED if in_queue else GROUP_BUFFERED, item.payload))
            moved.extend(g.gid for g in entered if g.gid != gid)
            if in_queue:
                self.latest = item.payload
                answers.append({"status": "received"})
            else:
                slot = self.queue.envs[item.env_id]  # type: ignore[index]
                answers.append({"status": "buffered", "buffer_size": sum(g.size for g in slot.buffer)})
            self.metrics.on_ingest(self._env_label(item.env_id), 1, item.size)
        if rows:
            await self.store.add_groups_durably(rows, moved)
        return answers

    def _env_label(self, env_id: int | None) -> str:
        if env_id is None or env_id not in self.env_info:
            return "none"
        return str(self.env_info[env_id]["real_name"])

    # ---- batches ------------------------------------------------------------------------------------
    def next_batch(self) -> list[bytes] | None:
        """Serve the oldest formed batch, forming new ones (1 + prefetch at most) when none is pending."""
        self.started_now()
        if not self.pending:
            self._form(1 + max(0, self.settings.prefetch_batches))
        if not self.pending:
            return None
        batch_id, groups = self.pending.popleft()
        payloads = self.store.pop_batch(batch_id)
        self.metrics.on_batch(sum(g.size for g in groups))
        return payloads

    def started_now(self) -> None:
        if not self.started:
            self.started = True
            self.store.set_kv("started", True)

    def _form(self, limit: int) -> None:
        for _ in range(limit):
            stale = self.staleness.purge(self.queue, self.step)  # drop mode: what this batch would serve too stale
            if stale:
                self.store.drop_groups([g.gid for g in stale])
            groups = self.queue.take_batch()
            if groups is None:
                return
            self.staleness.served(groups, self.step)  # the batch of step k is trained at version k-1
            self.step += 1
            batch_id = self._next_batch
            self._next_batch += 1
            self.store.form_batch(batch_id, [g.gid for g in groups], self.step)
            self.pending.append((batch_id, groups))

    # ---- status -------------------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        return {"current_step": self.step, "queue_size": len(self.queue.queue), **self.staleness.status()}

    def status_env(self, env_id: int) -> dict[str, Any]:
        if env_id not in self.env_info:
            raise ApiNotFound(f"no env with env_id {env_id!r}", hint="use the env_id that /register-env returned")
        slots = self.queue.envs
        connected = [s for s in slots.values() if s.connected]
        total_min = sum(s.min_batch_allocation or 0.0 for s in connected)
        denom = sum(s.max_token_length * max(0.0, s.weight) for s in connected)
        me = slots[env_id]
        weight = max(0.01, me.max_token_length * me.weight / denom) if denom > 0 else 1.0
        max_group = self.queue.max_group_size
        batch_size = self.queue.batch_size
        own = self.queue.env_sequences(env_id)
        others = 0
        for other_id in self.queue.by_env:
            if other_id == env_id:
                continue
            seqs = self.queue.env_sequences(other_id)
            alloc = slots[other_id].min_batch_allocation if other_id in slots else None
            others += max(0, math.ceil(seqs / max_group) * max_group - int(batch_size * (alloc or 0.0)))
        group_size = max(me.group_size, 1)
        return {
            "current_step": self.step,
            "queue_size": (own + others) // group_size,
            "unallocated_fraction": 1.0 - min(total_min, 1.0),
            "self_queue_size": own // group_size,
            "max_group_size": max_group,
            "env_weight": weight,
            **self.staleness.status(),
        }

    def latest_example(self) -> bytes | None:
        return self.latest

    def gauges(self) -> QueueGauges:
        groups: dict[str, int] = {}
        seqs: dict[str, int] = {}
        for env_id, handles in self.queue.by_env.items():
            label = self._env_label(env_id)
            groups[label] = groups.get(label, 0) + len(handles)
            seqs[label] = seqs.get(label, 0) + sum(g.size for g in handles.values())
        return QueueGauges(self.step, groups, seqs, self.queue.buffered_count(), len(self.pending))


def _policy_version(payload: bytes | None) -> int | None:
    """meta.policy_version of a stored group's bytes (None when it has none)."""
    meta = json.loads(payload).get("meta") if payload else None
    version = meta.get("policy_version") if isinstance(meta, dict) else None
    return version if isinstance(version, int) else None
