"""Where the trainer's batches come from when it does not make them itself: rollout files, or a trajectory API.

Where it sits: `atropos train --data PATH` uses `file_batches` (offline GRPO on rollouts written by
`atropos process`: each step takes the next `groups_per_step` groups, reshuffled each epoch with the seed);
`atropos train --api-url URL` uses `api_batches`, the trainer side of `atropos_cli.api.client` (`POST /register`
once, then `GET /batch` in a loop), one batch = one optimizer step. It polls while the API has no batch yet, and
gives up with a clear error after `wait_timeout` seconds without data, so a dead env never leaves the trainer
hanging silently.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from atropos_cli.api.client import TrainerRegistration, iter_batches
from atropos_cli.errors import AtroposError, RecordError
from atropos_cli.formats.reader import BadRecord, expand_inputs, iter_groups
from atropos_cli.types import ScoredGroup

__all__ = ["file_batches", "api_batches", "ApiWaitTimeout"]


class ApiWaitTimeout(AtroposError):
    """The trajectory API served no batch for too long."""


def file_batches(
    inputs: list[str],
    groups_per_step: int,
    epochs: int,
    seed: int,
    on_bad: Callable[[BadRecord], None] | None = None,
) -> Iterator[list[ScoredGroup]]:
    """Groups of the files, `groups_per_step` at a time, for `epochs` passes (reshuffled each pass)."""
    paths = expand_inputs(inputs)
    groups = [g.group for g in iter_groups(paths, on_bad=on_bad) if g.group.has_tokens]
    if not groups:
        raise RecordError(
            f"no groups with token ids in {', '.join(map(str, paths))!r}",
            hint="write rollouts with a tokenizer (atropos process sets tokens when the model has one)",
        )
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
