"""Loading a tokenizer by a shipped model's short name, a local directory or a hub id (transformers, lazily)."""

from __future__ import annotations

from typing import Any

from atropos_cli.errors import ModelLoadError
from atropos_cli.resources import resolve_model_path

__all__ = ["load_tokenizer", "hub_reachable"]


def hub_reachable(timeout_s: float = 2.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect within `timeout_s` (False under HF_HUB_OFFLINE).

    Without this, transformers retries an unreachable hub for about a minute before failing; with it, a hub
    name offline loads from the local cache or fails at once."""
    import os
    import socket
    from urllib.parse import urlparse

    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        return False
    endpoint = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    port = endpoint.port or (80 if endpoint.scheme == "http" else 443)
    try:
        socket.create_connection((endpoint.hostname or "huggingface.co", port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


def _in_hub_cache(repo_id: str) -> bool:
    """Whether the Hugging Face cache holds a snapshot of `repo_id` (checked without importing transformers)."""
    import os
    from pathlib import Path

    home = os.environ.get("HF_HOME") or str(Path.home() / ".cache" / "huggingface")
    cache = Path(os.environ.get("HF_HUB_CACHE") or Path(home) / "hub")
    return (cache / f"models--{repo_id.replace('/', '--')}" / "snapshots").is_dir()


def load_tokenizer(name: str) -> Any:
    """AutoTokenizer for a shipped model's short name, a local directory or a hub id."""
    from pathlib import Path

    path = resolve_model_path(name)
    offline = not Path(path).exists() and not hub_reachable()
    if offline and not _in_hub_cache(path):
        raise ModelLoadError(
            f"cannot load tokenizer {name!r}: not a local directory, not in the Hugging Face cache, and the "
            "hub is unreachable (offline)",
            hint="pass a local directory (a saved model) or one of the shipped models: atropos-tiny-arith",
        )
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
        return AutoTokenizer.from_pretrained(path, local_files_only=offline)
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
