"""`atropos init-env NAME`: write a working starter env (`NAME.py`) and its test (`test_NAME.py`).

The files come from templates/init_env/*.j2 (plain Jinja, no autoescape: they are Python). Both pass as
written: the env is a small procedural SimpleEnv and the test checks its reward, its seeded items and one
group end to end on the fake inference server. Nothing is overwritten without `overwrite=True`.
"""

from __future__ import annotations

import keyword
import re
import sys
from pathlib import Path

from atropos_cli.errors import ConfigError, OutputExistsError

__all__ = ["scaffold_env", "class_name_for"]

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")
FILES = {"env.py.j2": "{name}.py", "test_env.py.j2": "test_{name}.py"}


def class_name_for(name: str) -> str:
    """my_task -> MyTaskEnv."""
    return "".join(part.capitalize() for part in name.split("_") if part) + "Env"


def _check_name(name: str) -> None:
    if not _NAME.match(name) or keyword.iskeyword(name):
        suggestion = re.sub(r"[^a-z0-9_]", "_", name.lower()).strip("_") or "my_env"
        if not suggestion[0].isalpha():
            suggestion = f"env_{suggestion}"
        raise ConfigError(
            f"env name {name!r} is not a valid module name",
            hint=f"use lowercase letters, digits and underscores, starting with a letter (e.g. {suggestion!r})",
        )
    if name in sys.stdlib_module_names or name in ("atropos", "atropos_cli", "test"):
        raise ConfigError(
            f"env name {name!r} would shadow the module {name!r}", hint=f"pick another name, e.g. '{name}_env'"
        )


def scaffold_env(name: str, directory: Path, *, overwrite: bool = False) -> list[Path]:
    """Render the env and its test into `directory`; returns the written paths."""
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    from atropos_cli.resources import templates_dir

    _check_name(name)
    directory = Path(directory)
    targets = {template: directory / out.format(name=name) for template, out in FILES.items()}
    taken = [p for p in targets.values() if p.exists()]
    if taken and not overwrite:
        raise OutputExistsError(f"{str(taken[0])!r} already exists", hint="pass --overwrite, or pick another name")
    jinja = Environment(
        loader=FileSystemLoader(templates_dir() / "init_env"),
        autoescape=False,  # the output is Python source, not HTML
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )
    directory.mkdir(parents=True, exist_ok=True)
    for template, path in targets.items():
        path.write_text(jinja.get_template(template).render(name=name, class_name=class_name_for(name)))
    return list(targets.values())
