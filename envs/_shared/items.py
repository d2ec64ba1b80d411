"""The item stream of a procedural env: items made from a seed, none read from a dataset.

Item `index` of split `split` is named `{split}-{index}` and made from the seed key `{seed}:{split}:{index}`
(`random.Random(key)`, or the key itself where the item keeps it), so an item depends on the run's seed, its split
and its place only. `train` never ends; another split has `eval_size` items.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

__all__ = ["procedural_items"]


def procedural_items(seed: int, split: str, eval_size: int) -> Iterator[tuple[str, str]]:
    """(item id, seed key) of each item of `split`, in order."""
    indices = itertools.count() if split == "train" else range(eval_size)
    for index in indices:
        yield f"{split}-{index}", f"{seed}:{split}:{index}"
