"""The trainer's side of the trajectory API, used by `atropos train --api-url` and `sft-gen/dpo-gen --api-url`.

Protocol (spec §3.5): `POST /register` once, then `GET /batch` in a loop; `{"batch": null}` means "not enough
data yet", so it polls until data comes, and stops once nothing has come for `idle_timeout` seconds (the
caller decides whether that is the end of the data or an error). `GET /reset_data` wipes a live run's queue,
so it is only called when asked (`reset=True`). Batches are yielded raw (lists of dicts): each caller
validates its groups with the strictness it needs.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
from pydantic import BaseModel

from atropos_cli.errors import AtroposError, RecordError, ServerUnreachableError

__all__ = ["TrainerRegistration", "iter_raw_batches"]


class TrainerRegistration(BaseModel):
    """The body of `POST /register` (Atropos' `Registration`)."""

    wandb_group: str = "atropos"
    wandb_project: str = "atropos"
    batch_size: int
    max_token_len: int = 2048
    checkpoint_dir: str = "checkpoints"
    save_checkpoint_interval: int = 0
    starting_step: int = 0
    num_steps: int = 1000


def _call(client: httpx.Client, method: str, path: str, **kwargs: Any) -> httpx.Response:
    try:
        response = client.request(method, path, **kwargs)
    except httpx.TransportError as exc:
        raise ServerUnreachableError(
            f"cannot reach the trajectory API at {str(client.base_url)!r} ({type(exc).__name__})",
            hint="start it with `atropos api` (or Atropos' `run-api`) and check --api-url",
        ) from None
    if response.status_code in (401, 403):
        raise AtroposError(
            f"the trajectory API refused {method} {path} with HTTP {response.status_code}",
            hint="pass the API's key with --api-key (or set ATROPOS_API_KEY)",
        )
    if response.status_code >= 400:
        raise RecordError(
            f"the trajectory API answered {method} {path} with HTTP {response.status_code}: {response.text[:200]!r}"
        )
    return response


def _batch_of(payload: Any) -> list[Any] | None:
    if not isinstance(payload, dict):
        raise RecordError(f"GET /batch returned {type(payload).__name__}, expected a JSON object")
    if payload.get("status") == "error":
        raise RecordError(f"the trajectory API refused GET /batch: {payload.get('message')!r}")
    batch = payload.get("batch")
    if batch is not None and not isinstance(batch, list):
        raise RecordError(f"GET /batch returned batch={type(batch).__name__}, expected a list or null")
    return batch or None


def iter_raw_batches(
    url: str,
    registration: TrainerRegistration,
    *,
    api_key: str | None = None,
    idle_timeout: float = 30.0,
    poll_interval: float = 1.0,
    reset: bool = False,
    timeout: float = 30.0,
) -> Iterator[list[dict[str, Any]]]:
    """Register as the trainer and yield every non-empty batch; return after `idle_timeout` s without data."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout) as client:
        if reset:
            _call(client, "GET", "/reset_data")
        _call(client, "POST", "/register", json=registration.model_dump())
        last_data = time.monotonic()
        while True:
            batch = _batch_of(_call(client, "GET", "/batch").json())
            if batch is None:
                if time.monotonic() - last_data >= idle_timeout:
                    return
                time.sleep(poll_interval)
                continue
            last_data = time.monotonic()
            yield batch
