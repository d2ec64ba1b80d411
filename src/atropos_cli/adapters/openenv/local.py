"""Starting an OpenEnv env server from its package (`openenv:PACKAGE`) on 127.0.0.1 and stopping it.

An OpenEnv env package (what `openenv init` generates and the published envs follow) has its FastAPI app at
`PACKAGE.server.app:app`; `openenv:PACKAGE.module:attr` names another. The server runs as
`PYTHON -m uvicorn APP --host 127.0.0.1 --port FREE_PORT` in its own process (the env's Python: the package and
openenv are often installed in a venv of their own), its output goes to a log file whose tail is shown when it
fails to start, and it is stopped (SIGTERM, then SIGKILL) when the env object goes away or the process exits.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from atropos_cli.adapters.childserver import ChildServer
from atropos_cli.errors import EnvLoadError
from atropos_cli.testing import free_port

__all__ = ["LocalServer", "app_path", "is_url"]


def is_url(target: str) -> bool:
    return target.startswith(("http://", "https://"))


def app_path(package: str) -> str:
    """`echo_env` -> `echo_env.server.app:app`; `pkg.module:attr` stays as it is."""
    if ":" in package:
        return package
    if not all(part.isidentifier() for part in package.split(".")):
        raise EnvLoadError(
            f"openenv:{package}: not a URL nor a Python package name",
            hint="openenv:http://HOST:PORT (a running server) or openenv:PACKAGE (an installed env package)",
        )
    return f"{package}.server.app:app"


class LocalServer:
    """One env server process; `url` once `start()` returned. Stopped by `stop()`, or when garbage-collected.

    A framework's subclass (the ORS adapter's) sets `kind` (its name in messages), `python_var` (the variable
    naming its Python), `resolve(target)` (the app it serves) and `command(port)` (how the process starts)."""

    kind = "OpenEnv"
    python_var = "ATROPOS_OPENENV_PYTHON"

    def __init__(self, package: str, python: str | None = None) -> None:
        self.app = self.resolve(package)
        self.python = python or os.environ.get(self.python_var) or sys.executable
        self.url = ""
        self._server = ChildServer(
            f"the {self.kind} server {self.app}",
            f"is the package installed for --env.python (or ${self.python_var})?",
        )

    @classmethod
    def resolve(cls, package: str) -> str:
        return app_path(package)

    def command(self, port: int) -> list[str]:
        return [self.python, "-m", "uvicorn", self.app, "--host", "127.0.0.1", "--port", str(port)]

    def check(self) -> None:
        """The python exists and finds the package (without importing it): a bad target fails in milliseconds."""
        if not Path(self.python).exists() and shutil.which(self.python) is None:
            raise EnvLoadError(
                f"python {self.python!r} for the {self.kind} server does not exist",
                hint=f"--env.python PATH (the interpreter that has {self.kind} and the env package)",
            )
        package = self.app.split(".", 1)[0].split(":", 1)[0]
        code = "import importlib.util, sys; sys.exit(0 if importlib.util.find_spec(sys.argv[1]) else 3)"
        found = subprocess.run([self.python, "-c", code, package], capture_output=True, timeout=60)
        if found.returncode != 0:
            raise EnvLoadError(
                f"the {self.kind} env package {package!r} is not installed for {self.python}",
                hint=f"pip install it there, or point --env.python (or ${self.python_var}) at its venv",
            )

    def start(self, timeout_s: float) -> str:
        self.check()
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self._server.start(self.command(port), self.url, timeout_s)
        return self.url

    def stop(self) -> None:
        self._server.stop()
