"""W&B for ported envs: the real `wandb` when it is installed, else no-op stand-ins (never a crash).

Our runners never start a W&B run themselves; `log()` only reaches W&B when the env (or the user) called
`wandb.init()`, so an env with `use_wandb=True` runs offline without an account.
"""

from __future__ import annotations

from typing import Any

__all__ = ["wandb", "active"]


class _Table:
    def __init__(self, columns: list[str] | None = None, data: list | None = None, **_: Any) -> None:
        self.columns = list(columns or [])
        self.data = list(data or [])

    def add_data(self, *row: Any) -> None:
        self.data.append(list(row))


class _NoWandb:
    """The parts of the wandb module env code calls; each does nothing."""

    run = None
    Table = _Table

    def init(self, *args: Any, **kwargs: Any) -> None:
        return None

    def log(self, *args: Any, **kwargs: Any) -> None:
        return None

    def finish(self, *args: Any, **kwargs: Any) -> None:
        return None


def _load() -> Any:
    try:
        import wandb as real
    except ImportError:
        return _NoWandb()
    return real


wandb = _load()


def active() -> bool:
    return getattr(wandb, "run", None) is not None
