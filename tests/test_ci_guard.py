"""CI cannot go green by accident: .ci/run fails when a differential venv cannot be built, arms the tests' guard
(ATROPOS_REQUIRE_VENVS=1: a missing venv fails its tests instead of skipping them), builds every venv the tests
ask for, and ends with exactly the documented test command."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import differential

ROOT = Path(__file__).resolve().parents[1]
CI_RUN = ROOT / ".ci" / "run"
README_BLOCK = ['pip install -c constraints.txt -e ".[dev]"', "mypy", "pytest"]


def commands() -> list[str]:
    """.ci/run's lines that run something (no comments, no blank lines)."""
    return [line for line in CI_RUN.read_text().splitlines() if line.strip() and not line.lstrip().startswith("#")]


def functions(*names: str) -> str:
    """The bash source of .ci/run's functions NAMES (each from `NAME() {` to its closing `}`)."""
    text = CI_RUN.read_text()
    found = [re.search(rf"^{name}\(\) \{{.*?^\}}$", text, re.S | re.M) for name in names]
    assert all(found), f".ci/run lost one of {names}"
    return "\n".join(m.group(0) for m in found if m)


def run_guard(script: str, tmp_path: Path) -> subprocess.CompletedProcess:
    code = f"set -euo pipefail\n{functions('start_venv', 'require_venvs')}\n{script}"
    return subprocess.run(["bash", "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=60)


def test_ci_run_ends_with_exactly_the_documented_test_command():
    assert commands()[-3:] == README_BLOCK
    assert "set -euo pipefail" in commands()  # a failing mypy, or pytest collecting nothing (exit 5), fails CI


def test_ci_run_arms_the_guard_and_waits_for_every_venv_before_the_tests():
    lines = commands()
    first_test_line = len(lines) - 3
    assert "export ATROPOS_REQUIRE_VENVS=1" in lines[:first_test_line]
    assert "require_venvs" in [line.strip() for line in lines[:first_test_line]]


def test_a_venv_that_fails_to_build_stops_ci_before_the_tests(tmp_path):
    good = f'start_venv GOOD_PYTHON {sys.executable} good.log true\nrequire_venvs\necho "$GOOD_PYTHON"'
    good = run_guard(good, tmp_path)
    assert good.returncode == 0 and good.stdout.strip() == sys.executable, good.stderr
    broken = f"start_venv GOOD_PYTHON {sys.executable} good.log true\n"
    broken += "start_venv BROKEN_PYTHON /nonexistent/bin/python broken.log bash -c 'echo no such package; exit 1'\n"
    broken += "require_venvs\necho the tests ran"
    done = run_guard(broken, tmp_path)
    assert done.returncode == 1 and "the tests ran" not in done.stdout
    assert "could not build the venv of BROKEN_PYTHON" in done.stderr and "no such package" in done.stderr
    assert "GOOD_PYTHON" not in done.stderr
    # a build that "succeeds" without leaving a python behind is as broken
    hollow = run_guard("start_venv HOLLOW_PYTHON /nonexistent/bin/python h.log true\nrequire_venvs\necho ran", tmp_path)
    assert hollow.returncode == 1 and "ran" not in hollow.stdout


def test_every_venv_the_tests_ask_for_is_built_by_ci_run():
    """A test naming a venv variable CI does not build would fail in CI: catch it here, with the variable named."""
    asked = set()
    for path in (ROOT / "tests").glob("*.py"):
        if path.name == Path(__file__).name:  # its own made-up variable
            continue
        text = path.read_text()
        asked |= set(re.findall(r'venv_python\(\s*"([A-Z_]+)"', text))
        asked |= set(re.findall(r'python_var="([A-Z_]+)"', text))
    assert {"ATROPOSLIB_PYTHON", "ATROPOS_GYM_PYTHON", "ATROPOS_VF_PYTHON", "ATROPOS_OPENENV_PYTHON"} <= asked
    built = set(re.findall(r"^\s*\"\w+ ([A-Z_]+) ", CI_RUN.read_text(), re.M))  # ADAPTER_VENVS lines
    built |= set(re.findall(r"^start_venv ([A-Z_]+) ", CI_RUN.read_text(), re.M))
    assert asked <= built, f"tests ask for {sorted(asked - built)}, which .ci/run does not build"


@pytest.mark.parametrize(
    ("env", "outcome"),
    [
        ({}, pytest.skip.Exception),
        ({"ATROPOS_REQUIRE_VENVS": "1"}, pytest.fail.Exception),
        ({"CI": "true"}, pytest.fail.Exception),
        ({"CI": "false"}, pytest.skip.Exception),
    ],
)
def test_a_missing_venv_skips_locally_and_fails_where_required(monkeypatch, env, outcome):
    for var in ("ATROPOS_REQUIRE_VENVS", "CI", "ATROPOS_NOWHERE_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    with pytest.raises((pytest.skip.Exception, pytest.fail.Exception)) as raised:  # either: a skip must not skip this
        differential.venv_python("ATROPOS_NOWHERE_PYTHON", "nowhere")
    assert type(raised.value) is outcome
    assert "set ATROPOS_NOWHERE_PYTHON to nowhere's venv python" in str(raised.value)
    monkeypatch.setenv("ATROPOS_NOWHERE_PYTHON", sys.executable)
    assert differential.venv_python("ATROPOS_NOWHERE_PYTHON", "nowhere") == sys.executable
