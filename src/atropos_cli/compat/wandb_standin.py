"""`import wandb` in an env file when wandb is not installed: a no-op module (every call does nothing).

`env.aliases` maps the name `wandb` here only while the real package cannot be found, so a user with wandb
installed gets the real one; the alias logs one notice per process when an env's `import wandb` gets this.
Attributes env code reads (`wandb.run`, `wandb.config`) exist; any other name (`wandb.Histogram`,
`wandb.Image`, ...) is a no-op callable.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Table", "init", "log", "finish", "run", "config"]

run = None
config: dict[str, Any] = {}


class Table:
    """wandb.Table's constructor and `add_data`; rows are kept so env code may read them back."""

    def __init__(self, columns: list[str] | None = None, data: list | None = None, **_: Any) -> None:
        self.columns = list(columns or [])
        self.data = list(data or [])

    def add_data(self, *row: Any) -> None:
        self.data.append(list(row))


class _NoOp:
    """Any other wandb object: callable, any attribute, does nothing."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _NoOp:
        return self

    def __getattr__(self, name: str) -> _NoOp:
        return self


def init(*args: Any, **kwargs: Any) -> None:
    return None


def log(*args: Any, **kwargs: Any) -> None:
    return None


def finish(*args: Any, **kwargs: Any) -> None:
    return None


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    return _NoOp
