"""Compiles kept across runs: the engine's compiled decode step, the trainer's compiled body and the Triton
decode kernel are cached in a user cache directory, per torch version, so a run on a model (shape) that an
earlier run compiled loads its kernels instead of generating them again.

Where it sits: `enable()` runs before the first `torch.compile` of a process (the engine's `_compiled`, the
trainer's `compile_body`) and before the decode kernel's first launch. It points torch inductor's on-disk caches
(its FX-graph and AOTAutograd caches, on by default in torch) and Triton's kernel cache at

    $ATROPOS_COMPILE_CACHE, else $XDG_CACHE_HOME/atropos/compile, else ~/.cache/atropos/compile

under `torch-<version>/`, instead of torch's default under the temporary directory (lost at reboot, shared by
every torch version). The entries are keyed by the traced graph: its shapes, dtypes, the device and the
compiler's own version, so one directory serves every model shape and card, and a changed model compiles anew.
What is not cached: dynamo's tracing of the Python code and the CUDA graphs' capture (both run again each
process; benchmarks/bench_compile_cache.py measures what is left).

A cache directory the user already chose for torch (`TORCHINDUCTOR_CACHE_DIR`, `TRITON_CACHE_DIR`) wins;
`ATROPOS_COMPILE_CACHE=off` leaves torch's defaults alone.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["ENV", "cache_dir", "enable"]

ENV = "ATROPOS_COMPILE_CACHE"
_enabled: list[Path | None] = []  # the directory enable() chose, once per process


def cache_dir(environ: dict[str, str] | None = None, torch_version: str | None = None) -> Path | None:
    """The directory compiles are kept in for this torch, or None when `ATROPOS_COMPILE_CACHE=off`."""
    env = os.environ if environ is None else environ
    value = env.get(ENV, "").strip()
    if value.lower() in {"off", "0", "false", "no"}:
        return None
    if value:
        base = Path(value).expanduser()
    else:
        base = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "atropos" / "compile"
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    return base / f"torch-{torch_version.replace('+', '-')}"


def enable() -> Path | None:
    """Point inductor's and Triton's caches at `cache_dir()` (unless the user set theirs); idempotent. Returns
    the directory, or None when turned off or not writable (then torch's defaults stay, and nothing fails)."""
    if _enabled:
        return _enabled[0]
    root = cache_dir()
    if root is not None:
        try:
            (root / "triton").mkdir(parents=True, exist_ok=True)
        except OSError:  # a read-only home: compiling still works, uncached across runs
            root = None
    if root is not None:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        # torch writes its default into the variable on first use: that value is not the user's choice
        if os.environ.get("TORCHINDUCTOR_CACHE_DIR") in (None, os.path.abspath(default_cache_dir())):
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
        os.environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    _enabled.append(root)
    return root
