"""verifiers' subprocess runtime, offline: harness programs run on this interpreter instead of a `uv` environment.

A verifiers harness (`null`, `bash`, ...) is a PEP 723 script that the runtime prepares with `uv sync --script`,
which downloads the script's dependencies (and `uv` itself when it is missing): that fails offline. verifiers
already runs a task's tool servers in the subprocess runtime on its own interpreter (`sys.executable`); this
module does the same for harness programs. Each dependency the script declares must be installed here, at a
version its pin allows; a missing one fails the rollout with one line naming it (the `verifiers` package
installs what its own harness programs declare).

`run_programs_here()` switches verifiers' `SubprocessRuntime.prepare_uv_script` to this for the process (the
vf: adapter calls it when `--env.local_runtime` is on); other runtimes (docker, prime, ...) are untouched.
"""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

__all__ = ["missing_dependencies", "run_programs_here", "script_dependencies"]

_BLOCK_START = "# /// script"
_BLOCK_END = "# ///"


def script_dependencies(script: str) -> list[str]:
    """The `dependencies` of a script's PEP 723 `script` block ([] when it has none)."""
    import tomllib  # Python >= 3.11, as verifiers 0.4.0 requires

    lines = script.splitlines()
    try:
        start = lines.index(_BLOCK_START)
        end = lines.index(_BLOCK_END, start + 1)
    except ValueError:
        return []
    body = "\n".join(line[2:] if line.startswith("# ") else line[1:] for line in lines[start + 1 : end])
    return list(tomllib.loads(body).get("dependencies", []))


def missing_dependencies(requirements: list[str]) -> list[str]:
    """The requirements this interpreter does not satisfy, each as 'REQUIREMENT (why)'."""
    from packaging.requirements import Requirement

    missing = []
    for text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(f"{text} (not installed)")
            continue
        if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
            missing.append(f"{text} ({version} is installed)")
    return missing


async def _prepare_here(self: Any, script: str | bytes, env: dict[str, str] | None = None, **_: Any) -> list[str]:
    """`SubprocessRuntime.prepare_uv_script`, offline: write the script into the rollout's workdir and run it
    with this interpreter, once its declared dependencies are checked."""
    from verifiers.v1.errors import HarnessError

    text = script.decode() if isinstance(script, bytes) else script
    missing = missing_dependencies(script_dependencies(text))
    if missing:
        raise HarnessError(
            f"the harness program needs {', '.join(missing)} beside verifiers (the local runtime runs it offline, "
            f"on {sys.executable})"
        )
    digest = hashlib.sha256(text.encode()).hexdigest()[:16]
    path = Path(self.workdir) / f"vf-program-{digest}.py"
    path.write_text(text)
    return [sys.executable, str(path)]


def run_programs_here() -> None:
    """From now on (this process), verifiers' subprocess runtime runs harness programs on this interpreter."""
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    SubprocessRuntime.prepare_uv_script = _prepare_here  # type: ignore[method-assign]
