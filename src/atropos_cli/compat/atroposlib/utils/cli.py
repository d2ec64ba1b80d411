"""atroposlib.utils.cli: the double-dash flag reader and dict helpers behind `Env.cli()`."""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["get_double_dash_flags", "merge_dicts", "extract_namespace"]


def get_double_dash_flags(argv: list[str] | None = None) -> dict[str, Any]:
    """`--k=v`, `--k v` (when v does not start with '-'), bare `--k` -> True; the string "None" -> None."""
    args = sys.argv[1:] if argv is None else argv
    flags: dict[str, Any] = {}
    i = 0
    while i < len(args):
        arg = args[i]
        i += 1
        if not arg.startswith("--") or arg == "--":
            continue
        key, eq, value = arg[2:].partition("=")
        if not eq and i < len(args) and not args[i].startswith("-"):
            value, eq = args[i], "="
            i += 1
        if not key:
            continue
        flags[key] = (None if value == "None" else value) if eq else True
    return flags


def merge_dicts(*dicts: dict[str, Any]) -> dict[str, Any]:
    """Later dicts win; nested dicts merge recursively."""
    merged: dict[str, Any] = {}
    for d in dicts:
        for key, value in (d or {}).items():
            if isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge_dicts(merged[key], value)
            else:
                merged[key] = value
    return merged


def extract_namespace(model: Any, prefix: str) -> dict[str, Any]:
    """The `prefix`-ed keys of a dict (or of a model's fields), prefix stripped."""
    items = model.items() if isinstance(model, dict) else vars(model).items()
    return {k[len(prefix) :]: v for k, v in items if k.startswith(prefix)}
