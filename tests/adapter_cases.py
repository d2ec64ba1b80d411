"""The adapters' test cases (one `Case` per framework: its venv, a multi-turn spec, a spec whose env raises) and
how to run a command in an adapter's venv. Used by tests/test_adapters_conformance.py (the battery every adapter
passes) and each adapter's own tests. An adapter plugs into the battery by adding its Case to CASES."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Case:
    id: str
    python_var: str  # env var naming the adapter venv's python
    spec: str  # a multi-turn env of the framework
    broken_spec: str  # an env of the framework that raises during the episode
    dotted: tuple[str, ...] = ()
    pythonpath: tuple[Path, ...] = ()
    extra_env: dict[str, str] = field(default_factory=dict)
    in_test_venv: bool = False  # atropos runs in the test venv; the framework's servers run with python_var's


OPENENV_CASE = Case(
    id="openenv",
    python_var="ATROPOS_OPENENV_PYTHON",
    spec="openenv:guess_env",
    broken_spec="openenv:guess_env.server.broken_app:app",
    dotted=("--env.max_turns", "3", "--env.max_token_length", "8"),  # one session at a time: same batches
    in_test_venv=True,
)

CASES = [
    Case(
        id="gym",
        python_var="ATROPOS_GYM_PYTHON",
        spec="gym:gym_text_games:TextGames/GuessNumber-v0",
        broken_spec="gym:gym_broken_env:Broken/RaiseOnStep-v0",
        dotted=("--env.max_turns", "4", "--env.max_token_length", "8"),
        pythonpath=(ROOT / "examples", ROOT / "tests" / "data"),
    ),
    OPENENV_CASE,
]


def python_of(case: Case) -> str:
    python = os.environ.get(case.python_var, "")
    if not python or not Path(python).is_file():
        if os.environ.get("CI"):
            pytest.fail(f"{case.python_var} is not set in CI: .ci/run builds the {case.id} adapter's venv")
        pytest.skip(f"set {case.python_var} to the {case.id} adapter's venv python (.ci/run builds it)")
    return python


def atropos_python(case: Case) -> str:
    """The python that runs atropos for this case: the adapter's venv, or ours when the framework runs in its
    own servers (openenv: the env servers start with python_var's python, atropos stays here)."""
    python = python_of(case)
    return sys.executable if case.in_test_venv else python


def run_env(case: Case) -> dict[str, str]:
    paths = [str(p) for p in case.pythonpath]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "ATROPOS_QUIET": "1", **case.extra_env}
