"""Where the bundled folders (`envs/`, `templates/`, `trainer/`) and the shipped models live.

In a built wheel they are copied inside the package (`atropos_cli/_bundled/<name>`, see pyproject's
force-include); in a source checkout or an editable install they are the top-level folders of the repo.
One function answers for both, so no caller cares which install it runs from.
"""

from __future__ import annotations

import importlib.util
import sys
from functools import cache
from pathlib import Path
from types import ModuleType

from atropos_cli.errors import AtroposError

__all__ = [
    "bundled_dir",
    "import_bundled_package",
    "PACKAGE_DIR",
    "DEFAULT_MODEL",
    "shipped_models",
    "resolve_model_path",
]

PACKAGE_DIR = Path(__file__).resolve().parent


@cache
def bundled_dir(name: str) -> Path:
    """The directory of a bundled folder: `envs`, `templates` or `trainer`."""
    for candidate in (PACKAGE_DIR / "_bundled" / name, PACKAGE_DIR.parents[1] / name):
        if candidate.is_dir():
            return candidate
    raise AtroposError(
        f"bundled folder {name!r} not found next to {PACKAGE_DIR}",
        hint="reinstall atropos (pip install --force-reinstall atropos) or run from a full source checkout",
    )


def import_bundled_package(name: str, package_name: str) -> ModuleType:
    """Import a bundled folder as a package named `package_name` (e.g. trainer -> atropos_trainer)."""
    if package_name in sys.modules:
        return sys.modules[package_name]
    directory = bundled_dir(name)
    spec = importlib.util.spec_from_file_location(
        package_name, directory / "__init__.py", submodule_search_locations=[str(directory)]
    )
    if spec is None or spec.loader is None:  # pragma: no cover - only on a broken install
        raise AtroposError(f"cannot import bundled package {name!r} from {directory}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[package_name] = module
    spec.loader.exec_module(module)
    return module


SHIPPED_MODELS_DIR = PACKAGE_DIR / "models"
DEFAULT_MODEL = "atropos-tiny-arith"


def shipped_models() -> list[str]:
    """Short names of the models that ship inside the package."""
    if not SHIPPED_MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in SHIPPED_MODELS_DIR.iterdir() if (p / "config.json").is_file())


def resolve_model_path(name: str) -> str:
    """A shipped model's short name becomes its directory; anything else (a path, a hub id) is returned as is."""
    candidate = SHIPPED_MODELS_DIR / name
    if (candidate / "config.json").is_file():
        return str(candidate)
    return name
