"""The HTTP edge of the trajectory API: bounded body reading, gzip inflation with a limit, strict JSON, and
group validation into the exact bytes a batch will carry (Atropos' 14 ScoredData keys, plus `meta` with the
policy versions when the producer sent `meta.policy_version`).

`app.py` calls these; they raise `WireError` (status code + message + metrics reason), never return partial
results. JSON is parsed with orjson, which rejects NaN and Infinity (Python's json accepts them), and groups
are validated with `ScoredGroup` (+ `require_tokens()`) and `trainable.untrainable` (token ids in the
vocabulary, bounded scores), so nothing malformed or untrainable reaches the queue.
"""

from __future__ import annotations

import zlib
from typing import Any

import orjson
from pydantic import BaseModel, ValidationError

from atropos_cli.api.service import IngestItem
from atropos_cli.api.trainable import untrainable
from atropos_cli.errors import WireError
from atropos_cli.types import ScoredGroup

__all__ = ["WireError", "check_length", "inflate", "parse_json", "parse_model", "to_ingest_item"]


def check_length(content_length: str | None, limit: int) -> None:
    if content_length is not None and content_length.isdigit() and int(content_length) > limit:
        raise WireError(
            413,
            f"request body is {int(content_length)} bytes, over the limit of {limit} bytes",
            "body_too_large",
            hint="raise --max-body-mb on the API, or post fewer groups per request",
        )


def inflate(body: bytes, limit: int) -> bytes:
    """Gunzip `body`, inflating at most `limit + 1` bytes: a gzip bomb costs us `limit` bytes, not its size."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        out = inflater.decompress(body, limit + 1)
    except zlib.error as exc:
        raise WireError(400, f"Invalid gzip payload: {exc}", "bad_gzip") from None
    if len(out) > limit or inflater.unconsumed_tail:
        raise WireError(
            413,
            f"gzip body inflates past the limit of {limit} bytes",
            "inflated_too_large",
            hint="raise --max-body-mb on the API, or post fewer groups per request",
        )
    if not inflater.eof:
        raise WireError(400, "Invalid gzip payload: the stream is truncated", "bad_gzip")
    return out


def parse_json(body: bytes) -> Any:
    if not body:
        raise WireError(400, "request body is empty; expected JSON", "bad_json")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        # orjson refuses NaN/Infinity (Python's json writes them by default): say so when that is the cause.
        nonfinite = b"NaN" in body or b"Infinity" in body or "infinity" in str(exc)
        hint = "NaN and Infinity are not JSON; send finite numbers (json.dumps(..., allow_nan=False))"
        raise WireError(400, f"invalid JSON: {exc}", "bad_json", hint=hint if nonfinite else None) from None


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    msg = err["msg"].removeprefix("Value error, ")
    return f"{loc}: {msg}" if loc else msg


def parse_model(model: type[BaseModel], data: Any, what: str) -> Any:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise WireError(422, f"invalid {what}: {_first_error(exc)}", "invalid_body") from None


def to_ingest_item(data: Any, index: int | None = None, vocab_size: int | None = None) -> IngestItem:
    """Validate one posted group (a trainer must be able to train it: `trainable.untrainable`, against the
    registered trainer's `vocab_size` when it sent one) and pre-serialize its 14-key ScoredData JSON (a batch is
    then a byte join)."""
    where = "group" if index is None else f"group {index}"
    if not isinstance(data, dict):
        raise WireError(422, f"{where} must be a JSON object, got {type(data).__name__}", "invalid_group")
    try:
        group = ScoredGroup.model_validate(data)
        group.require_tokens()
    except ValidationError as exc:
        raise WireError(422, f"invalid {where}: {_first_error(exc)}", "invalid_group") from None
    except ValueError as exc:
        raise WireError(422, f"invalid {where}: {exc}", "no_tokens") from None
    empty = next((i for i, toks in enumerate(group.tokens) if not toks), None)
    if empty is not None:
        raise WireError(422, f"invalid {where}: rollout {empty} has no tokens", "invalid_group")
    problem = untrainable(group, vocab_size)
    if problem is not None:
        raise WireError(422, f"invalid {where}: {problem}", "untrainable",
                        hint="post token ids of the trainer's tokenizer and scores within ±1e6")  # fmt: skip
    if group.env_id is not None and group.env_id < 0:
        raise WireError(422, f"invalid {where}: env_id {group.env_id} is negative", "invalid_group",
                        hint="use the env_id that /register-env returned")  # fmt: skip
    span = group.policy_version_span
    if group.meta is not None and span is not None:
        group.meta.policy_version = span[0]  # stored and served as the oldest version of any token
    try:
        payload = orjson.dumps(group.to_wire())
    except TypeError as exc:  # e.g. an integer beyond 64 bits, which no trainer could read either
        raise WireError(422, f"invalid {where}: {exc}", "invalid_group") from None
    return IngestItem(
        env_id=group.env_id,
        size=group.size,
        payload=payload,
        policy_version=span[0] if span else None,
        newest_version=span[1] if span else None,
    )
