"""A stable digest of an env item: the same item gives the same 16 hex digits in every process.

Where it sits: `runs.rollout.collect_group` stamps it on every group (`meta.item_digest`), so the groups of
one item can be found, and duplicates counted, whether or not the env gives its items ids; the trainer's item
stream (`trainer/data/item_stream.py`) digests each step's items to check that its ranks walk one stream.

The digest is blake2b over a canonical JSON form of the item: mappings and sets are sorted (Python's string
hash, and with it a set's order, changes from process to process), tuples read as lists, bytes and arrays by
their contents, pydantic models and dataclasses by their fields, anything else by its repr without memory
addresses.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

__all__ = ["item_digest", "digest_of"]

_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def item_digest(item: Any) -> str:
    """16 hex digits naming `item`'s content (equal items, equal digests, in any process)."""
    return digest_of(json.dumps(_canonical(item), separators=(",", ":")))


def digest_of(text: str) -> str:
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


def _canonical(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": hashlib.blake2b(bytes(value), digest_size=16).hexdigest()}
    if isinstance(value, Mapping):
        return {"map": _sorted([[_canonical(k), _canonical(v)] for k, v in value.items()])}
    if isinstance(value, (set, frozenset)):
        return {"set": _sorted([_canonical(v) for v in value])}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if hasattr(value, "model_dump"):  # a pydantic model
        return _canonical(value.model_dump(mode="json"))
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {type(value).__qualname__: _canonical(dataclasses.asdict(value))}
    if hasattr(value, "tobytes") and hasattr(value, "shape"):  # a numpy array (a CPU tensor has .numpy())
        return {"array": [str(getattr(value, "dtype", "")), list(value.shape), _canonical(value.tobytes())]}
    try:
        text = _ADDRESS.sub("", repr(value))
    except Exception:  # a repr that fails names the type alone: the digest never fails a rollout
        text = ""
    return {type(value).__qualname__: text}


def _sorted(values: list[Any]) -> list[Any]:
    return sorted(values, key=lambda v: json.dumps(v, separators=(",", ":")))
