"""A tiny env for `atropos serve` tests: groups with token ids, no inference server needed.

Items are 0, 1, 2, ... up to `total_items` (env var SERVE_TEST_ITEMS, default unbounded); each rollout
sleeps `SERVE_TEST_DELAY` seconds so tests can observe work in flight; with `SERVE_TEST_CHECKPOINT` set,
its env checkpoints hold its position in the item stream.
"""

from __future__ import annotations

import asyncio
import os

from atropos_cli.env.base import BaseEnv
from atropos_cli.types import ScoredGroup


class CountingEnv(BaseEnv):
    name = "counting"

    async def setup(self) -> None:
        self.next_index = 0
        self.limit = int(os.environ.get("SERVE_TEST_ITEMS", "1000000"))
        self.delay = float(os.environ.get("SERVE_TEST_DELAY", "0"))
        self.evals = 0
        self.finished = 0  # groups collected: tests wait on it instead of sleeping

    async def get_next_item(self) -> int | None:
        if self.next_index >= self.limit:
            return None
        self.next_index += 1
        return self.next_index - 1

    async def collect_trajectories(self, item: int) -> tuple[ScoredGroup, list]:
        await asyncio.sleep(self.delay)
        self.finished += 1
        n = self.config.group_size
        if os.environ.get("SERVE_TEST_NO_TOKENS"):
            return ScoredGroup(scores=[float(i % 2) for i in range(n)]), []
        tokens = [[item, 1000 + i] for i in range(n)]
        masks = [[-100, 1000 + i] for i in range(n)]
        return ScoredGroup(tokens=tokens, masks=masks, scores=[float(i % 2) for i in range(n)]), []

    async def evaluate(self, *args: object, **kwargs: object) -> dict[str, float]:
        self.evals += 1
        return {"eval/count": float(self.evals)}

    def save_checkpoint(self, step: int, data: dict | None = None) -> None:
        """With SERVE_TEST_CHECKPOINT set, the position in the item stream survives a restart."""
        if os.environ.get("SERVE_TEST_CHECKPOINT"):
            data = {"next_index": self.next_index}
        super().save_checkpoint(step, data)
