"""Finding envs: by name (entry-point group `atropos.envs`: the bundled envs are this package's own entry points,
installed plugins add theirs), by a bundled module's file name (`math_env`), by path `file.py[:Class]`, or
by `PREFIX:TARGET` for envs of other frameworks (`vf:NAME`, `gym:ID`, ...: the `ADAPTERS` table). A file that
defines several env classes runs the one named after `:`, else the one its `__main__` block runs (`X.cli()`).

An adapter is a module of `atropos_cli.adapters` (a layer above `env`, so it is named here by a string and
imported on use) that defines `CONFIG`, its env config class (whose own fields are the `--env.*` flags listed
in `--help`), and `load_env_class(target) -> type[BaseEnv]`. Adding a framework is one line in `ADAPTERS`.

`list_envs()` loads each entry point to read its class attributes (name, description); env modules import
nothing heavy at module level, so listing stays fast.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import re
import sys
import traceback
from dataclasses import dataclass
from functools import cache
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType

from atropos_cli.env.aliases import ALIASES, install_aliases
from atropos_cli.env.base import BaseEnv
from atropos_cli.env.main_block import main_block_class
from atropos_cli.errors import EnvLoadError, EnvNotFoundError

__all__ = ["EnvInfo", "resolve_env", "list_envs", "bundled_env_names", "ADAPTERS", "adapter_module", "spec_stem"]

ENTRY_POINT_GROUP = "atropos.envs"
BUNDLED_PACKAGE = "atropos_cli.envs"

# `PREFIX:TARGET` -> the adapter module that turns TARGET into an env class (one line per framework).
ADAPTERS: dict[str, str] = {
    "gym": "atropos_cli.adapters.gym",
    "harness": "atropos_cli.adapters.harness",
    "nemogym": "atropos_cli.adapters.nemogym",
    "openenv": "atropos_cli.adapters.openenv",
    "ors": "atropos_cli.adapters.ors",
    "vf": "atropos_cli.adapters.vf",
}


@dataclass(frozen=True)
class EnvInfo:
    name: str
    description: str
    source: str


@cache
def _entry_points() -> dict[str, EntryPoint]:
    """Env name -> its entry point; the first one of a name wins (ours are listed with the package)."""
    found: dict[str, EntryPoint] = {}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep)
    return found


def _is_bundled(ep: EntryPoint) -> bool:
    return ep.value.startswith(BUNDLED_PACKAGE + ".")


def bundled_env_names() -> list[str]:
    return sorted(name for name, ep in _entry_points().items() if _is_bundled(ep))


def _bundled_module_stems() -> dict[str, str]:
    """A bundled module's file name -> its env name (`math_env` -> `math`)."""
    return {ep.module.rsplit(".", 1)[-1]: name for name, ep in _entry_points().items() if _is_bundled(ep)}


def _load_entry_point(ep: EntryPoint, class_name: str | None) -> type[BaseEnv]:
    try:
        loaded = ep.load() if not class_name else importlib.import_module(ep.module)
    except Exception as exc:  # a broken plugin (or bundled module): say which one
        raise EnvLoadError(
            f"entry point {ep.value!r} failed to load: {type(exc).__name__}: {exc}",
            hint="reinstall the package that provides it, or fix the module",
        ) from None
    if inspect.isclass(loaded) and issubclass(loaded, BaseEnv):
        return loaded
    if not isinstance(loaded, ModuleType):
        raise EnvLoadError(
            f"entry point {ep.value!r} is a {type(loaded).__name__}, not an env class or a module",
            hint="point it at a BaseEnv subclass (module:Class) or at a module that defines one",
        )
    return _pick_class(loaded, class_name, f"entry point {ep.value!r}")


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
    main = main_block_env(module)
    if main is not None:
        return main
    names = ", ".join(c.__name__ for c in classes)
    raise EnvLoadError(
        f"{origin} defines several envs ({names}) and its __main__ block runs none of them",
        hint=f"pick one: {origin}:{classes[0].__name__}",
    )


def main_block_env(module: ModuleType) -> type[BaseEnv] | None:
    """The env class the module's file runs as a script (`X.cli()` in its `__main__` block), as atroposlib does."""
    path = getattr(module, "__file__", None)
    try:
        source = Path(path).read_text(encoding="utf-8") if path else ""
    except (OSError, UnicodeDecodeError):
        return None
    name = main_block_class(source)
    cls = getattr(module, name, None) if name else None
    return cls if inspect.isclass(cls) and issubclass(cls, BaseEnv) else None


def _import_file(path: Path) -> ModuleType:
    """Run an env file as a module; one with relative imports (`from .x import y`) as a member of its folder's
    package, the way `python -m folder.file` runs it."""
    install_aliases()  # `import atroposlib...` in the file resolves to our compatibility layer
    try:
        return _exec_file(path, f"atropos_user_env_{abs(hash(str(path.resolve())))}")
    except ImportError as exc:
        if "no known parent package" not in str(exc):
            raise _import_error(path, exc) from None
    package_dir = path.resolve().parent
    sys.path.insert(0, str(package_dir.parent))
    try:  # the package first (its __init__ may import this very module), then the module in it
        return importlib.import_module(f"{package_dir.name}.{path.stem}")
    except ImportError as exc:
        raise _import_error(path, exc) from None
    except Exception as exc:  # any import-time failure of user code becomes one clear line
        raise EnvLoadError(
            f"importing {str(path)!r} failed: {type(exc).__name__}: {exc}", hint="fix the env file and run again"
        ) from None
    finally:
        sys.path.remove(str(package_dir.parent))


def _exec_file(path: Path, module_name: str) -> ModuleType:
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
    except ImportError:
        del sys.modules[module_name]
        raise
    except Exception as exc:  # any import-time failure of user code becomes one clear line
        del sys.modules[module_name]
        raise EnvLoadError(
            f"importing {str(path)!r} failed: {type(exc).__name__}: {exc}", hint="fix the env file and run again"
        ) from None
    finally:
        sys.path.remove(str(path.parent))
    return module


# import names whose PyPI package is named differently (what `pip install` needs)
PACKAGE_OF = {
    "dotenv": "python-dotenv",
    "sklearn": "scikit-learn",
    "PIL": "pillow",
    "yaml": "pyyaml",
    "bs4": "beautifulsoup4",
    "math_verify": "math-verify",
    "latex2sympy2_extended": "latex2sympy2-extended",
    "reasoning_gym": "reasoning-gym",
    "pydantic_settings": "pydantic-settings",
    "poke_env": "poke-env",
    "eth_account": "eth-account",
    "google": "google-genai",
    "cv2": "opencv-python",
}
# what `atropos[atroposlib]` installs, by import name (the hint says so)
IN_EXTRA = {
    "openai", "datasets", "math_verify", "latex2sympy2_extended", "gymnasium", "nltk", "reasoning_gym", "dotenv",
    "tqdm", "numpy", "yaml", "PIL", "requests", "tenacity", "scipy", "sklearn", "pandas", "langdetect", "httpx",
    "regex", "toml", "xmltodict", "bs4", "pydantic_settings", "asteval",
}  # fmt: skip


def _import_error(path: Path, exc: ImportError) -> EnvLoadError:
    """One line naming the env file, its line and the missing name: an atroposlib name we lack, or the package
    to install for a missing third-party module."""
    line = next((f.lineno for f in reversed(traceback.extract_tb(exc.__traceback__)) if f.filename == str(path)), None)
    where = f"{path}:{line}" if line else str(path)
    compat = ALIASES["atroposlib"]
    missing = (getattr(exc, "name", None) or "").replace(compat, "atroposlib")
    found = re.search(r"cannot import name '([^']+)' from '([^']+)'", str(exc))
    module = found.group(2).replace(compat, "atroposlib") if found else missing
    if found:
        message = f"{where}: {module} has no {found.group(1)!r}"
    elif missing:
        message = f"{where}: no module named {missing!r}"
    else:  # e.g. a relative import outside a package
        message = f"{where}: {(str(exc).strip().splitlines() or [type(exc).__name__])[0]}"
    top = module.split(".")[0]
    if top == "atroposlib":
        hint = "atropos implements atroposlib 0.4.0's env surface; this name is not part of it (docs/envs-atropos.md)"
    elif found or not top:
        hint = "fix the import, or install the version of the package that provides this name"
    else:
        package = PACKAGE_OF.get(top, top.replace("_", "-"))
        extra = ' (or pip install "atropos[atroposlib]", which has it)' if top in IN_EXTRA else ""
        hint = f"pip install {package}{extra}"
    return EnvLoadError(message, hint=hint)


def adapter_module(prefix: str) -> ModuleType:
    """The adapter module of a prefix of `ADAPTERS` (imported now: it imports its framework only when used)."""
    try:
        return importlib.import_module(ADAPTERS[prefix])
    except ImportError as exc:
        raise EnvLoadError(
            f"the {prefix}: adapter failed to import: {exc}", hint="reinstall atropos (pip install -e .)"
        ) from None


def spec_stem(spec: str) -> str:
    """A short file-name-safe name of an env spec, for default output dirs: `my_env.py:Env` -> `my_env`,
    `gym:games:GuessNumber-v0` -> `gym-GuessNumber-v0`, `vf:reverse_text` -> `vf-reverse_text`."""
    head, _, rest = spec.partition(":")
    if head in ADAPTERS and rest:
        tail = re.split(r"[:/\\]", rest.rstrip("/\\"))[-1]
        return f"{head}-{_file_safe(Path(tail).stem or tail)}"
    return _file_safe(Path(head).stem)


def _file_safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def _resolve_adapter(prefix: str, target: str, spec: str) -> type[BaseEnv]:
    if not target.strip():
        raise EnvNotFoundError(f"env {spec!r} names no {prefix} env", hint=f"write {prefix}:NAME")
    loaded = adapter_module(prefix).load_env_class(target.strip())
    if not (inspect.isclass(loaded) and issubclass(loaded, BaseEnv)):
        raise EnvLoadError(f"the {prefix}: adapter returned {loaded!r}, not an env class", hint="report this bug")
    return loaded


def resolve_env(spec: str) -> type[BaseEnv]:
    """Turn `arithmetic`, `math_env`, `my_env.py`, `my_env.py:MyEnv`, an entry-point name or `PREFIX:TARGET`
    (an env of another framework, see `ADAPTERS`) into an env class."""
    path_part, _, class_name = spec.partition(":")
    if path_part in ADAPTERS:
        return _resolve_adapter(path_part, class_name, spec)
    if path_part.endswith(".py") or "/" in path_part:
        path = Path(path_part)
        if not path.is_file():
            raise EnvNotFoundError(f"env file {path_part!r} does not exist", hint="check the path")
        return _pick_class(_import_file(path), class_name or None, path_part)
    name = path_part if path_part in _entry_points() else _bundled_module_stems().get(path_part)
    if name is not None:
        return _load_entry_point(_entry_points()[name], class_name or None)
    import difflib

    names = bundled_env_names()
    close = difflib.get_close_matches(path_part, list(_entry_points()), n=1)
    maybe = f"did you mean {close[0]!r}? " if close else ""
    raise EnvNotFoundError(
        f"unknown env {spec!r}",
        hint=f"{maybe}bundled envs: {', '.join(names)} (see `atropos envs`); or pass a path to a .py file"
        + (f", or {' / '.join(p + ':NAME' for p in ADAPTERS)} for another framework's env" if ADAPTERS else ""),
    )


def list_envs() -> list[EnvInfo]:
    """Bundled envs and installed entry points, each with its one-line description."""
    infos = []
    for name, ep in sorted(_entry_points().items()):
        try:
            cls = resolve_env(name)
            description = cls.description or (inspect.getdoc(cls) or "").split("\n")[0]
        except (EnvLoadError, ImportError) as exc:
            description = f"(cannot load: {exc})"
        infos.append(EnvInfo(name, description, "bundled" if _is_bundled(ep) else f"entry point {ep.value}"))
    return infos
