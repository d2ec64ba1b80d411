"""`atropos serve ENV`: the online env loop against a trajectory API (ours or atroposlib's `run-api`).

Flow (Atropos' `BaseEnv.env_manager` loop): `setup()` -> `POST /register-env` until the trainer started ->
`GET /info` (adopt batch size / max length) -> loop: `GET /status-env`, start workers (`collect_group`, up
to `max_num_workers`) unless the off-policy bound is reached, run `evaluate()` every `steps_per_eval` API
steps and `env.save_checkpoint(step)` every `checkpoint_interval` steps (a run that starts at a later step
restores it at registration). Finished groups go to an outbox drained by one sender task that posts them
(`ApiClient` retries while the API is down and backs off on 503), so a slow or full API slows rollouts down
instead of losing them.

Differences from Atropos, on purpose: the off-policy bound *pauses* new rollouts and never cancels in-flight
ones (no wasted inference); on Ctrl-C, rollouts in flight are cancelled but every finished group is either
posted or written to the spill file (`.atropos/serve-spill-<env>.jsonl` by default), which the next
`atropos serve` of the same env posts first.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from atropos_cli.api.client import ApiClient, ApiRequestError
from atropos_cli.env.loading import LoadedEnv
from atropos_cli.errors import AtroposError, ConfigError
from atropos_cli.runs.counts import RolloutCounts
from atropos_cli.runs.envcall import call_env
from atropos_cli.runs.rollout import collect_group
from atropos_cli.types import RolloutFailure, ScoredGroup

__all__ = ["ServeOptions", "ServeStats", "serve_env", "default_spill_path"]


class ServeOptions(BaseModel):
    api_url: str = "http://127.0.0.1:8000"
    api_key: str | None = None
    poll_s: float = 0.1
    register_poll_s: float = 1.0
    spill_path: str | None = None
    max_groups: int | None = None  # stop after sending this many groups (tests, smoke runs)
    flush_timeout_s: float = 10.0  # at shutdown: how long to keep trying to post before spilling
    max_api_wait_s: float | None = None  # give up when the API is unreachable this long (None: never)
    report_every_s: float = 10.0  # a progress event this often
    wait_report_s: float = 30.0  # while waiting for a trainer: say so once, then this often


@dataclass
class ServeStats:
    env_id: int | None = None
    wandb_name: str | None = None
    step: int = 0
    in_flight: int = 0
    counts: RolloutCounts = field(default_factory=RolloutCounts)  # groups = sent and acknowledged by the API
    paused: bool = False
    evals: list[dict[str, Any]] = field(default_factory=list)
    spilled: int = 0
    spill_path: str | None = None
    events: list[str] = field(default_factory=list)


def default_spill_path(env_name: str) -> Path:
    from atropos_cli.env.registry import spec_stem

    return Path(".atropos") / f"serve-spill-{spec_stem(env_name)}.jsonl"  # `gym:ns/Env-v0` has a slash


class _Server:
    """One serve run: the state shared by the main loop, the workers and the sender."""

    def __init__(self, loaded: LoadedEnv, options: ServeOptions, on_event: Callable[[ServeStats, str], None]):
        self.env = loaded.env
        self.cfg = loaded.env_config
        self.options = options
        self.on_event = on_event
        self.stats = ServeStats()
        self.spill = Path(options.spill_path) if options.spill_path else default_spill_path(self.env.name)
        self.stats.spill_path = str(self.spill)
        self.outbox: asyncio.Queue[ScoredGroup] = asyncio.Queue()
        self.workers: set[asyncio.Task[None]] = set()
        self.backlog: list[Any] = []
        self.exhausted = False
        self.unsent = 0  # groups collected and not yet acknowledged by the API (outbox + the one being posted)
        self.api_bound: int | None = None  # /status-env's max_staleness (the API bounds staleness)
        self.fatal: BaseException | None = None
        self.batch_size = self.cfg.batch_size
        self.max_token_len = self.cfg.max_token_length
        self.writer: Any = None
        self.checkpoint_interval = 0  # from the API's registration answer
        self._waiting_for: tuple[str, float, float] | None = None  # (what, since, last said)
        self.client = ApiClient(
            options.api_url, options.api_key, max_wait_s=options.max_api_wait_s, on_retry=self._on_retry
        )

    def event(self, message: str) -> None:
        self.stats.events.append(message)
        self.on_event(self.stats, message)

    def _on_retry(self, reason: str, delay: float) -> None:
        self.event(f"retrying in {delay:.1f} s: {reason}")

    # ---- startup ------------------------------------------------------------------------------------
    async def start(self) -> None:
        await call_env(self.env, "setup", self.env.setup())
        if self.cfg.data_path_to_save_groups:
            from atropos_cli.formats.jsonl import JsonlWriter

            self.writer = JsonlWriter(Path(self.cfg.data_path_to_save_groups), append=True)
        self._load_spill()
        reg = {
            "max_token_length": self.cfg.max_token_length,
            "desired_name": self.cfg.wandb_name or self.env.name,
            "weight": self.cfg.inference_weight,
            "group_size": self.cfg.group_size,
            "min_batch_allocation": self.cfg.min_batch_allocation,
        }
        answer = await self.client.register_env(reg, self.options.register_poll_s, self._on_wait)
        self.waiting(None)
        self.stats.env_id, self.stats.wandb_name = answer["env_id"], answer.get("wandb_name")
        self.stats.step = int(answer.get("starting_step") or 0)
        self._adopt_checkpoints(answer)
        info = await self.client.info()
        if info.get("batch_size", -1) != -1:
            self.batch_size = int(info["batch_size"])
        if info.get("max_token_len", -1) != -1:
            self.max_token_len = int(info["max_token_len"])
        if self.batch_size > 0 and self.cfg.group_size > self.batch_size:
            raise ConfigError(
                f"group_size {self.cfg.group_size} is larger than the trainer's batch_size {self.batch_size}",
                hint="lower --env.group_size",
            )
        self.event(f"registered as env {self.stats.env_id} ({self.stats.wandb_name}); batch_size {self.batch_size}")

    def _adopt_checkpoints(self, answer: dict[str, Any]) -> None:
        """Atropos' env checkpoints: the API names the directory and interval; a run that resumes at a later
        step restores the env's state saved for that step (`BaseEnv.load_checkpoint`)."""
        env = self.env
        env.checkpoint_dir = answer.get("checkpoint_dir") or None
        env.wandb_prepend = self.stats.wandb_name
        env.curr_step = self.stats.step
        self.checkpoint_interval = int(answer.get("checkpoint_interval") or 0)
        if self.stats.step > 0 and env.checkpoint_dir:
            env.load_checkpoint()
            self.event(f"env state of step {self.stats.step} loaded from {env.checkpoint_dir}/env_checkpoints")

    def _on_wait(self, status: str) -> None:
        self.waiting(f"waiting for the trainer: {status}")

    def waiting(self, what: str | None) -> None:
        """Say what we wait for once, then every `wait_report_s` with how long (not once per poll); None: done."""
        now = time.monotonic()
        if what is None or self._waiting_for is None or self._waiting_for[0] != what:
            self._waiting_for = None if what is None else (what, now, now)
            if what is not None:
                self.event(what)
            return
        _, since, said = self._waiting_for
        if now - said >= self.options.wait_report_s:
            self._waiting_for = (what, since, now)
            self.event(f"{what} (for {now - since:.0f}s)")

    def _load_spill(self) -> None:
        if not self.spill.exists():
            return
        from atropos_cli.formats.reader import parse_line

        lines = [line for line in self.spill.read_bytes().splitlines() if line.strip()]
        parsed = [(line, parse_line(line)) for line in lines]
        groups = [g for _, g in parsed if isinstance(g, ScoredGroup)]
        unreadable = [line for line, g in parsed if not isinstance(g, ScoredGroup)]
        for group in groups:
            self._to_outbox(group)
        if unreadable:  # never lost: kept beside the spill file, which is about to go
            kept = self.spill.with_name(self.spill.stem + ".unreadable.jsonl")
            with kept.open("ab") as handle:
                handle.write(b"".join(line + b"\n" for line in unreadable))
            self.event(f"warning: {len(unreadable)} unreadable lines of the spill file kept in {kept}")
        self.spill.unlink()
        self.event(f"re-sending {len(groups)} groups from the spill file {self.spill}")

    # ---- the loop -----------------------------------------------------------------------------------
    async def run(self) -> None:
        sender = asyncio.create_task(self._sender())
        eval_task: asyncio.Task[None] | None = None
        next_report = time.monotonic() + self.options.report_every_s
        try:
            while not self._done():
                status = await self.client.status_env(self.stats.env_id or 0)
                eval_task = self._step_checks(int(status["current_step"]), eval_task)
                if self.batch_size > 0 and self._past_total_steps(status):
                    self.event(f"reached total_steps {self.cfg.total_steps}: stopping")
                    break
                self.api_bound = status.get("max_staleness")  # the API's staleness bound, when it has one
                self.stats.paused = self._offpolicy_full(status) or self._eval_blocks(eval_task)
                if not self.stats.paused:
                    await self._add_workers(int(status["queue_size"]))
                self.stats.in_flight = len(self.workers)
                if sender.done():
                    sender.result()  # a 4xx from the API: surface it
                if self.fatal is not None:
                    raise self.fatal
                if time.monotonic() >= next_report:
                    next_report = time.monotonic() + self.options.report_every_s
                    self.event(f"API queue {status['queue_size']} groups of this size")
                await asyncio.sleep(self.options.poll_s)
            await self._drain_workers()
            await self._flush(sender)
        finally:
            if not sender.done():
                sender.cancel()
            if eval_task and not eval_task.done():
                eval_task.cancel()

    def _done(self) -> bool:
        if self.options.max_groups is not None and self.stats.counts.groups >= self.options.max_groups:
            return True
        return self.exhausted and not self.workers and self.unsent == 0

    def _past_total_steps(self, status: dict[str, Any]) -> bool:
        ahead = int(status["queue_size"]) * self.cfg.group_size // self.batch_size
        return int(status["current_step"]) + ahead > self.cfg.total_steps

    def _offpolicy_batches(self) -> int:
        """Batches that may wait in the queue: the env's max_batches_offpolicy, and at most S+1 when the API
        bounds staleness by S (a group posted behind S+1 batches would be trained more than S steps late)."""
        limit = self.cfg.max_batches_offpolicy
        bound = self.api_bound
        if isinstance(bound, int):
            limit = bound + 1 if limit <= 0 else min(limit, bound + 1)
        return limit

    def _offpolicy_full(self, status: dict[str, Any]) -> bool:
        if self._offpolicy_batches() <= 0 or self.batch_size <= 0:
            return False
        queued = (int(status["queue_size"]) + self.unsent) * self.cfg.group_size
        return queued >= self._offpolicy_batches() * self.batch_size

    def _eval_blocks(self, eval_task: asyncio.Task[None] | None) -> bool:
        return self.cfg.eval_handling == "STOP_TRAIN" and eval_task is not None and not eval_task.done()

    def _max_workers(self, queue_size: int) -> int:
        cap = self.cfg.max_num_workers
        if cap <= 0:
            servers = len(getattr(self.env.server, "configs", None) or [None])
            cap = self.cfg.max_num_workers_per_node * servers
        if self._offpolicy_batches() > 0 and self.batch_size > 0:
            room = self._offpolicy_batches() * self.batch_size // self.cfg.group_size - queue_size
            cap = min(cap, max(room, 1))
        return cap

    async def _add_workers(self, queue_size: int) -> None:
        cap = self._max_workers(queue_size)
        while len(self.workers) < cap and not self.exhausted:
            limit = self.options.max_groups
            if limit is not None and self.stats.counts.groups + self.unsent + len(self.workers) >= limit:
                return
            item = self.backlog.pop() if self.backlog else await self.env.get_next_item()
            if item is None:
                self.exhausted = True
                self.event("the env has no more items")
                return
            task = asyncio.create_task(self._work(item))
            self.workers.add(task)
            task.add_done_callback(self._worker_done)

    def _worker_done(self, task: asyncio.Task[None]) -> None:
        self.workers.discard(task)
        if not task.cancelled() and task.exception() is not None and self.fatal is None:
            self.fatal = task.exception()

    def _step_checks(self, step: int, eval_task: asyncio.Task[None] | None) -> asyncio.Task[None] | None:
        old, self.stats.step = self.stats.step, step
        interval = self.checkpoint_interval
        if interval > 0 and step // interval > old // interval:
            boundary = step // interval * interval
            try:
                self.env.save_checkpoint(boundary)
            except OSError as exc:  # a full or read-only disk costs this checkpoint, not the rollouts
                self.event(f"could not save the env checkpoint of step {boundary}: {exc}")
        self.env.curr_step = step
        every = self.cfg.steps_per_eval
        crossed = every > 0 and step // every > old // every
        if crossed and (eval_task is None or eval_task.done()):
            return asyncio.create_task(self._evaluate(step))
        return eval_task

    async def _evaluate(self, step: int) -> None:
        started = time.perf_counter()
        metrics = await self.env.evaluate()
        record = {"step": step, "metrics": metrics or {}, "seconds": round(time.perf_counter() - started, 2)}
        self.stats.evals.append(record)
        self.event(f"eval at step {step}: {metrics}")

    # ---- workers and sender -------------------------------------------------------------------------
    async def _work(self, item: Any) -> None:
        started_step = self.stats.step  # the trainer step when sampling began: the group's policy version
        try:
            outcome = await asyncio.wait_for(collect_group(self.env, item), self.cfg.worker_timeout)
        except asyncio.TimeoutError:
            # As Atropos: a rollout stuck past worker_timeout is dropped (counted), the loop goes on.
            self.stats.counts.failed_groups += 1
            self.event(f"a group took longer than worker_timeout ({self.cfg.worker_timeout:g} s): dropped")
            return
        self.backlog.extend(outcome.backlog)
        self.stats.counts.add_failures(outcome)
        if outcome.failed:
            self._report_failures(outcome.failures)
        for group in outcome.groups:
            if not group.has_tokens:
                raise AtroposError(
                    f"env {self.env.name!r} produced a group without token ids; it cannot be posted to a trainer",
                    hint="set --env.tokenizer_name (or use a backend that returns token ids, e.g. vllm)",
                )
            if self.max_token_len > 0 and any(len(t) >= self.max_token_len for t in group.tokens):
                self.stats.counts.drop("too long")
                continue
            if group.meta is not None and group.meta.policy_version is None:
                group.meta.policy_version = started_step
            if self.writer is not None:
                self.writer.write(group)
            self._to_outbox(group)

    def _to_outbox(self, group: ScoredGroup) -> None:
        self.unsent += 1
        self.outbox.put_nowait(group)

    def _report_failures(self, failures: list[RolloutFailure]) -> None:
        if failures:
            first = failures[0]
            self.event(f"group failed ({first.error_type}): {first.error}")

    async def _sender(self) -> None:
        while True:
            group = await self.outbox.get()
            try:
                await self.client.post_groups([group], self.stats.env_id)
            except ApiRequestError as exc:
                if exc.status == 409:  # no trainer registered (e.g. after /reset_data): wait for one
                    self.outbox.put_nowait(group)
                    self.waiting(f"waiting for a trainer to register: {exc.message}")
                    await asyncio.sleep(self.options.register_poll_s)
                    continue
                if exc.status in (401, 403):
                    self.outbox.put_nowait(group)
                    raise
                # The API refused this group (4xx): as Atropos, drop it, count it and go on.
                self.unsent -= 1
                self.stats.counts.drop("rejected by the API")
                self.event(f"the API rejected a group ({exc.status}): {exc.message}")
                continue
            except BaseException:
                self.outbox.put_nowait(group)  # not acknowledged: keep it for the flush or the spill file
                raise
            self.waiting(None)
            self.stats.counts.add_group(group)
            self.unsent -= 1

    async def _drain_workers(self) -> None:
        if self.workers:
            await asyncio.gather(*self.workers)

    async def _flush(self, sender: asyncio.Task[None]) -> None:
        deadline = time.monotonic() + self.options.flush_timeout_s
        while self.unsent and time.monotonic() < deadline and not sender.done():
            await asyncio.sleep(0.05)

    # ---- shutdown -----------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """Cancel rollouts in flight, then spill every finished-but-unsent group to disk."""
        for task in list(self.workers):
            task.cancel()
        with contextlib.suppress(asyncio.CancelledError, AtroposError):
            await asyncio.gather(*self.workers, return_exceptions=True)
        pending: list[ScoredGroup] = []
        while not self.outbox.empty():
            pending.append(self.outbox.get_nowait())
        if pending:
            self._write_spill(pending)
        if self.writer is not None:
            self.writer.close()
        if self.stats.env_id is not None:
            with contextlib.suppress(AtroposError):
                await asyncio.wait_for(self.client.disconnect_env(self.stats.env_id), 2.0)
        await self.client.close()

    def _write_spill(self, groups: list[ScoredGroup]) -> None:
        from atropos_cli.formats.jsonl import JsonlWriter

        self.spill.parent.mkdir(parents=True, exist_ok=True)
        writer = JsonlWriter(self.spill, append=True)
        for group in groups:
            writer.write(group)
        writer.close()
        self.stats.spilled = len(groups)
        self.event(f"wrote {len(groups)} unsent groups to {self.spill} (the next `atropos serve` sends them)")


async def serve_env(
    loaded: LoadedEnv, options: ServeOptions, on_event: Callable[[ServeStats, str], None] | None = None
) -> ServeStats:
    """Run the env loop until the env runs out of items, total_steps is reached, or the task is cancelled."""
    server = _Server(loaded, options, on_event or (lambda stats, message: None))
    try:
        await server.start()
        await server.run()
    finally:
        await asyncio.shield(server.shutdown())
    return server.stats


def api_key_from_env() -> str | None:
    return os.environ.get("ATROPOS_API_KEY") or None
