"""Calling an env's own hooks (`setup()`, `evaluate()`) so that a bug in env code is one line, not a traceback.

`process`, `evaluate` and `serve` await `call_env(env, "setup", env.setup())`: an `AtroposError` passes
through unchanged (it already speaks to the user); any other exception becomes `EnvCodeError` naming the hook,
the exception and the file:line in the env's code where it was raised, e.g.::

    error: the env's evaluate() raised ZeroDivisionError: division by zero (at my_env.py:12)
"""

from __future__ import annotations

import sys
import traceback
from collections.abc import Awaitable
from pathlib import Path
from typing import Any, TypeVar

from atropos_cli.errors import AtroposError, EnvCodeError

__all__ = ["EnvCodeError", "call_env", "env_code_location"]

T = TypeVar("T")
_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def _module_file(env: Any) -> str | None:
    module = sys.modules.get(type(env).__module__)
    return getattr(module, "__file__", None)


def env_code_location(exc: BaseException, env: Any) -> str | None:
    """'file:line' of the deepest frame in the env's module, else the deepest frame outside atropos_cli."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = _module_file(env)
    if own is not None:
        in_env = [f for f in frames if Path(f.filename).resolve() == Path(own).resolve()]
        if in_env:
            return f"{in_env[-1].filename}:{in_env[-1].lineno}"
    outside = [f for f in frames if not Path(f.filename).resolve().is_relative_to(_PACKAGE_DIR)]
    return f"{outside[-1].filename}:{outside[-1].lineno}" if outside else None


async def call_env(env: Any, hook: str, awaitable: Awaitable[T]) -> T:
    """Await an env hook; a non-AtroposError becomes one EnvCodeError line with the env code's file:line."""
    try:
        return await awaitable
    except AtroposError:
        raise
    except Exception as exc:
        where = env_code_location(exc, env)
        first_line = (str(exc).strip().splitlines() or [""])[0]
        detail = f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__
        raise EnvCodeError(
            f"the env's {hook}() raised {detail}" + (f" (at {where})" if where else ""),
            hint=f"fix {type(env).__name__}.{hook}() in the env's code",
        ) from None
