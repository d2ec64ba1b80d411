"""The venvs of the frameworks we compare against (atroposlib, gymnasium, verifiers, openenv, …), as tests use them.

.ci/run builds each one beside ours and exports its python in a variable (ATROPOSLIB_PYTHON, ATROPOS_GYM_PYTHON,
…); it also exports ATROPOS_REQUIRE_VENVS=1. A test that needs a venv (or a file .ci/run prepares, such as
atroposlib's sdist) calls `venv_python(VAR, what)` or `missing(reason)`:

- where the venvs are expected (ATROPOS_REQUIRE_VENVS=1, or CI=true as CI services set it) a missing one FAILS
  the test: a broken differential build can never turn into a green run of its ours-only twins;
- elsewhere (a laptop) it skips, and `-ra` prints the reason with the setup line.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import pytest

REQUIRE_VAR = "ATROPOS_REQUIRE_VENVS"


def venvs_required() -> bool:
    """True where the differential venvs must be there: .ci/run (ATROPOS_REQUIRE_VENVS=1) or a CI service."""
    return os.environ.get(REQUIRE_VAR, "") == "1" or os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(reason: str) -> NoReturn:
    """A prerequisite .ci/run provides is absent: fail where it is required, skip (saying why) elsewhere."""
    if venvs_required():
        pytest.fail(f"{reason} ({REQUIRE_VAR}=1 or CI is set: .ci/run must provide it)", pytrace=False)
    pytest.skip(reason)


def venv_python(var: str, what: str) -> str:
    """The python named by $VAR (a framework's venv), or `missing()`."""
    python = os.environ.get(var, "")
    if not python or not Path(python).is_file():
        missing(f"set {var} to {what}'s venv python (.ci/run builds it)")
    return python
