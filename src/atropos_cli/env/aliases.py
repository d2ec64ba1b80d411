"""The `atroposlib` import alias: while our CLI loads an env file, `import atroposlib...` resolves to our
compatibility layer `atropos_cli.compat.atroposlib` (same module objects, so classes are identical).

The rule: the alias is a finder placed first on `sys.meta_path`, so it wins over a real atroposlib installed
in the same environment; it is installed by `env.registry` before an env file runs and stays for the life of
the process (env code may import atroposlib lazily, inside methods). `wandb`, when it is not installed, maps to
a no-op stand-in (`STAND_INS`) the same way. A module already imported as
`atroposlib...` before the alias was installed (only possible in a process that imported the real package
itself) is left alone: `python env.py` after the documented `sed` never imports the name at all.

The target is named by a string, not imported here: compat sits above `env` in the layers (ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from pathlib import Path
from types import FrameType, ModuleType

__all__ = ["ALIASES", "STAND_INS", "install_aliases", "AliasFinder"]

ALIASES = {"atroposlib": "atropos_cli.compat.atroposlib"}
# names mapped only while the real package cannot be found (env files import them; we can stand in)
STAND_INS = {"wandb": "atropos_cli.compat.wandb_standin"}


class _AliasLoader(importlib.abc.Loader):
    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the target module was executed when it was imported under its own name."""


class AliasFinder(importlib.abc.MetaPathFinder):
    """Maps `atroposlib` and `atroposlib.x.y` to `atropos_cli.compat.atroposlib` and `....x.y`."""

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        stand_in = STAND_INS.get(fullname)
        if stand_in is not None and importlib.machinery.PathFinder.find_spec(fullname) is None and _from_env_code():
            _notice_once(fullname)
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(stand_in))
        for alias, real in ALIASES.items():
            if fullname == alias or fullname.startswith(alias + "."):
                real_name = real + fullname[len(alias) :]
                if importlib.util.find_spec(real_name) is None:
                    return None  # a missing submodule: the usual ModuleNotFoundError names it
                is_package = hasattr(importlib.import_module(real_name), "__path__")
                return importlib.machinery.ModuleSpec(fullname, _AliasLoader(real_name), is_package=is_package)
        return None


_NOTICED: set[str] = set()
_OWN_CODE = str(Path(__file__).resolve().parents[1])


def _from_env_code() -> bool:
    """Whether the import being resolved is written in user code (an env file), not in an installed library
    probing for an optional package (transformers asks `find_spec("wandb")`: it must keep seeing none)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None and ("importlib" in frame.f_code.co_filename or frame.f_code.co_filename == __file__):
        frame = frame.f_back
    where = frame.f_code.co_filename if frame is not None else ""
    return not (where.startswith(_OWN_CODE) or "site-packages" in where or "dist-packages" in where)


def _notice_once(name: str) -> None:
    if name not in _NOTICED:
        _NOTICED.add(name)
        logging.getLogger("atropos_cli.env").warning(
            "%s is not installed: the env's calls to it do nothing (pip install %s to use it)", name, name
        )


def install_aliases() -> None:
    """Put the alias finder first on sys.meta_path (once)."""
    if not any(isinstance(finder, AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AliasFinder())
