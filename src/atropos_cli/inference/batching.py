"""The request batcher of the local backend: concurrent requests become one batched model call.

Callers `await batcher.submit(job)` from the event loop. A collector task takes the first waiting job, then
gathers whatever else arrives until no new job came for `max_wait_s` (at most `max_hold_s` in all, and up to
`max_batch_size` rows, a job counting `size(job)` rows, e.g. its `n`), and runs `run(jobs) -> results` in ONE
worker thread, so the event loop never blocks on the model and model calls never overlap (a weight swap
between two calls is therefore atomic). Jobs that arrive while a batch runs wait in the queue and form the
next batch. A batch that raises is re-run one job at a time, so one failing job fails its own caller only.
An HTTP server announces each request as it starts reading it (`arriving()`), and the collector
keeps the batch open while announced requests are still on their way. A producer that knows how many rows it is
about to send (the one-command loop: a step's groups x group size) says so with `expecting(rows)`: the batch then
stays open until those rows have been submitted (at most `expect_hold_s`), so one step's rollouts reach the
engine as one batch even when the env does some work before each request. Knows nothing about torch.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

__all__ = ["RequestBatcher"]

J = TypeVar("J")
R = TypeVar("R")

# The announcement (see `RequestBatcher.arriving`) of the job the current task is about to submit.
_announcement: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("atropos_announcement", default=None)


@dataclass
class _Pending(Generic[J]):
    job: J
    future: asyncio.Future[Any] = field(repr=False)


class RequestBatcher(Generic[J, R]):
    """Collects jobs into batches of at most `max_batch_size` rows and runs them in one worker thread."""

    def __init__(
        self,
        run: Callable[[list[J]], list[R]],
        size: Callable[[J], int],
        max_batch_size: int = 128,
        max_wait_s: float = 0.002,
        max_hold_s: float = 0.05,
        expect_hold_s: float = 0.25,
    ) -> None:
        self._run = run
        self._size = size
        self.max_batch_size = max_batch_size
        self.max_wait_s = max_wait_s
        self.max_hold_s = max_hold_s
        self.expect_hold_s = expect_hold_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="atropos-model")
        self._queue: asyncio.Queue[_Pending[J]] | None = None
        self._task: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batches_run = 0
        self.rows_run = 0
        self.batches_split = 0  # batches that raised and were re-run one job at a time
        self._arriving = 0  # jobs announced by `arriving()` and not queued yet
        self._expected = 0  # rows announced by `expecting()` and not submitted yet
        self.expect_timeouts = 0  # batches that closed at expect_hold_s with expected rows still missing

    def _ensure_started(self) -> asyncio.Queue[_Pending[J]]:
        loop = asyncio.get_running_loop()
        # A new event loop (e.g. a second asyncio.run) needs its own queue and collector task.
        if self._queue is None or self._loop is not loop or self._task is None or self._task.done():
            self._loop = loop
            self._queue = asyncio.Queue()
            self._task = loop.create_task(self._collect(self._queue), name="atropos-batch-collector")
        return self._queue

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        """Announce a job that is on its way (an HTTP body still being read and parsed): while any is announced,
        the collector keeps its batch open (up to `max_hold_s`), so a burst of requests becomes one batch.
        The announcement ends at the first `submit` inside the block, or when the block exits."""
        self._arriving += 1
        slot: list[Any] = [self, True]  # [batcher, still counted]
        token = _announcement.set(slot)
        try:
            yield
        finally:
            _announcement.reset(token)
            self._end_announcement(slot)

    def _end_announcement(self, slot: list[Any] | None) -> None:
        if slot is not None and slot[0] is self and slot[1]:
            slot[1] = False
            self._arriving -= 1

    @contextlib.contextmanager
    def expecting(self, rows: int) -> Iterator[None]:
        """Announce `rows` rows that are about to be submitted (e.g. one training step's rollouts): until they all
        are, the collector keeps its batch open for them (up to `expect_hold_s` from the batch's first job; a
        batch that reaches the hold drops what is still expected, so stragglers never hold a second batch).
        Rows beyond `max_batch_size` still form further batches. One producer at a time: the block's exit
        clears what is left."""
        self._expected = max(0, rows)
        try:
            yield
        finally:
            self._expected = 0

    async def submit(self, job: J) -> R:
        """Queue one job and wait for its result (or its exception)."""
        queue = self._ensure_started()
        future: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        queue.put_nowait(_Pending(job, future))
        self._expected = max(0, self._expected - self._size(job))
        self._end_announcement(_announcement.get())
        return await future

    async def run_in_worker(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run `fn(*args)` in the model thread, between batches (used for weight swaps and warm-up)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    async def _gather(self, queue: asyncio.Queue[_Pending[J]], carry: deque[_Pending[J]]) -> list[_Pending[J]]:
        loop = asyncio.get_running_loop()
        batch = [carry.popleft() if carry else await queue.get()]
        rows = self._size(batch[0].job)
        # Wait for a quiet gap of max_wait_s after the LAST arrival (requests parsed one by one by an HTTP
        # server trickle in ~1 ms apart), but never longer than max_hold_s in total; while rows announced by
        # `expecting()` are still to come, wait for them (up to expect_hold_s), and close as soon as they are in.
        held = self._expected > 0
        hard_stop = loop.time() + (max(self.max_hold_s, self.expect_hold_s) if held else self.max_hold_s)
        while rows < self.max_batch_size:
            if carry:
                nxt = carry.popleft()
            elif not queue.empty():
                nxt = queue.get_nowait()
            elif held and self._expected == 0 and self._arriving == 0:
                break  # every expected row is in: no quiet gap to wait for
            else:
                left = hard_stop - loop.time()
                if left <= 0:
                    if self._expected > 0:
                        self.expect_timeouts += 1
                        self._expected = 0  # they are late: do not hold the next batch for them as well
                    break
                try:
                    wait = left if self._expected > 0 else min(self.max_wait_s, left)
                    nxt = await asyncio.wait_for(queue.get(), wait)
                except asyncio.TimeoutError:
                    if self._arriving > 0 or self._expected > 0:
                        continue  # announced jobs are still being parsed: keep the batch open for them
                    break
            if rows + self._size(nxt.job) > self.max_batch_size:
                carry.appendleft(nxt)  # does not fit: it opens the next batch
                break
            batch.append(nxt)
            rows += self._size(nxt.job)
        return [p for p in batch if not p.future.cancelled()]

    async def _collect(self, queue: asyncio.Queue[_Pending[J]]) -> None:
        carry: deque[_Pending[J]] = deque()
        loop = asyncio.get_running_loop()
        while True:
            batch = await self._gather(queue, carry)
            if not batch:
                continue
            await self._run_batch(loop, batch)

    async def _run_batch(self, loop: asyncio.AbstractEventLoop, batch: list[_Pending[J]]) -> None:
        """Run one batch; when it raises, run each of its jobs alone, so a failing job fails its caller only
        (a seeded job gives the same answer alone as batched)."""
        try:
            results = await loop.run_in_executor(self._executor, self._run, [p.job for p in batch])
        except Exception as exc:
            if len(batch) == 1:
                if not batch[0].future.done():
                    batch[0].future.set_exception(exc)
                return
            self.batches_split += 1
            for pending in batch:
                await self._run_batch(loop, [pending])
            return
        self.batches_run += 1
        self.rows_run += sum(self._size(p.job) for p in batch)
        for pending, result in zip(batch, results, strict=True):
            if not pending.future.done():
                pending.future.set_result(result)

    async def aclose(self) -> None:
        """Stop the collector and the worker thread; waiting callers are cancelled."""
        if self._task is not None and not self._task.done():
            self._task.cancel()
            if self._loop is asyncio.get_running_loop():  # a task of a finished loop cannot be awaited
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
        self._executor.shutdown(wait=False, cancel_futures=True)
