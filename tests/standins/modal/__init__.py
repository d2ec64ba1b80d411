"""A stand-in for the `modal` package (Modal's serverless functions), for Atropos env files that call a Modal
function by name: `modal.Function.from_name(APP, NAME).remote.aio(*args)` runs NAME from the Python file that
defines APP (`modal.App(APP)` + `@app.function(...)`) in a fresh local subprocess, as Modal would in a fresh
container. Which file defines which app: the JSON map in MODAL_STANDIN_APPS ({"app": "/path/file.py"}).

Tests only (tests/test_atropos_corpus_runs.py puts this folder first on sys.path in both runtimes); the code it
runs is the fake server's own answers. Only what the corpus uses is here: App, App.function, Image's builder
chain, Function.from_name, .remote.aio / .remote, exception.RemoteError.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from . import exception

__all__ = ["App", "Image", "Function", "exception"]

_MARK = "MODAL-STANDIN-RESULT "
_RUNNER = f"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("modal_standin_app", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
args, kwargs = json.load(sys.stdin)
result = getattr(module, sys.argv[2])(*args, **kwargs)
sys.stdout.write("\\n{_MARK}" + json.dumps(result, default=str) + "\\n")
sys.stdout.flush()
"""


class Image:
    @classmethod
    def debian_slim(cls, *args: Any, **kwargs: Any) -> Image:
        return cls()

    def __getattr__(self, name: str) -> Any:  # pip_install, apt_install, run_commands, ...: the same image
        return lambda *args, **kwargs: self


class App:
    def __init__(self, name: str, *args: Any, **kwargs: Any) -> None:
        self.name = name

    def function(self, *args: Any, **kwargs: Any) -> Any:
        return lambda fn: fn  # in the defining file the function stays a plain function


class _Remote:
    def __init__(self, app: str, name: str) -> None:
        self.app, self.name = app, name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        apps = json.loads(os.environ.get("MODAL_STANDIN_APPS", "{}"))
        if self.app not in apps:
            raise exception.NotFoundError(f"no stand-in for Modal app {self.app!r} (set MODAL_STANDIN_APPS)")
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH", "")]),
        }
        done = subprocess.run(
            [sys.executable, "-c", _RUNNER, apps[self.app], self.name],
            input=json.dumps([list(args), kwargs]), capture_output=True, text=True, timeout=120, env=env,
        )  # fmt: skip
        for line in reversed(done.stdout.splitlines()):
            if line.startswith(_MARK):
                return json.loads(line[len(_MARK) :])
        raise exception.RemoteError(f"{self.app}.{self.name} failed: {done.stderr.strip()[-300:]}")

    async def aio(self, *args: Any, **kwargs: Any) -> Any:
        return await asyncio.to_thread(self, *args, **kwargs)


class Function:
    def __init__(self, app: str, name: str) -> None:
        self.remote = _Remote(app, name)

    @classmethod
    def from_name(cls, app: str, name: str, *args: Any, **kwargs: Any) -> Function:
        return cls(app, name)
