"""`--slurm` / `--testing` of `python env.py ...` (atroposlib's ServerManagerConfig) for the envs built in
this context: BaseEnv.build passes them to the env's constructor as atroposlib's CLI does, always, so an
`__init__(..., slurm=True)` default is not what decides. `Env.cli()` sets them; everything else gets false."""

from __future__ import annotations

import contextvars

__all__ = ["manager_flags", "manager_kwargs", "reset_manager_flags"]

_manager_flags: contextvars.ContextVar[tuple[bool, bool]] = contextvars.ContextVar(
    "atroposlib_manager_flags", default=(False, False)
)


def manager_flags(slurm: bool = False, testing: bool = False) -> contextvars.Token:
    """Set the flags; give the token to `reset_manager_flags` when done."""
    return _manager_flags.set((slurm, testing))


def reset_manager_flags(token: contextvars.Token) -> None:
    _manager_flags.reset(token)


def manager_kwargs() -> dict[str, bool]:
    slurm, testing = _manager_flags.get()
    return {"slurm": slurm, "testing": testing}
