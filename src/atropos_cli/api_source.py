"""Pulls scored groups from a live trajectory API as a fake trainer, for `sft-gen` / `dpo-gen --api-url`.

Where it sits: an alternative to `readers.iter_groups` in front of `datagen.select_sft` / `select_dpo`.
Protocol (spec §3.5, §5): `POST /register` once, then `GET /batch` in a loop; `{"batch": null}` means "not
enough data yet", so it polls until data comes or nothing has come for `idle_timeout` seconds. Unlike
Atropos' tools it never calls `GET /reset_data` (which wipes a live run's queue) unless `reset=True`.
The caller stops early simply by not asking for the next group (the generator closes the HTTP client).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import httpx
from pydantic import BaseModel, ValidationError

from atropos_cli.errors import RecordError, ServerUnreachableError
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


def _headers(api_key: str | None) -> dict[str, str]:
    if not api_key:
        return {}
    return {"Authorization": f"Bearer {api_key}"}


def _call(client: httpx.Client, method: str, path: str, **kwargs: object) -> httpx.Response:
    try:
        response = client.request(method, path, **kwargs)  # type: ignore[arg-type]
    except httpx.TransportError as exc:
        raise ServerUnreachableError(
            f"cannot reach the trajectory API at {str(client.base_url)!r}: {type(exc).__name__}",
            hint="start it with `atropos api` (or Atropos' `run-api`) and check --api-url",
        ) from None
    if response.status_code in (401, 403):
        raise RecordError(
            f"the trajectory API refused {method} {path} with HTTP {response.status_code}",
            hint="pass the API's key with --api-key",
        )
    if response.status_code >= 400:
        raise RecordError(
            f"the trajectory API answered {method} {path} with HTTP {response.status_code}: {response.text[:200]!r}"
        )
    return response


def _register(client: httpx.Client, options: ApiSourceOptions) -> None:
    body = {
        "wandb_group": "atropos-datagen",
        "wandb_project": "atropos-datagen",
        "batch_size": options.batch_size,
        "max_token_len": options.max_token_len,
        "checkpoint_dir": "checkpoints",
        "save_checkpoint_interval": 0,
        "starting_step": 0,
        "num_steps": options.num_steps,
    }
    _call(client, "POST", "/register", json=body)


def _next_batch(client: httpx.Client) -> list[object] | None:
    payload = _call(client, "GET", "/batch").json()
    if not isinstance(payload, dict):
        raise RecordError(f"GET /batch returned {type(payload).__name__}, expected a JSON object")
    if payload.get("status") == "error":
        raise RecordError(f"the trajectory API refused GET /batch: {payload.get('message')!r}")
    batch = payload.get("batch")
    if batch is not None and not isinstance(batch, list):
        raise RecordError(f"GET /batch returned batch={type(batch).__name__}, expected a list or null")
    return batch or None


def iter_api_groups(
    options: ApiSourceOptions, *, on_bad: Callable[[str, str], None] | None = None
) -> Iterator[ApiGroup]:
    """Register as a trainer and yield every group of every batch until the API stays idle too long.

    A group that does not validate goes to `on_bad(location, reason)` (counted and skipped), or raises
    RecordError when no callback is given (`--strict`).
    """
    source = options.url.rstrip("/")
    with httpx.Client(base_url=source, headers=_headers(options.api_key), timeout=options.timeout) as client:
        if options.reset:
            _call(client, "GET", "/reset_data")
        _register(client, options)
        index = 0
        last_data = time.monotonic()
        while True:
            batch = _next_batch(client)
            if batch is None:
                if time.monotonic() - last_data >= options.idle_timeout:
                    return
                time.sleep(options.poll_interval)
                continue
            last_data = time.monotonic()
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
