"""Scoring a code completion: pull the Python out of the reply, run it in the sandbox, judge it here.

The verdict never passes through anything the solution can touch. Each test (`assert <expr>`) is split here,
in the parent, into the parts that need the solution (every call of a function the solution or the setup
code defines, e.g. `fib(10)`) and the trusted rest (`== 55`, `set(...)`, `math.isclose(..., rel_tol=...)`).
The sandboxed child gets only the calls: it runs the solution, evaluates each call and prints its value as a
plain Python literal (ints, floats, strings, bytes, bools, None, lists, tuples, dicts, sets; anything else,
e.g. an object with its own `__eq__`, is unreadable and fails the test). The parent reads those literals with
`ast.literal_eval`, puts them in place of the calls and evaluates the test itself. The child never sees an
expected value, a nonce or a verdict, so printing a fake result, exiting early, rewriting the test list or
returning an always-equal object scores nothing.

Tests whose calls use names bound inside the test (a comprehension or lambda variable) cannot be split and
count as failed (`unsupported` in the outcome).
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import json
import math
import re
from typing import Any

from atropos_cli.env.sandbox import SandboxLimits, SandboxResult, run_python, run_python_async

__all__ = ["extract_code", "split_tests", "build_run", "judge", "check_solution", "check_solution_async"]

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)

# Names a test may use on the trusted side: pure builtins and `math` (MBPP tests use math.isclose unimported).
_UNSAFE_BUILTINS = {
    "open", "exec", "eval", "compile", "__import__", "input", "breakpoint", "exit", "quit", "help", "globals",
    "locals", "vars", "setattr", "delattr", "getattr", "memoryview", "print", "copyright", "credits", "license",
}  # fmt: skip
SAFE_NAMES = {n for n in dir(builtins) if not n.startswith("_") and n not in _UNSAFE_BUILTINS} | {"math"}
_TRUSTED_GLOBALS: dict[str, Any] = {
    "__builtins__": {n: getattr(builtins, n) for n in SAFE_NAMES if hasattr(builtins, n)},
    "math": math,
}

HARNESS = """\
import json, os, sys
_out = os.fdopen(os.dup(1), "w")  # the result channel; the solution's own prints go to stderr
os.dup2(2, 1)
sys.stdout = sys.stderr

def _lit(v, depth=0):
    t = type(v)
    if depth > 50:
        raise ValueError("nested too deep")
    if v is None or t is bool or t is int or t is str or t is bytes or t is complex:
        return repr(v)
    if t is float:
        if v != v:
            raise ValueError("nan")
        return repr(v) if v not in (float("inf"), float("-inf")) else ("1e999" if v > 0 else "-1e999")
    if t is list or t is tuple:
        inner = ", ".join(_lit(x, depth + 1) for x in v)
        return "[" + inner + "]" if t is list else "(" + inner + ("," if len(v) == 1 else "") + ")"
    if t is dict:
        return "{" + ", ".join(_lit(k, depth + 1) + ": " + _lit(x, depth + 1) for k, x in v.items()) + "}"
    if t is set or t is frozenset:
        return "{" + ", ".join(_lit(x, depth + 1) for x in v) + "}" if v else "set()"
    raise TypeError(t.__name__)

_calls = json.load(open("calls.json"))
_ns = {"__name__": "solution"}
try:
    exec(compile(open("solution.py").read(), "solution.py", "exec"), _ns)
except BaseException as exc:
    _out.write(json.dumps({"load_error": type(exc).__name__ + ": " + str(exc)[:200]}) + "\\n")
    _out.flush()
    raise SystemExit(0)
for _i, _call in enumerate(_calls):
    try:
        _row = {"i": _i, "v": _lit(eval(compile(_call, "test", "eval"), _ns))}
    except BaseException as exc:
        _row = {"i": _i, "error": type(exc).__name__}
    _out.write(json.dumps(_row) + "\\n")
    _out.flush()
"""


def extract_code(completion: str) -> str:
    """The last ```python fenced block, else the whole completion (a bare function)."""
    blocks = _FENCE.findall(completion)
    return blocks[-1] if blocks else completion


class _Splitter(ast.NodeTransformer):
    """Replace each call of an untrusted function (and each untrusted name) by a placeholder `_v<k>`."""

    def __init__(self, calls: list[str], test: ast.expr) -> None:
        self.calls = calls
        self.bound = _bound_names(test)  # comprehension and lambda variables: evaluated here, in the parent

    def _untrusted(self, node: ast.AST) -> bool:
        return any(isinstance(n, ast.Name) and n.id not in SAFE_NAMES | self.bound for n in ast.walk(node))

    def _placeholder(self, node: ast.expr) -> ast.Name:
        if any(isinstance(n, ast.Name) and n.id in self.bound for n in ast.walk(node)):
            raise ValueError("a call uses a variable bound inside the test")
        self.calls.append(ast.unparse(node))
        return ast.copy_location(ast.Name(id=f"_v{len(self.calls) - 1}", ctx=ast.Load()), node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        if self._untrusted(node.func):
            return self._placeholder(node)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return node if node.id in SAFE_NAMES | self.bound else self._placeholder(node)


def _bound_names(test: ast.expr) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.comprehension):
            names |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
        elif isinstance(node, ast.Lambda):
            names |= {a.arg for a in ast.walk(node.args) if isinstance(a, ast.arg)}
        elif isinstance(node, ast.NamedExpr):
            names.add(node.target.id)
    return names


def split_tests(tests: list[str]) -> tuple[list[str | None], list[str]]:
    """(one trusted expression per test, or None when it cannot be split; the calls the child evaluates)."""
    calls: list[str] = []
    judged: list[str | None] = []
    for test in tests:
        try:
            statement = ast.parse(test.strip()).body
            if len(statement) != 1 or not isinstance(statement[0], ast.Assert):
                raise ValueError("not a single assert statement")
            expr = _Splitter(calls, statement[0].test).visit(statement[0].test)
            judged.append(ast.unparse(expr))
        except (SyntaxError, ValueError, RecursionError):
            judged.append(None)
    return judged, calls


def build_run(completion: str, tests: list[str], setup: str = "") -> tuple[dict[str, str], list[str | None]]:
    judged, calls = split_tests(tests)
    code = (setup + "\n" if setup else "") + extract_code(completion)
    return {"solution.py": code, "calls.json": json.dumps(calls)}, judged


def _values(stdout: str, count: int) -> tuple[list[Any], str | None]:
    """The child's value per call (a `_MISSING` marker where it gave none or an unreadable one)."""
    values: list[Any] = [_MISSING] * count
    for line in stdout.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if not isinstance(row, dict):
            continue
        if "load_error" in row:
            return values, str(row["load_error"])
        index = row.get("i")
        if type(index) is int and 0 <= index < count and values[index] is _MISSING and isinstance(row.get("v"), str):
            with contextlib.suppress(ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                values[index] = ast.literal_eval(row["v"])
    return values, None


_MISSING = object()


def _passes(expr: str | None, values: list[Any]) -> bool:
    if expr is None:
        return False
    used = [int(n[2:]) for n in re.findall(r"\b_v\d+\b", expr)]
    if any(values[i] is _MISSING for i in used):
        return False
    scope = {**_TRUSTED_GLOBALS, **{f"_v{i}": values[i] for i in used}}
    try:
        return bool(eval(expr, scope))  # trusted test code (the dataset's) over plain values
    except Exception:
        return False


def judge(result: SandboxResult, judged: list[str | None], num_calls: int) -> dict[str, Any]:
    """{"passed": n, "total": n, "failure": None | "timeout" | "memory" | "signal N" | "error: ..."}."""
    total = len(judged)
    if result.failure in ("timeout", "memory") or (result.failure or "").startswith("signal"):
        return {"passed": 0, "total": total, "failure": result.failure}
    values, load_error = _values(result.stdout, num_calls)
    if load_error is not None:
        return {"passed": 0, "total": total, "failure": "error: solution failed to load: " + load_error}
    passed = sum(_passes(expr, values) for expr in judged)
    failure = "unsupported test" if None in judged and passed < total else None
    return {"passed": passed, "total": total, "failure": failure}


def check_solution(completion: str, tests: list[str], limits: SandboxLimits, setup: str = "") -> dict[str, Any]:
    files, judged = build_run(completion, tests, setup)
    num_calls = len(json.loads(files["calls.json"]))
    return judge(run_python(HARNESS, limits, files=files), judged, num_calls)


async def check_solution_async(
    completion: str, tests: list[str], limits: SandboxLimits, setup: str = ""
) -> dict[str, Any]:
    files, judged = build_run(completion, tests, setup)
    num_calls = len(json.loads(files["calls.json"]))
    return judge(await run_python_async(HARNESS, limits, files=files), judged, num_calls)
