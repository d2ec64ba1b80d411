"""Where a `nemogym:` env's resources server is, and starting it on 127.0.0.1 as NeMo Gym's own launcher does.

TARGET is one of:
- `http(s)://HOST:PORT`: a resources server already running (e.g. started by `ng_run`); the tasks come from
  `--env.dataset`;
- a folder in NeMo Gym's layout (`app.py`, `configs/*.yaml`, `data/*.jsonl`: what `resources_servers/NAME`
  holds in NeMo Gym's tree);
- `NAME`: `resources_servers/NAME` of the nemo-gym installed for the server's Python (its shipped examples,
  such as `example_single_tool_call`).

A folder is started as `ng_run` starts one server: `PYTHON app.py` in the folder, the global config in
`NEMO_GYM_CONFIG_DICT` (the server's own block from its config YAML, on a free port of 127.0.0.1) and its name
in `NEMO_GYM_CONFIG_PATH`; no head server, no per-server venv: PYTHON (`--env.python`, else
`$ATROPOS_NEMOGYM_PYTHON`) must have nemo-gym and the server's requirements. The default dataset of a folder
is its one `data/*.jsonl` task file (`*_rollouts.jsonl` and the like are results, not tasks).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from atropos_cli.adapters.childserver import ChildServer
from atropos_cli.errors import EnvLoadError
from atropos_cli.testing import free_port

__all__ = ["ResourcesServer", "ServerFolder", "find_folder", "is_url", "server_python"]

PYTHON_VAR = "ATROPOS_NEMOGYM_PYTHON"
_NOT_TASKS = ("_rollouts.jsonl", "_metrics.jsonl", "_materialized_inputs.jsonl")
_HINT = f"--env.python PATH (or ${PYTHON_VAR}): the Python that has nemo-gym and the server's requirements"


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def server_python(python: str | None) -> str:
    chosen = python or os.environ.get(PYTHON_VAR) or ""
    if not chosen or (not Path(chosen).exists() and shutil.which(chosen) is None):
        raise EnvLoadError(
            f"no Python with nemo-gym for the resources server ({chosen or 'none given'})",
            hint=_HINT,
        )
    return chosen


@dataclass(frozen=True)
class ServerFolder:
    """A resources server's folder: its entrypoint, the server block of its config, its default task file."""

    path: Path
    entrypoint: str
    config: dict[str, Any]
    dataset: Path | None

    @property
    def name(self) -> str:
        return self.path.name


def find_folder(target: str, python: str | None) -> ServerFolder:
    """The folder TARGET names (a path, else `resources_servers/TARGET` of PYTHON's nemo-gym), read."""
    path = Path(target).expanduser()
    if not path.is_dir():
        if os.sep in target or "/" in target or not target.isidentifier():
            raise EnvLoadError(
                f"nemogym:{target}: no such folder",
                hint="nemogym:DIR (a resources server folder: app.py, configs/, data/), nemogym:NAME or nemogym:URL",
            )
        path = _shipped_folder(target, server_python(python))
    return _read_folder(path.resolve())


def _shipped_folder(name: str, python: str) -> Path:
    code = (
        "import importlib.util, sys\n"
        "spec = importlib.util.find_spec('resources_servers.' + sys.argv[1])\n"
        "print(list(spec.submodule_search_locations)[0] if spec else '')"
    )
    try:
        done = subprocess.run([python, "-c", code, name], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvLoadError(f"could not run {python} to find the resources server {name!r}: {exc}", hint=_HINT) from None
    found = done.stdout.strip() if done.returncode == 0 else ""
    if not found:
        raise EnvLoadError(
            f"nemogym:{name}: not a folder, nor a resources server of the nemo-gym installed for {python}",
            hint="nemogym:DIR (a resources server folder), or a name under nemo-gym's resources_servers/",
        )
    return Path(found)


def _read_folder(path: Path) -> ServerFolder:
    config = _server_block(path)
    entrypoint = str(config.get("entrypoint", "app.py"))
    if not (path / entrypoint).is_file():
        raise EnvLoadError(
            f"nemogym:{path}: no {entrypoint} in the folder",
            hint="a resources server folder has its app.py (or the entrypoint its configs/*.yaml names)",
        )
    tasks = sorted(p for p in (path / "data").glob("*.jsonl") if not p.name.endswith(_NOT_TASKS))
    return ServerFolder(path, entrypoint, config, tasks[0] if len(tasks) == 1 else None)


def _server_block(path: Path) -> dict[str, Any]:
    """The folder's own block in its configs/*.yaml (`X: {resources_servers: {FOLDER: {...}}}`), or {}."""
    import yaml

    for config_file in sorted((path / "configs").glob("*.yaml")):
        try:
            data = yaml.safe_load(config_file.read_text()) or {}
        except (OSError, yaml.YAMLError):
            continue
        for block in data.values() if isinstance(data, dict) else []:
            servers = block.get("resources_servers") if isinstance(block, dict) else None
            if isinstance(servers, dict) and isinstance(servers.get(path.name), dict):
                return dict(servers[path.name])
    return {}


class ResourcesServer:
    """A resources server folder running as a child process; `url` once started."""

    def __init__(self, folder: ServerFolder, python: str | None) -> None:
        self.folder = folder
        self.python = server_python(python)
        self.url = ""
        self._server = ChildServer(f"the NeMo Gym resources server {folder.path}", _HINT)

    def start(self, timeout_s: float) -> str:
        port = free_port()
        name = self.folder.name
        block = {**self.folder.config, "entrypoint": self.folder.entrypoint, "host": "127.0.0.1", "port": port}
        global_config = {
            "head_server": {"host": "127.0.0.1", "port": free_port()},  # never started: no server calls it here
            "dry_run": False,
            name: {"resources_servers": {name: block}},
        }
        env = {**os.environ, "NEMO_GYM_CONFIG_DICT": json.dumps(global_config), "NEMO_GYM_CONFIG_PATH": name}
        self.url = f"http://127.0.0.1:{port}"
        command = [self.python, self.folder.entrypoint]
        self._server.start(command, self.url, timeout_s, cwd=str(self.folder.path), env=env)
        return self.url

    def stop(self) -> None:
        self._server.stop()

    @property
    def process(self) -> Any:
        return self._server.process
