"""Which env class a file runs as a script: the `X.cli()` its `if __name__ == "__main__":` block calls.

atroposlib runs an env file as `python FILE serve|process`, so a file that defines several env classes (a base
class and the env built on it) names the one it runs in that block. Read from the source (AST), never run:
the block itself, or a function of the file that the block calls (`main()`).
"""

from __future__ import annotations

import ast

__all__ = ["main_block_class"]


def _is_main_test(test: ast.expr) -> bool:
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, *test.comparators]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return bool(names and mains)


def _cli_calls(nodes: list[ast.stmt]) -> tuple[list[str], list[str]]:
    """The classes whose `.cli()` the statements call, and the plain functions they call."""
    classes, functions = [], []
    for node in (n for stmt in nodes for n in ast.walk(stmt)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "cli" and isinstance(func.value, ast.Name):
            classes.append(func.value.id)
        elif isinstance(func, ast.Name):
            functions.append(func.id)
    return classes, functions


def main_block_class(source: str) -> str | None:
    """The name `X` of the first `X.cli()` the file's `__main__` block runs (directly or through a top-level
    function it calls), or None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    body = [stmt for node in tree.body if isinstance(node, ast.If) and _is_main_test(node.test) for stmt in node.body]
    classes, functions = _cli_calls(body)
    if classes:
        return classes[0]
    defined = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}
    for name in functions:
        if name in defined:
            found, _ = _cli_calls(defined[name].body)
            if found:
                return found[0]
    return None
