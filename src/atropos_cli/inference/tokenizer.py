"""Loading a tokenizer by a shipped model's short name, a local directory or a hub id (transformers, lazily)."""

from __future__ import annotations

from typing import Any

from atropos_cli.errors import ModelLoadError
from atropos_cli.resources import resolve_model_path

__all__ = ["load_tokenizer"]


def load_tokenizer(name: str) -> Any:
    """AutoTokenizer for a shipped model's short name, a local directory or a hub id."""
    from pathlib import Path

    path = resolve_model_path(name)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ModelLoadError(
            f"cannot load tokenizer {name!r}: transformers is not installed",
            hint='install the local extra: pip install "atropos[local]"',
        ) from None
    if Path(path).exists() and not Path(path).is_dir():
        raise ModelLoadError(f"tokenizer path {path!r} is a file", hint="pass the model's directory")
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        if Path(path).is_dir():
            raise ModelLoadError(
                f"directory {path!r} has no tokenizer files",
                hint="save one with tokenizer.save_pretrained(DIR), or pass --env.tokenizer_name",
            ) from None
        raise ModelLoadError(
            f"cannot load tokenizer {name!r}: not a local directory and the Hugging Face hub is unreachable "
            f"or has no such repo ({type(exc).__name__})",
            hint="pass a local directory (a saved model) or one of the shipped models: atropos-tiny-arith",
        ) from None
