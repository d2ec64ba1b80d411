"""W&B for ported envs: the real `wandb` when it is installed, else the no-op `compat.wandb_standin`.

Our runners never start a W&B run themselves; `log()` only reaches W&B when the env (or the user) called
`wandb.init()`, so an env with `use_wandb=True` runs offline without an account.
"""

from __future__ import annotations

from typing import Any

__all__ = ["wandb", "active"]


def _load() -> Any:
    import importlib.machinery

    try:  # an installed wandb, found without the env alias (whose stand-in notice is for env code's imports)
        if importlib.machinery.PathFinder.find_spec("wandb") is None:
            raise ImportError("wandb")
        import wandb as real
    except ImportError:
        from atropos_cli.compat import wandb_standin

        return wandb_standin
    return real


wandb = _load()


def active() -> bool:
    return getattr(wandb, "run", None) is not None
