"""Scoring a code completion: pull the Python out of the reply, run it with its tests in the sandbox.

The harness runs in the sandboxed child: it reads a nonce from stdin (so the solution cannot print a fake
result line without it), executes the solution, then each test (an `assert ...` statement) in the
solution's namespace, and prints one JSON line `<nonce> {"passed": [...], "error": ...}`.
"""

from __future__ import annotations

import json
import re
import secrets
from typing import Any

from atropos_cli.env.sandbox import SandboxLimits, SandboxResult, run_python, run_python_async

__all__ = ["extract_code", "build_run", "parse_outcome", "check_solution", "check_solution_async"]

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

HARNESS = """\
import json, sys
_nonce = sys.stdin.readline().strip()
_out = sys.stdout
_tests = json.load(open("tests.json"))
_ns = {"__name__": "solution"}
_passed, _error = [], None
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), _ns)
except BaseException as exc:
    _error = f"solution failed to load: {type(exc).__name__}: {exc}"
if _error is None:
    for _test in _tests:
        try:
            exec(compile(_test, "test", "exec"), _ns)
            _passed.append(True)
        except BaseException:
            _passed.append(False)
_out.write("\\n" + _nonce + " " + json.dumps({"passed": _passed, "error": _error}) + "\\n")
_out.flush()
"""


def extract_code(completion: str) -> str:
    """The last ```python fenced block, else the whole completion (a bare function)."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


def build_run(completion: str, tests: list[str], setup: str = "") -> tuple[dict[str, str], str]:
    nonce = secrets.token_hex(8)
    code = (setup + "\n" if setup else "") + extract_code(completion)
    return {"solution.py": code, "tests.json": json.dumps(tests)}, nonce


def parse_outcome(result: SandboxResult, nonce: str, num_tests: int) -> dict[str, Any]:
    """{"passed": n, "total": n, "failure": None | "timeout" | "memory" | "error: ..."}."""
    if result.failure in ("timeout", "memory") or (result.failure or "").startswith("signal"):
        return {"passed": 0, "total": num_tests, "failure": result.failure}
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce + " "):
            data = json.loads(line[len(nonce) + 1 :])
            if data["error"]:
                return {"passed": 0, "total": num_tests, "failure": "error: " + data["error"]}
            return {"passed": sum(data["passed"]), "total": num_tests, "failure": None}
    return {"passed": 0, "total": num_tests, "failure": "error: no result (" + result.stderr[-200:] + ")"}


def check_solution(completion: str, tests: list[str], limits: SandboxLimits, setup: str = "") -> dict[str, Any]:
    files, nonce = build_run(completion, tests, setup)
    return parse_outcome(run_python(HARNESS, limits, stdin=nonce + "\n", files=files), nonce, len(tests))


async def check_solution_async(
    completion: str, tests: list[str], limits: SandboxLimits, setup: str = ""
) -> dict[str, Any]:
    files, nonce = build_run(completion, tests, setup)
    result = await run_python_async(HARNESS, limits, stdin=nonce + "\n", files=files)
    return parse_outcome(result, nonce, len(tests))
