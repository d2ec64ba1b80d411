"""One item stream for all the ranks of a run: each step takes the env's next `groups_per_step` items (the
step's block) and rank r of W keeps its slice of the block (`share`).

Where it sits: `rollouts.EnvRollouts` draws its items through an `ItemStream`, on every data-parallel rank of
`atropos train --nproc-per-node N` and on every engine rank of `--inference-gpus K`. Every rank walks the WHOLE
stream (it calls `get_next_item` for every item, its own and the others') and keeps its share; nothing is sent
between ranks for it. So an env's own counters, dataset cursors and seeded shuffles advance on every rank as
in one process, the ranks' shares of a step are disjoint and make up the block one process would draw, and
each item keeps its index in the stream (which seeds its requests: N ranks sample what one process samples).

What it needs from the env: the same items in the same order on every rank, i.e. `setup` and `get_next_item`
deterministic given the env's seed and the env's own state. Python's `random` module and numpy's global
generator qualify: while `setup` and `get_next_item` run, the stream swaps in a state of its own for them,
seeded from the env seed, so the rollouts' use of them (different on every rank) cannot shift the stream. A
generator the env seeds from the clock or the OS (`random.Random()`, `os.urandom`) does not: the ranks
compare their blocks' digests (`StreamCheck`) and the first block where they differ is reported.
"""

from __future__ import annotations

import random
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from atropos_cli.env.item_digest import digest_of, item_digest

__all__ = ["share", "Block", "ItemStream", "StreamCheck"]


def share(n: int, world: int, rank: int) -> range:
    """Rank `rank`'s positions in a block of `n` items: contiguous, the first `n % world` ranks one more."""
    base, extra = divmod(n, world)
    start = rank * base + min(rank, extra)
    return range(start, start + base + int(rank < extra))


@dataclass
class Block:
    """One step's items, as every rank draws them."""

    first: int  # the stream index of the block's first item
    items: list[Any]
    mine: range  # this rank's positions in the block
    digest: str  # of the whole block: the same on every rank when the ranks walk one stream

    def taken(self) -> list[tuple[int, Any]]:
        """(stream index, item) of this rank's share."""
        return [(self.first + i, self.items[i]) for i in self.mine]

    @property
    def span(self) -> str:
        return f"items {self.first}-{self.first + len(self.items) - 1}"


class _StreamRandom:
    """The global generators (`random`, numpy's legacy one) as the item stream sees them: entering swaps in the
    stream's states (first seeded from the env seed), leaving keeps them and puts the rollouts' states back."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.state = random.Random(seed).getstate()
        self.np_state: Any = None
        self.saved: Any = None
        self.np_saved: Any = None

    def __enter__(self) -> None:
        self.saved = random.getstate()
        random.setstate(self.state)
        np = sys.modules.get("numpy")
        if np is not None:
            self.np_saved = np.random.get_state()
            if self.np_state is None:
                self.np_state = np.random.RandomState(self.seed % 2**32).get_state()
            np.random.set_state(self.np_state)

    def __exit__(self, *exc: object) -> None:
        self.state = random.getstate()
        random.setstate(self.saved)
        if self.np_saved is not None:
            np = sys.modules["numpy"]
            self.np_state = np.random.get_state()
            np.random.set_state(self.np_saved)
            self.np_saved = None


class ItemStream:
    """An env's items, block by block, of which this rank keeps `share(len(block), world, rank)`."""

    def __init__(
        self,
        env: Any,
        seed: int,
        rank: int = 0,
        world: int = 1,
        on_exhausted: str = "cycle",
        on_event: Callable[[str], None] = lambda _: None,
    ) -> None:
        self.env, self.rank, self.world = env, rank, world
        self.drawn = 0  # the stream index of the next item
        self.random = _StreamRandom(seed)
        self.on_exhausted, self.on_event = on_exhausted, on_event
        self.epoch, self.epoch_items = 1, 0  # the pass over the env's items, and the items it has taken so far
        self.exhausted = False  # the items ran out and the run stops (--on-exhausted stop, or no restart_items)
        self.restartable = True
        self.epoch_size: int | None = None  # the env's items in one pass, once a pass has ended

    async def setup(self) -> None:
        with self.random:  # a dataset shuffled in setup() with `random` is shuffled alike on every rank
            await self.env.setup()

    async def next_block(self, n: int) -> Block | None:
        """The next `n` items (fewer where the env's stream ends; None once it has ended)."""
        items = []
        with self.random:
            for _ in range(n):
                item = await self.env.get_next_item()
                if item is None and self.epoch_items and self._next_epoch():
                    item = await self.env.get_next_item()
                if item is None:
                    self.exhausted = True
                    self.epoch_size = self.epoch_items if self.epoch_size is None else self.epoch_size
                    break
                items.append(item)
                self.epoch_items += 1
        if not items:
            return None
        digest = digest_of(",".join(item_digest(item) for item in items))
        block = Block(self.drawn, items, share(len(items), self.world, self.rank), digest)
        self.drawn += len(items)
        return block

    def _next_epoch(self) -> bool:
        """The env's items ran out: start them over (--on-exhausted cycle) if the env can, and say so."""
        if self.on_exhausted != "cycle":
            return False
        self.epoch_size = self.epoch_items
        self.restartable = bool(self.env.restart_items())
        if not self.restartable:
            return False
        self.on_event(f"the env's {self.epoch_items} items ran out: starting epoch {self.epoch + 1}")
        self.epoch, self.epoch_items = self.epoch + 1, 0
        return True


class StreamCheck:
    """The ranks' digests of each block compared: a block where they differ means the env gave the ranks
    different items (each rank then trains its share of its own stream, and an item can be trained twice).
    `diverged` counts such blocks; the first one is worth a warning line."""

    def __init__(self) -> None:
        self.diverged = 0

    def warning(self, marks: list[tuple[str, str]]) -> str | None:
        """`marks`: every rank's `(Block.span, Block.digest)` of one step."""
        if len({digest for _, digest in marks}) == 1:
            return None
        self.diverged += 1
        if self.diverged > 1:
            return None
        return (
            f"warning: the ranks drew different {marks[0][0]} of the env's stream, so an item can be trained more "
            "than once (reported once): the env's get_next_item must give every rank the same items; seed "
            "its random generators from self.config.seed (docs/training-many-gpus.md)"
        )
