"""Where the trainer's batches come from when it does not make them itself: rollout files, or a trajectory API.

Where it sits: `atropos train --data PATH` uses `file_batches` (offline GRPO on rollouts written by
`atropos process`: each step takes the next `groups_per_step` groups, reshuffled each epoch with the seed);
`atropos train --api-url URL` uses `api_batches`, which speaks Atropos' trainer protocol (spec §3.5):
`POST /register` once, then `GET /batch` in a loop, one batch = one optimizer step. `{"batch": null}` means
"not enough data yet": it polls, and gives up with a clear error after `wait_timeout` seconds without data,
so a dead env never leaves the trainer hanging silently.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
from pydantic import ValidationError

from atropos_cli.errors import AtroposError, RecordError, ServerUnreachableError
from atropos_cli.readers import BadRecord, expand_inputs, iter_groups
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


def _request(client: httpx.Client, method: str, path: str, **kwargs: object) -> httpx.Response:
    try:
        response = client.request(method, path, **kwargs)  # type: ignore[arg-type]
    except httpx.TransportError as exc:
        raise ServerUnreachableError(
            f"cannot reach the trajectory API at {str(client.base_url)!r} ({type(exc).__name__})",
            hint="start it with `atropos api` (or Atropos' `run-api`) and check --api-url",
        ) from None
    if response.status_code >= 400:
        raise RecordError(
            f"the trajectory API answered {method} {path} with HTTP {response.status_code}: {response.text[:200]!r}"
        )
    return response


def api_batches(
    url: str,
    batch_size: int,
    max_token_len: int,
    num_steps: int,
    checkpoint_dir: Path,
    wait_timeout: float = 600.0,
    poll_interval: float = 1.0,
    api_key: str | None = None,
) -> Iterator[list[ScoredGroup]]:
    """Register as the trainer and yield one batch of groups per `GET /batch` that has data."""
    headers = {"Authorization": f"Bearer {api_key}", "X-API-Key": api_key} if api_key else {}
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=30.0) as client:
        registration = {
            "wandb_group": "atropos-train",
            "wandb_project": "atropos-train",
            "batch_size": batch_size,
            "max_token_len": max_token_len,
            "checkpoint_dir": str(checkpoint_dir),
            "save_checkpoint_interval": 0,
            "starting_step": 0,
            "num_steps": num_steps,
        }
        _request(client, "POST", "/register", json=registration)
        last_data = time.monotonic()
        while True:
            payload = _request(client, "GET", "/batch").json()
            if not isinstance(payload, dict) or payload.get("status") == "error":
                raise RecordError(f"the trajectory API refused GET /batch: {payload!r:.200}")
            batch = payload.get("batch")
            if not batch:
                waited = time.monotonic() - last_data
                if waited >= wait_timeout:
                    raise ApiWaitTimeout(
                        f"no batch from the trajectory API at {url!r} for {waited:.0f}s",
                        hint="check that env workers run (`atropos serve ENV --api-url ...`) and post groups; "
                        "raise --wait-timeout for slow envs",
                    )
                time.sleep(poll_interval)
                continue
            last_data = time.monotonic()
            try:
                yield [ScoredGroup.model_validate(raw) for raw in batch]
            except ValidationError as exc:
                raise RecordError(f"GET /batch returned an invalid group: {exc.errors()[0]['msg']}") from None
