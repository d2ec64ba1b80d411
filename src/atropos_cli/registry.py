"""Finding envs: by bundled name (`envs/*.py`), by entry point (group `atropos.envs`), or by path `file.py[:Class]`.

`list_envs()` reads each bundled module's class attributes (name, description) by importing it; bundled env
modules import nothing heavy at module level, so listing stays fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from functools import cache
from importlib.metadata import entry_points
from pathlib import Path
from types import ModuleType

from atropos_cli.env import BaseEnv
from atropos_cli.errors import EnvLoadError, EnvNotFoundError
from atropos_cli.resources import bundled_dir, import_bundled_package

__all__ = ["EnvInfo", "resolve_env", "list_envs", "bundled_env_names"]

ENTRY_POINT_GROUP = "atropos.envs"
BUNDLED_PACKAGE = "atropos_envs"


@dataclass(frozen=True)
class EnvInfo:
    name: str
    description: str
    source: str


def _bundled_modules() -> list[str]:
    return sorted(p.stem for p in bundled_dir("envs").glob("*.py") if not p.stem.startswith("_"))


@cache
def _bundled_index() -> dict[str, str]:
    """Env name -> module stem (a module may be named differently from its env, e.g. math_env -> math)."""
    index: dict[str, str] = {}
    for stem in _bundled_modules():
        try:
            classes = _env_classes(_import_bundled(stem))
        except Exception:  # a broken bundled module still gets listed (by its file name) with its error
            classes = []
        for cls in classes or []:
            index.setdefault(cls.name, stem)
        if not classes:
            index.setdefault(stem, stem)
    return index


def bundled_env_names() -> list[str]:
    return sorted(_bundled_index())


def _env_classes(module: ModuleType) -> list[type[BaseEnv]]:
    return [
        obj
        for obj in vars(module).values()
        if inspect.isclass(obj)
        and issubclass(obj, BaseEnv)
        and obj.__module__ == module.__name__
        and not inspect.isabstract(obj)
    ]


def _pick_class(module: ModuleType, class_name: str | None, origin: str) -> type[BaseEnv]:
    if class_name:
        cls = getattr(module, class_name, None)
        if not (inspect.isclass(cls) and issubclass(cls, BaseEnv)):
            found = ", ".join(c.__name__ for c in _env_classes(module)) or "none"
            raise EnvLoadError(f"{origin} has no env class {class_name!r}", hint=f"env classes there: {found}")
        return cls
    explicit = getattr(module, "ENV", None)
    if inspect.isclass(explicit) and issubclass(explicit, BaseEnv):
        return explicit
    classes = _env_classes(module)
    if len(classes) == 1:
        return classes[0]
    if not classes:
        raise EnvLoadError(
            f"{origin} defines no BaseEnv subclass", hint="subclass atropos_cli.BaseEnv or SimpleEnv in that file"
        )
    names = ", ".join(c.__name__ for c in classes)
    raise EnvLoadError(f"{origin} defines several envs ({names})", hint=f"pick one: {origin}:{classes[0].__name__}")


def _import_file(path: Path) -> ModuleType:
    module_name = f"atropos_user_env_{abs(hash(str(path.resolve())))}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise EnvLoadError(f"cannot import {str(path)!r}", hint="env files must be Python (.py) files")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    sys.path.insert(0, str(path.parent))  # so an env file can import its siblings
    try:
        spec.loader.exec_module(module)
    except SyntaxError as exc:
        del sys.modules[module_name]
        raise EnvLoadError(
            f"{path}:{exc.lineno}: syntax error: {exc.msg}", hint="fix the env file and run again"
        ) from None
    except Exception as exc:  # any import-time failure of user code becomes one clear line
        del sys.modules[module_name]
        raise EnvLoadError(
            f"importing {str(path)!r} failed: {type(exc).__name__}: {exc}", hint="fix the env file and run again"
        ) from None
    finally:
        sys.path.remove(str(path.parent))
    return module


def _import_bundled(name: str) -> ModuleType:
    import_bundled_package("envs", BUNDLED_PACKAGE)
    return importlib.import_module(f"{BUNDLED_PACKAGE}.{name}")


def resolve_env(spec: str) -> type[BaseEnv]:
    """Turn `arithmetic`, `my_env.py`, `my_env.py:MyEnv` or an entry-point name into an env class."""
    path_part, _, class_name = spec.partition(":")
    if path_part.endswith(".py") or "/" in path_part:
        path = Path(path_part)
        if not path.is_file():
            raise EnvNotFoundError(f"env file {path_part!r} does not exist", hint="check the path")
        return _pick_class(_import_file(path), class_name or None, path_part)
    index = _bundled_index()
    stem = index.get(path_part) or (path_part if path_part in _bundled_modules() else None)
    if stem is not None:  # by env name (math), or by its module's file name (math_env)
        module = _import_bundled(stem)
        if not class_name:
            matching = [c for c in _env_classes(module) if c.name == path_part]
            if len(matching) == 1:
                return matching[0]
        return _pick_class(module, class_name or None, f"bundled env {path_part!r}")
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == path_part:
            try:
                loaded = ep.load()
            except Exception as exc:  # a broken third-party plugin: say which one
                raise EnvLoadError(f"entry point {ep.value!r} failed to load: {exc}") from None
            if inspect.isclass(loaded) and issubclass(loaded, BaseEnv):
                return loaded
            return _pick_class(loaded, class_name or None, f"entry point {ep.value!r}")
    names = bundled_env_names()
    import difflib

    close = difflib.get_close_matches(path_part, names, n=1)
    maybe = f"did you mean {close[0]!r}? " if close else ""
    raise EnvNotFoundError(
        f"unknown env {spec!r}",
        hint=f"{maybe}bundled envs: {', '.join(names)} (see `atropos envs`); or pass a path to a .py file",
    )


def list_envs() -> list[EnvInfo]:
    """Bundled envs and installed entry points, each with its one-line description."""
    infos = []
    for name in bundled_env_names():
        try:
            cls = resolve_env(name)
            description = cls.description or (inspect.getdoc(cls) or "").split("\n")[0]
            name = cls.name if cls.name != "env" else name
        except (EnvLoadError, ImportError) as exc:
            description = f"(cannot load: {exc})"
        infos.append(EnvInfo(name, description, "bundled"))
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        infos.append(EnvInfo(ep.name, ep.value, "entry point"))
    return infos
