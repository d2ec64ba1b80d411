"""Speed budgets of three hot paths, measured here instead of inside the tests (a timed assertion flakes on a
loaded machine; the tests check what these paths do, this script how fast):

- the trajectory API's batch forming (`BatchQueue.take_batch`) with 100,000 groups queued: under 5 ms a batch
  (it must not scan the queue);
- the HTML viewer (`render_html`) of 10,000 groups: under 8 s;
- the fake OpenAI server answering 64 concurrent requests that each take 200 ms: under 1.5 s (they overlap).

Prints one row per path (measured, budget) and exits 1 if one is over its budget.

    python benchmarks/check_budgets.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path


def queue_ms_per_batch() -> float:
    from atropos_cli.api.queue import BatchQueue, QueuedGroup

    q = BatchQueue(batch_size=64)
    for gid in range(100_000):
        q.add(QueuedGroup(gid, 0, 8))
    started = time.perf_counter()
    for _ in range(100):
        if q.take_batch() is None:
            raise SystemExit("the queue formed no batch: fix the queue before timing it")
    return (time.perf_counter() - started) * 1000 / 100


def viewer_seconds() -> float:
    from atropos_cli.formats.html import render_html
    from atropos_cli.formats.reader import SourcedGroup
    from atropos_cli.types import GroupMeta, RolloutMeta, ScoredGroup

    def group(i: int) -> ScoredGroup:  # tests/test_viewer.py's shape
        scores = [float(i % 3) - 1, 1.0, 0.0, 0.5]
        prompt = [{"role": "system", "content": "answer with a number"}, {"role": "user", "content": "2 + 2"}]
        return ScoredGroup(
            scores=scores,
            messages=[[*prompt, {"role": "assistant", "content": f"answer {i} " * 10}] for _ in scores],
            masks=[[-100, -100, 5, 6]] * 4,
            tokens=[[1, 2, 5, 6]] * 4,
            meta=GroupMeta(
                env="arithmetic",
                item_id=f"train-{i}",
                model="tiny",
                rollouts=[RolloutMeta(finish_reason="stop", reward_parts={"correct": s}) for s in scores],
            ),
        )

    groups = [SourcedGroup("runs/x/groups.jsonl", i, group(i)) for i in range(10_000)]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        render_html(groups, Path(tmp) / "big.html", title="big")
        return time.perf_counter() - started


def fake_server_seconds() -> float:
    import httpx

    from atropos_cli.testing.fake_server import FakeInferenceServer

    async def go(url: str) -> float:
        async with httpx.AsyncClient(limits=httpx.Limits(max_connections=100), timeout=10) as client:
            body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
            await client.post(f"{url}/chat/completions", json=body)  # warm up the connection path
            started = time.perf_counter()
            responses = await asyncio.gather(*(client.post(f"{url}/chat/completions", json=body) for _ in range(64)))
            if any(r.status_code != 200 for r in responses):
                raise SystemExit("the fake server failed a request")
            return time.perf_counter() - started

    with FakeInferenceServer(rule="echo", latency_s=0.2) as server:
        return asyncio.run(go(server.base_url))


BUDGETS: list[tuple[str, Callable[[], float], float, str]] = [
    ("api queue: take_batch, 100k groups queued", queue_ms_per_batch, 5.0, "ms/batch"),
    ("viewer: render_html of 10,000 groups", viewer_seconds, 8.0, "s"),
    ("fake server: 64 concurrent 200 ms requests", fake_server_seconds, 1.5, "s"),
]


def main() -> int:
    over = 0
    print(f"{'path':<46} {'measured':>10} {'budget':>8}")
    for name, measure, budget, unit in BUDGETS:
        value = measure()
        over += value >= budget
        flag = "" if value < budget else "  OVER BUDGET"
        print(f"{name:<46} {value:>8.2f} {unit:<3} {budget:>5} {unit}{flag}")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
