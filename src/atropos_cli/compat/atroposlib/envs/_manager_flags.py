"""`--slurm` / `--testing` of `python env.py ...` (atroposlib's ServerManagerConfig) for the envs built in
this context: BaseEnv.build passes them to the env's constructor as atroposlib's CLI does, always, so an
`__init__(..., slurm=True)` default is not what decides. `Env.cli()` sets them; everything else gets false."""

from __future__ import annotations

import contextvars
import inspect

__all__ = ["manager_flags", "manager_kwargs", "reset_manager_flags"]

_manager_flags: contextvars.ContextVar[tuple[bool, bool]] = contextvars.ContextVar(
    "atroposlib_manager_flags", default=(False, False)
)


def manager_flags(slurm: bool = False, testing: bool = False) -> contextvars.Token:
    """Set the flags; give the token to `reset_manager_flags` when done."""
    return _manager_flags.set((slurm, testing))


def reset_manager_flags(token: contextvars.Token) -> None:
    _manager_flags.reset(token)


def manager_kwargs(env_cls: type | None = None) -> dict[str, bool]:
    """{"slurm", "testing"} as set, less those `env_cls.__init__` does not take (atroposlib passes both and
    fails on envs whose `__init__` names them otherwise, e.g. `slurm_job_id`: those get their own defaults)."""
    slurm, testing = _manager_flags.get()
    flags = {"slurm": slurm, "testing": testing}
    if env_cls is None:
        return flags
    try:
        parameters = inspect.signature(env_cls).parameters
    except (TypeError, ValueError):
        return flags
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return flags
    return {name: value for name, value in flags.items() if name in parameters}
