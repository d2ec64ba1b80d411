"""Where the shipped models and the Jinja templates live.

`templates/`, `envs/` and `trainer/` are top-level folders of the repo that install as the subpackages
`atropos_cli.templates`, `atropos_cli.envs` and `atropos_cli.trainer` (setuptools `package-dir` in
pyproject.toml), so one import name finds them in a checkout, an editable install and a wheel alike.
"""

from __future__ import annotations

from pathlib import Path

__all__ = [
    "PACKAGE_DIR",
    "DEFAULT_MODEL",
    "templates_dir",
    "shipped_models",
    "resolve_model_path",
]

PACKAGE_DIR = Path(__file__).resolve().parent


def templates_dir() -> Path:
    """The folder of the Jinja templates (`templates/` in the repo, `atropos_cli/templates` when installed)."""
    import atropos_cli.templates

    return Path(atropos_cli.templates.__file__).resolve().parent


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
