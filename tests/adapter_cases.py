"""The adapters' test cases (one `Case` per framework: its venv, a multi-turn spec, a spec whose env raises) and
how to run a command in an adapter's venv. Used by tests/test_adapters_conformance.py (the battery every adapter
passes) and each adapter's own tests. An adapter plugs into the battery by adding its Case to CASES."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from differential import venv_python

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
    multi_turn: bool = True  # False: the adapter plays one turn per rollout (the battery checks that turn)
    in_test_venv: bool = False  # atropos runs in the test venv; the framework's servers run with python_var's


OPENENV_CASE = Case(
    id="openenv",
    python_var="ATROPOS_OPENENV_PYTHON",
    spec="openenv:guess_env",
    broken_spec="openenv:guess_env.server.broken_app:app",
    dotted=("--env.max_turns", "3", "--env.max_token_length", "8"),  # one session at a time: same batches
    in_test_venv=True,
)

ORS_CASE = Case(
    id="ors",
    python_var="ATROPOS_ORS_PYTHON",
    spec="ors:guess_ors",
    broken_spec="ors:guess_ors:BrokenEnv",
    dotted=("--env.max_turns", "3", "--env.max_token_length", "8", "--env.max_sessions", "1"),  # same batches
    pythonpath=(ROOT / "tests" / "ors_envs",),
    in_test_venv=True,
)

NEMOGYM_CASE = Case(
    id="nemogym",
    python_var="ATROPOS_NEMOGYM_PYTHON",
    spec=f"nemogym:{ROOT / 'tests' / 'nemogym_envs' / 'sum_tool'}",
    broken_spec=f"nemogym:{ROOT / 'tests' / 'nemogym_envs' / 'broken_verify'}",
    dotted=("--env.max_token_length", "8"),
    multi_turn=False,  # the shipped model never calls a tool: one reply per rollout (test_nemogym.py: more turns)
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
    Case(
        id="vf",
        python_var="ATROPOS_VF_PYTHON",
        spec="vf:vf_reverse_text",
        broken_spec="vf:vf_broken",
        dotted=("--env.max_token_length", "8"),
        pythonpath=(ROOT / "examples" / "verifiers", ROOT / "tests" / "data"),
        multi_turn=False,
    ),
    OPENENV_CASE,
    ORS_CASE,
    NEMOGYM_CASE,
]


def python_of(case: Case) -> str:
    return venv_python(case.python_var, f"the {case.id} adapter")


def atropos_python(case: Case) -> str:
    """The python that runs atropos for this case: the adapter's venv, or ours when the framework runs in its
    own servers (openenv: the env servers start with python_var's python, atropos stays here)."""
    python = python_of(case)
    return sys.executable if case.in_test_venv else python


def run_env(case: Case) -> dict[str, str]:
    paths = [str(p) for p in case.pythonpath]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "ATROPOS_QUIET": "1", **case.extra_env}


def run_commands(case: Case, commands: dict[str, list[str]]) -> dict[str, subprocess.CompletedProcess]:
    """`atropos ARGS...` for each named command, with the adapter venv's python, four at a time."""
    python = python_of(case)

    def run(args: list[str]) -> subprocess.CompletedProcess:
        cmd = [python, "-m", "atropos_cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=run_env(case), timeout=600)

    with ThreadPoolExecutor(4) as pool:
        return dict(zip(commands, pool.map(run, commands.values()), strict=True))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def assert_refused_before_the_model_loads(result: subprocess.CompletedProcess, out: Path, message: str, hint: str):
    """A bad spec or option: exit 2, one error line and its hint, no traceback, no model loaded, nothing written."""
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and hint in result.stderr
    assert "Traceback" not in result.stderr and "local backend" not in result.stdout + result.stderr
    assert not (out / "groups.jsonl").exists()


def commands_fixture(case_id: str, commands: Callable[[Path], dict[str, list[str]]]) -> Any:
    """A module fixture running an adapter's named commands once (in parallel): (tmp dir, {name: result})."""

    @pytest.fixture(scope="module")
    def ran(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
        case = next(c for c in CASES if c.id == case_id)
        python_of(case)
        tmp = tmp_path_factory.mktemp(case_id)
        return tmp, run_commands(case, commands(tmp))

    return ran


def groups(path: Path) -> list[dict]:
    return read_jsonl(path / "groups.jsonl")
