"""Pulls scored groups from a live trajectory API as a fake trainer, for `sft-gen` / `dpo-gen --api-url`.

Where it sits: an alternative to `readers.iter_groups` in front of `datagen.select_sft` / `select_dpo`.
The protocol lives in `api.trainer_client`; it polls until nothing has come for `idle_timeout` seconds, and
unlike Atropos' tools never calls `GET /reset_data` (which wipes a live run's queue) unless `reset=True`.
The caller stops early simply by not asking for the next group (the generator closes the HTTP client).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError

from atropos_cli.api.trainer_client import TrainerRegistration, iter_raw_batches
from atropos_cli.errors import RecordError
from atropos_cli.types import ScoredGroup

__all__ = ["ApiGroup", "ApiSourceOptions", "iter_api_groups"]


@dataclass
class ApiGroup:
    """A group from the API, shaped like readers' `SourcedGroup` (source = the URL, index = arrival order)."""

    source: str
    index: int
    group: ScoredGroup


class ApiSourceOptions(BaseModel):
    url: str
    api_key: str | None = None
    batch_size: int = 16
    max_token_len: int = 2048
    num_steps: int = 1000
    idle_timeout: float = 30.0
    poll_interval: float = 1.0
    reset: bool = False
    timeout: float = 30.0


def iter_api_groups(
    options: ApiSourceOptions, *, on_bad: Callable[[str, str], None] | None = None
) -> Iterator[ApiGroup]:
    """Register as a trainer and yield every group of every batch until the API stays idle too long.

    A group that does not validate goes to `on_bad(location, reason)` (counted and skipped), or raises
    RecordError when no callback is given (`--strict`).
    """
    source = options.url.rstrip("/")
    registration = TrainerRegistration(
        wandb_group="atropos-datagen",
        wandb_project="atropos-datagen",
        batch_size=options.batch_size,
        max_token_len=options.max_token_len,
        num_steps=options.num_steps,
    )
    batches = iter_raw_batches(
        source,
        registration,
        api_key=options.api_key,
        idle_timeout=options.idle_timeout,
        poll_interval=options.poll_interval,
        reset=options.reset,
        timeout=options.timeout,
    )
    index = 0
    for batch in batches:
        for raw in batch:
            try:
                group = ScoredGroup.model_validate(raw)
            except ValidationError as exc:
                location, reason = f"{source}#group {index}", f"not a valid group: {exc.errors()[0]['msg']}"
                index += 1
                if on_bad is None:
                    raise RecordError(f"{location}: {reason}") from None
                on_bad(location, reason)
                continue
            yield ApiGroup(source, index, group)
            index += 1
