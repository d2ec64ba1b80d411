"""The suite holds no timed assertion (issue 40): no `assert` on an elapsed time, measured with a clock in the test.
Speed belongs to benchmarks/ (`benchmarks/check_budgets.py`); tests wait on events or poll observable state with a
deadline (`assert time.monotonic() < deadline` is that deadline, not a measurement, and stays allowed)."""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parent
CLOCKS = {"monotonic", "perf_counter", "time", "monotonic_ns", "perf_counter_ns", "time_ns", "process_time"}


def _is_clock(node: ast.AST) -> bool:
    """`time.monotonic()` and the like (also as a bare `perf_counter()` imported from time)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr in CLOCKS and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id in CLOCKS - {"time"}


def _elapsed(node: ast.AST, names: set[str]) -> bool:
    """Whether `node` holds a clock difference: `clock() - x`, `x - clock()`, or a name assigned one."""
    for sub in ast.walk(node):
        is_sub = isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.Sub)
        if is_sub and any(_is_clock(part) for side in (sub.left, sub.right) for part in ast.walk(side)):
            return True
        if isinstance(sub, ast.Name) and sub.id in names:
            return True
    return False


def timed_asserts(source: str, filename: str) -> list[str]:
    tree = ast.parse(source, filename)
    names = {  # variables that hold an elapsed time: `took = time.monotonic() - start`
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _elapsed(node.value, set())
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    return [
        f"{filename}:{node.lineno}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Assert) and _elapsed(node.test, names)
    ]


def test_no_test_asserts_on_an_elapsed_time():
    files = sorted(TESTS.rglob("*.py"))
    assert len(files) > 50
    found = [hit for path in files for hit in timed_asserts(path.read_text(), str(path.relative_to(TESTS)))]
    assert found == [], "timed assertions (move the speed check to benchmarks/, or wait on an event):\n" + "\n".join(
        found
    )


def test_the_check_finds_elapsed_times_and_lets_deadlines_pass():
    timed = """
import time
from time import perf_counter
start = time.monotonic()
assert time.monotonic() - start < 5
took = perf_counter() - start
assert took >= 0.4 and ok
"""
    assert timed_asserts(timed, "t.py") == ["t.py:5", "t.py:7"]
    deadline = """
import time
deadline = time.monotonic() + 10
while not ready():
    assert time.monotonic() < deadline, "never ready"
"""
    assert timed_asserts(deadline, "t.py") == []
