"""Serving an ORS env module on 127.0.0.1 with openreward's own `Server` (`ors:MODULE[:Class]`), and stopping it.

An ORS env (what `orwd init` generates) is a module that defines `openreward.environments.Environment`
subclasses and serves them with `Server([...]).run()` in its `__main__` block, on a fixed port. We start it
ourselves, on a free port of 127.0.0.1: `PYTHON -c LAUNCHER MODULE[:Class] PORT` imports the module (or, a
package without env classes, its `server` module), takes the class named after `:` or every Environment
subclass the module defines (the first is the server's default env), and runs `Server(classes).app` with
uvicorn. PYTHON is the env's own (openreward and the module are often installed in a venv of their own:
`--env.python`, or `$ATROPOS_ORS_PYTHON`). Start, health check, log and stop are the OpenEnv adapter's
(`LocalServer`).
"""

from __future__ import annotations

from atropos_cli.adapters.openenv.local import LocalServer
from atropos_cli.errors import EnvLoadError

__all__ = ["OrsLocalServer"]

# Runs in the env's Python (openreward installed there, atropos not): stdlib, openreward and uvicorn only.
LAUNCHER = """
import importlib, importlib.util, inspect, sys
import uvicorn
from openreward.environments import Environment, Server

target, port = sys.argv[1], int(sys.argv[2])
module_name, _, class_name = target.partition(":")
module = importlib.import_module(module_name)

def env_classes(module):
    return [
        value for value in vars(module).values()
        if inspect.isclass(value) and issubclass(value, Environment) and value is not Environment
        and value.__module__ == module.__name__ and not inspect.isabstract(value)
    ]

if class_name:
    classes = [getattr(module, class_name)]
else:
    classes = env_classes(module)
    if not classes and hasattr(module, "__path__") and importlib.util.find_spec(module_name + ".server"):
        classes = env_classes(importlib.import_module(module_name + ".server"))
if not classes:
    sys.exit(f"no openreward Environment class in {module_name}")
uvicorn.run(Server(classes).app, host="127.0.0.1", port=port, log_level="warning")
"""


class OrsLocalServer(LocalServer):
    kind = "ORS"
    python_var = "ATROPOS_ORS_PYTHON"

    @classmethod
    def resolve(cls, package: str) -> str:
        module, _, name = package.partition(":")
        if not all(part.isidentifier() for part in module.split(".")) or (name and not name.isidentifier()):
            raise EnvLoadError(
                f"ors:{package}: not a URL nor a Python module name",
                hint="ors:http://HOST:PORT (a running server) or ors:MODULE[:Class] (an installed ORS env module)",
            )
        return package

    def command(self, port: int) -> list[str]:
        return [self.python, "-c", LAUNCHER, self.app, str(port)]
