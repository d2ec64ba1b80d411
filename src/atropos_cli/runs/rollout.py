"""Concurrent group collection: items in, validated `ScoredGroup`s and recorded failures out.

`collect_group(env, item)` is the one place where a rollout's or a group's failure is caught and turned into
data (a `RolloutFailure`); everything else lets errors propagate. `run_groups(...)` drives `concurrency`
workers over the env's item stream (one `get_next_item()` at a time, in order, so item `index` is
deterministic for a seeded env) and hands each finished outcome to a callback as soon as it is ready.

Fatal conditions stop the run instead of filling failures.jsonl with copies of one error: an unreachable
server, or `max_consecutive_failures` groups in a row failing the same way.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, Collection
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from atropos_cli.env.base import BaseEnv, Item, failure_sink, filter_sink, record_failure
from atropos_cli.env.item_digest import item_digest
from atropos_cli.env.shape import groups_problem, pair_problem, shape_error
from atropos_cli.errors import AtroposError, RunAborted, ServerUnreachableError
from atropos_cli.inference.base import seeded_requests
from atropos_cli.types import GroupMeta, RolloutFailure, ScoredGroup, describe_validation_error, value_problem

__all__ = ["GroupOutcome", "collect_group", "run_groups", "RunAborted"]


@dataclass
class GroupOutcome:
    index: int | None
    item_id: str | None
    groups: list[ScoredGroup] = field(default_factory=list)
    failures: list[RolloutFailure] = field(default_factory=list)
    backlog: list[Item] = field(default_factory=list)
    filtered: list[RolloutFailure] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        """True when the item produced no group at all and something failed."""
        return not self.groups and not self.filtered and bool(self.failures)


def _as_groups(result: Any) -> list[Any]:
    if result is None:
        return []
    return list(result) if isinstance(result, list) else [result]


def _validate(raw: Any) -> ScoredGroup:
    if isinstance(raw, ScoredGroup):
        return raw
    if not isinstance(raw, dict):
        raise TypeError(f"collect_trajectories returned {type(raw).__name__}; expected a ScoredGroup or a dict")
    return ScoredGroup.model_validate(raw)


def _stamp(
    group: ScoredGroup, env: BaseEnv, index: int | None, item: Item, item_id: str | None, started: float
) -> GroupMeta:
    meta = group.meta or GroupMeta()
    server = env.server
    updates: dict[str, Any] = {
        "group_id": meta.group_id or uuid.uuid4().hex[:16],
        "env": meta.env or env.name,
        "env_version": meta.env_version or env.version,
        "item_id": meta.item_id if meta.item_id is not None else item_id,
        "item_digest": meta.item_digest or item_digest(item),
        "index": index,
        "model": meta.model or getattr(server, "model_name", None),
        "sampling": meta.sampling or env.sampling_params().model_dump(exclude_none=True),
        "seed": meta.seed if meta.seed is not None else env.config.seed,
        "created_at": meta.created_at or time.time(),
        "duration_s": meta.duration_s or round(time.perf_counter() - started, 4),
        "tokens_missing": not group.has_tokens,
    }
    group.meta = stamped = meta.model_copy(update=updates)
    return stamped


def _filter_reason(group: ScoredGroup, env: BaseEnv) -> str | None:
    """Atropos' checks on a scored group before it is sent (`ensure_scores_are_not_same`: identical scores, or
    fewer rollouts than `group_size` without failures to explain it), applied where the env asked for them."""
    expected = (group.group_overrides or {}).get("group_size", env.config.group_size)
    if env.config.ensure_scores_are_not_same and group.size > 1 and len(set(group.scores)) == 1:
        return "identical scores"
    failed_rollouts = group.meta.failed_rollouts if group.meta else None
    if env.config.ensure_scores_are_not_same and group.size != expected and not failed_rollouts:
        return f"group has {group.size} rollouts, expected {expected}"
    return None


async def collect_group(env: BaseEnv, item: Item, index: int | None = None) -> GroupOutcome:
    """Collect, validate and stamp the group(s) of one item; failures become data, never exceptions.

    `ServerUnreachableError` is the exception: it propagates, since no later item can succeed either.
    """
    item_id = env.item_id(item)
    outcome = GroupOutcome(index=index, item_id=item_id)
    sink: list[RolloutFailure] = []
    dropped: list[str] = []
    token, drop_token = failure_sink.set(sink), filter_sink.set(dropped)
    started = time.perf_counter()
    # A run's item index seeds its requests (process, evaluate): the same --seed gives the same groups.
    seeding = seeded_requests(env.config.seed, f"{index}:{item_id}") if index is not None else nullcontext()
    try:
        with seeding:
            returned = await env.collect_trajectories(item)
        if problem := pair_problem(returned, "group or list of groups or None"):
            raise shape_error(env, "collect_trajectories", problem)
        result, backlog = returned
        outcome.backlog = list(backlog or [])
        if result is None:
            dropped.append("collect_trajectories returned None")
        else:
            result = await env.postprocess_histories(result)
            if result is None:
                dropped.append("postprocess_histories returned None")
            if problem := groups_problem(result):
                raise shape_error(env, _group_hook(env), problem)
            result = await env.after_group(result, item)
        for raw in _as_groups(result):
            try:
                group = _validate(raw)
            except (ValidationError, TypeError) as exc:
                record_failure(_one_line(exc), env=env.name, item_id=item_id, rollout_index=None)
                continue
            problem = value_problem("score", group.scores)
            if problem is not None:  # a group built by env code: no trainer could use it, nor a mean
                error = ValueError(f"invalid group: {problem}")
                record_failure(error, env=env.name, item_id=item_id, rollout_index=None)
                continue
            meta = _stamp(group, env, index, item, item_id, started)
            reason = _filter_reason(group, env)
            if reason:
                outcome.filtered.append(_failure("Filtered", reason, env, item_id, meta.group_id))
            else:
                outcome.groups.append(group)
        if not _as_groups(result) and not sink and not dropped:
            dropped.append("collect_trajectories returned no group")
    except ServerUnreachableError:
        raise
    except Exception as exc:  # the one place a group's failure is caught: it is recorded, not raised
        record_failure(exc, env=env.name, item_id=item_id, rollout_index=None)
    finally:
        # a coroutine closed outside its task (Ctrl-C while the loop shuts down) runs this in another context,
        # where the token cannot be reset; the sink then dies with that context anyway
        with suppress(ValueError):
            failure_sink.reset(token)
            filter_sink.reset(drop_token)
        await env.cleanup()
    if not sink:  # a group the env dropped (Atropos: a None, or handle_send_to_api's checks) is filtered
        outcome.filtered += [_failure("Filtered", reason, env, item_id, None) for reason in dropped]
    for failure in [*sink, *outcome.filtered]:
        failure.index = index
        if failure.group_id is None and outcome.groups:
            failure.group_id = outcome.groups[0].meta.group_id  # type: ignore[union-attr]
    outcome.failures = sink
    return outcome


def _group_hook(env: BaseEnv) -> str:
    """The env's hook that made the groups: its own postprocess_histories when it has one."""
    own = getattr(type(env).postprocess_histories, "__module__", "").startswith("atropos_cli.")
    return "collect_trajectories" if own else "postprocess_histories"


def _one_line(exc: Exception) -> Exception:
    if isinstance(exc, ValidationError):
        return ValueError(f"invalid group: {describe_validation_error(exc)}")
    return exc


def _failure(kind: str, message: str, env: BaseEnv, item_id: str | None, group_id: str | None) -> RolloutFailure:
    return RolloutFailure(
        kind="group",
        group_id=group_id,
        env=env.name,
        item_id=item_id,
        error_type=kind,
        error=message,
        created_at=time.time(),
    )


async def run_groups(
    env: BaseEnv,
    *,
    num_items: int,
    concurrency: int,
    on_outcome: Callable[[GroupOutcome], Awaitable[None] | None],
    skip: Collection[int] = (),
    stop: asyncio.Event | None = None,
    max_consecutive_failures: int = 8,
) -> None:
    """Run up to `num_items` items with `concurrency` workers; call `on_outcome` as each one finishes.

    Items whose index is in `skip` are fetched (to keep the stream aligned) but not run (`--resume`).
    Setting `stop` lets in-flight groups finish and starts no new ones.
    """
    run = _GroupRun(env, num_items, skip, stop or asyncio.Event(), on_outcome, max_consecutive_failures)
    await asyncio.gather(*(run.worker() for _ in range(max(1, concurrency))))
    if run.fatal:
        exc = run.fatal[0]
        if isinstance(exc, AtroposError):
            raise RunAborted(exc.message, exc.hint) from None
        raise exc


@dataclass
class _GroupRun:
    """The state `run_groups`' workers share: the item stream (in order, one fetch at a time), the env's
    backlog, the streak of identical failures, and the first fatal error."""

    env: BaseEnv
    num_items: int
    skip: Collection[int]
    stop: asyncio.Event
    on_outcome: Callable[[GroupOutcome], Awaitable[None] | None]
    max_consecutive_failures: int
    next_index: int = 0
    backlog: list[Item] = field(default_factory=list)
    streak: int = 0
    streak_error: str = ""
    fatal: list[BaseException] = field(default_factory=list)
    fetch_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def next_item(self) -> tuple[int, Item] | None:
        async with self.fetch_lock:
            while self.next_index < self.num_items and not self.stop.is_set():
                index = self.next_index
                item = self.backlog.pop() if self.backlog else await self.env.get_next_item()
                if item is None:
                    return None
                self.next_index += 1
                if index not in self.skip:
                    return index, item
            return None

    async def worker(self) -> None:
        while not self.stop.is_set():
            job = await self.next_item()
            if job is None:
                return
            index, item = job
            try:
                outcome = await collect_group(self.env, item, index)
            except ServerUnreachableError as exc:
                self.fatal.append(exc)
                self.stop.set()
                return
            self.backlog.extend(outcome.backlog)
            self.track_streak(outcome)
            result = self.on_outcome(outcome)
            if asyncio.iscoroutine(result):
                await result

    def track_streak(self, outcome: GroupOutcome) -> None:
        """Stop the run once `max_consecutive_failures` groups in a row failed with the same error."""
        if not outcome.failed:
            self.streak, self.streak_error = 0, ""
            return
        first = outcome.failures[0]
        key = f"{first.error_type}: {first.error}"
        self.streak = self.streak + 1 if key == self.streak_error or not self.streak_error else 1
        self.streak_error = key
        limit = self.max_consecutive_failures
        if self.streak >= limit and not self.fatal:
            self.fatal.append(
                RunAborted(
                    f"stopping: {limit} groups in a row failed with {key}",
                    hint="see failures.jsonl; fix the server or env and continue with --resume",
                )
            )
            self.stop.set()
