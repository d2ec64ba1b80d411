"""Where the trainer's batches come from when it does not make them itself: rollout files, or a trajectory API.

Where it sits: `atropos train --data PATH` uses `load_file_groups` + `file_batches` (offline GRPO on rollouts
written by `atropos process`; corrupt records are counted and reported; each step takes the next
`groups_per_step` groups, reshuffled each epoch with the seed);
`atropos train --api-url URL` uses `api_batches`, the trainer side of `atropos_cli.api.client` (`POST /register`
once, then `GET /batch` in a loop), one batch = one optimizer step. It polls while the API has no batch yet, and
gives up with a clear error after `wait_timeout` seconds without data, so a dead env never leaves the trainer
hanging silently.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atropos_cli.api.client import TrainerRegistration, iter_batches
from atropos_cli.api.trainable import untrainable
from atropos_cli.errors import ApiWaitTimeout, AtroposError, RecordError
from atropos_cli.formats.reader import BadRecord, expand_inputs, iter_groups
from atropos_cli.types import ScoredGroup

__all__ = [
    "FileData",
    "load_file_groups",
    "check_token_ids",
    "CheckedBatches",
    "file_batches",
    "api_batches",
    "ApiWaitTimeout",
    "from_rank0",
    "gathered",
]


MAX_WARNINGS = 10  # bad records printed one by one; the rest are counted


@dataclass
class FileData:
    """The groups of `--data` and what was skipped on the way: nothing is dropped without being counted."""

    groups: list[ScoredGroup] = field(default_factory=list)
    bad_records: list[BadRecord] = field(default_factory=list)  # corrupt lines/rows (JSON, shapes, NaN scores)
    no_tokens: int = 0  # valid groups without token ids (nothing to train on)


def load_file_groups(inputs: list[str], vocab_size: int | None = None) -> FileData:
    """Every group of the files; corrupt records and groups without token ids are counted, and a token id
    outside the model's vocabulary is a RecordError naming the file and group (before any step runs)."""
    paths = expand_inputs(inputs)
    data = FileData()
    for sourced in iter_groups(paths, on_bad=data.bad_records.append):
        if not sourced.group.has_tokens:
            data.no_tokens += 1
            continue
        if vocab_size is not None:
            check_token_ids(sourced.group, vocab_size, file=sourced.source, where=f"group {sourced.index}")
        data.groups.append(sourced.group)
    if not data.groups:
        raise RecordError(
            f"no groups with token ids in {', '.join(map(str, paths))!r}"
            + (f" ({len(data.bad_records)} corrupt records skipped)" if data.bad_records else ""),
            hint="write rollouts with a tokenizer (atropos process sets tokens when the model has one)",
        )
    return data


def check_token_ids(
    group: ScoredGroup, vocab_size: int, *, where: str, file: str | None = None, url: str | None = None
) -> None:
    """Token ids must index the model's embedding (0 <= id < vocab_size) and values be trainable
    (`trainable.untrainable`); else a RecordError naming the group."""
    problem = untrainable(group, vocab_size)
    if problem is not None:
        raise RecordError(
            f"{where}, {problem}",
            hint="train the model whose tokenizer wrote these rollouts (--model), or re-run `atropos process` "
            "with this model's tokenizer",
            file=file,
            url=url,
        )


class CheckedBatches:
    """The API's batches with every group the model cannot train skipped and counted (`skipped`), the first
    `MAX_WARNINGS` named through `on_event`: one bad group never stops the run. A batch left empty is not
    trained."""

    def __init__(self, batches: Iterable[list[ScoredGroup]], vocab_size: int, on_event: Callable[[str], None]) -> None:
        self.batches, self.vocab_size, self.on_event = batches, vocab_size, on_event
        self.skipped = 0

    def __iter__(self) -> Iterator[list[ScoredGroup]]:
        for batch in self.batches:
            kept = []
            for j, group in enumerate(batch):
                problem = untrainable(group, self.vocab_size)
                if problem is None:
                    kept.append(group)
                    continue
                self.skipped += 1
                if self.skipped <= MAX_WARNINGS:
                    self.on_event(f"warning: skipped GET /batch group {j}: {problem}")
            if kept:
                yield kept


def file_batches(
    groups: list[ScoredGroup], groups_per_step: int, epochs: int, seed: int
) -> Iterator[list[ScoredGroup]]:
    """`groups`, `groups_per_step` at a time, for `epochs` passes (reshuffled each pass)."""
    rng = random.Random(seed)
    for _ in range(epochs):
        order = list(range(len(groups)))
        rng.shuffle(order)
        for start in range(0, len(order), groups_per_step):
            yield [groups[i] for i in order[start : start + groups_per_step]]


def api_batches(
    url: str,
    batch_size: int,
    max_token_len: int,
    num_steps: int,
    checkpoint_dir: Path,
    wait_timeout: float = 600.0,
    poll_interval: float = 1.0,
    api_key: str | None = None,
    on_wait: Callable[[str], None] | None = None,
    vocab_size: int | None = None,
) -> Iterator[list[ScoredGroup]]:
    """Register as the trainer and yield one batch of groups per `GET /batch` that has data; while none comes,
    `on_wait` gets a status line every 30 s."""
    registration = TrainerRegistration(
        wandb_group="atropos-train",
        wandb_project="atropos-train",
        batch_size=batch_size,
        max_token_len=max_token_len,
        checkpoint_dir=str(checkpoint_dir),
        num_steps=num_steps,
        vocab_size=vocab_size,
    )
    started = time.monotonic()
    for batch in iter_batches(
        url, registration, api_key=api_key, idle_timeout=wait_timeout, poll_interval=poll_interval, on_wait=on_wait
    ):
        yield batch
        started = time.monotonic()
    raise ApiWaitTimeout(  # iter_batches ends only when no batch came for wait_timeout seconds
        f"no batch from the trajectory API at {url!r} for {time.monotonic() - started:.0f}s",
        hint="check that env workers run (`atropos serve ENV --api-url ...`) and post groups; "
        "raise --wait-timeout for slow envs",
    )


def from_rank0(batches: Iterable[list[ScoredGroup]] | None, dist: Any) -> Iterator[list[ScoredGroup]]:
    """A many-GPU run's batches when one source feeds it (the trajectory API, rank 0's env workers): rank 0
    iterates `batches` and broadcasts each; the other ranks pass None and receive. The source ending or
    failing on rank 0 ends every rank: the failure is raised on rank 0, the others stop with a line saying so."""
    it = iter(batches) if batches is not None else None
    while True:
        message: tuple[str, Any] = ("end", None)
        if it is not None:
            try:
                message = ("batch", next(it))
            except StopIteration:
                pass
            except Exception as exc:
                dist.broadcast(("error", str(exc)))
                raise
        kind, payload = dist.broadcast(message)
        if kind == "end":
            return
        if kind == "error":
            raise AtroposError(f"rank 0 stopped: {payload}", hint="rank 0's error above says why")
        yield payload


def gathered(
    rollouts: Any, groups_per_step: int, dist: Any, on_event: Callable[[str], None] = lambda _: None
) -> Iterator[list[ScoredGroup]]:
    """Data-parallel env rollouts: every rank walks the env's one item stream and samples its share of each
    step's `groups_per_step` items on its own engine (`item_stream.share`), then every rank gets the whole
    batch in rank order (which is stream order). The ranks' digests of the step's items are compared on the
    way (`StreamCheck`); the stream ending on any rank ends every rank."""
    from .draws import Draw
    from .item_stream import StreamCheck

    check = StreamCheck()
    local = iter(rollouts.batches(groups_per_step))
    while True:
        groups = next(local, None)
        parts = dist.gather(None if groups is None else (groups, rollouts.block_mark))
        if any(part is None for part in parts):
            return
        warning = check.warning([mark for _, mark in parts])
        if warning:
            on_event(warning)
        yield Draw.joined(part_groups for part_groups, _ in parts)
