"""The import rules of docs/ARCHITECTURE.md, checked on the source (AST, lazy imports inside functions included).

Modules are named as they install: `src/atropos_cli/x.py` is `atropos_cli.x`, `envs/y.py` is `atropos_cli.envs.y`,
`trainer/z.py` is `atropos_cli.trainer.z` (setuptools package-dir in pyproject.toml).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROOTS = {
    "atropos_cli": ROOT / "src" / "atropos_cli",
    "atropos_cli.envs": ROOT / "envs",
    "atropos_cli.trainer": ROOT / "trainer",
    "atropos_cli.templates": ROOT / "templates",
}
HEAVY = ("torch", "transformers", "datasets", "vllm", "peft")
# The layers, bottom up: a package may import its own layer's modules and the layers below it, never above.
LAYERS = [
    {
        "atropos_cli.errors",
        "atropos_cli.types",
        "atropos_cli.config",
        "atropos_cli.resources",
        "atropos_cli.retry",
        "atropos_cli.templates",
        "atropos_cli.httpguard",
        "atropos_cli.httpserve",
        "atropos_cli.quiet",
        "atropos_cli.httpclient",
        "atropos_cli.attention",
        "atropos_cli.families",
        "atropos_cli.compile_cache",
        "atropos_cli.vision",
    },
    {"atropos_cli.inference"},
    {"atropos_cli.tokens", "atropos_cli.env", "atropos_cli.datagen", "atropos_cli.paths", "atropos_cli.families_vl"},
    {"atropos_cli.envs", "atropos_cli.formats", "atropos_cli.api"},
    {"atropos_cli.runs", "atropos_cli.testing"},
    {"atropos_cli.trainer", "atropos_cli.compat", "atropos_cli.adapters", "atropos_cli.tinker"},
    {"atropos_cli.cli", "atropos_cli", "atropos_cli.__main__"},
]


@dataclass(frozen=True)
class Import:
    target: str  # the module imported (ours: resolved to a module that exists; else the top-level name)
    line: int
    top_level: bool  # at module level (runs on import), not inside a function


@cache
def modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, folder in ROOTS.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("").parts
            if "__pycache__" in rel or (package == "atropos_cli" and rel[0] in ("envs", "trainer", "templates")):
                continue
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            found[".".join((package, *parts))] = path
    return found


def _resolve(name: str) -> str:
    """Our longest module prefix of a dotted name (`atropos_cli.env.base.BaseEnv` -> `atropos_cli.env.base`)."""
    while name and name not in modules():
        name = name.rpartition(".")[0]
    return name


def _absolute(module: str, path: Path, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


@cache
def imports_of(module: str) -> tuple[Import, ...]:
    path = modules()[module]
    tree = ast.parse(path.read_text(), str(path))
    guarded = (n for n in tree.body if isinstance(n, ast.If | ast.Try))  # `if TYPE_CHECKING:`, `try: import`
    top = {id(n) for n in tree.body} | {id(c) for n in guarded for c in ast.walk(n)}
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(module, path, node)
            names = [f"{base}.{a.name}" for a in node.names] or [base]
        for name in names:
            ours = _resolve(name)
            target = ours if ours else name.split(".")[0]
            if target != module:
                found.append(Import(target, node.lineno, id(node) in top))
    return tuple(found)


def _package(module: str) -> str:
    parts = module.split(".")
    return module if len(parts) == 1 else ".".join(parts[:2])


def _layer(package: str) -> int:
    for index, layer in enumerate(LAYERS):
        if package in layer:
            return index
    raise AssertionError(f"package {package} is in no layer of tests/test_architecture.py (add it to LAYERS)")


def _where(module: str, imp: Import) -> str:
    return f"{modules()[module].relative_to(ROOT)}:{imp.line} imports {imp.target}"


def _violations(rule) -> list[str]:
    return [_where(m, imp) for m in sorted(modules()) for imp in imports_of(m) if rule(m, imp)]


def test_every_package_sits_in_a_layer_and_imports_only_downwards():
    def upward(module: str, imp: Import) -> bool:
        if not imp.target.startswith("atropos_cli"):
            return False
        return _layer(_package(imp.target)) > _layer(_package(module))

    assert _violations(upward) == []


def test_the_library_never_imports_the_cli():
    def into_cli(module: str, imp: Import) -> bool:
        cli_side = _package(module) in ("atropos_cli.cli", "atropos_cli.__main__")
        return imp.target.startswith("atropos_cli.cli") and not cli_side

    assert _violations(into_cli) == []


def test_types_imports_only_the_standard_library_and_pydantic():
    allowed = set(sys.stdlib_module_names) | {"pydantic", "pydantic_core", "atropos_cli.errors", "__future__"}
    found = [imp.target for imp in imports_of("atropos_cli.types")]
    assert [t for t in found if t not in allowed] == []


def test_api_imports_neither_trainer_nor_inference_nor_runs():
    def bad(module: str, imp: Import) -> bool:
        return _package(module) == "atropos_cli.api" and _package(imp.target) in (
            "atropos_cli.trainer",
            "atropos_cli.inference",
            "atropos_cli.runs",
            "atropos_cli.env",
        )

    assert _violations(bad) == []


def test_envs_import_neither_cli_nor_api():
    def bad(module: str, imp: Import) -> bool:
        return _package(module) == "atropos_cli.envs" and _package(imp.target) in ("atropos_cli.cli", "atropos_cli.api")

    assert _violations(bad) == []


def test_heavy_libraries_are_imported_inside_functions_outside_the_trainer():
    def eager_heavy(module: str, imp: Import) -> bool:
        return imp.top_level and imp.target.split(".")[0] in HEAVY and _package(module) != "atropos_cli.trainer"

    assert _violations(eager_heavy) == []


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    """One cycle of `graph` as a path (empty when it has none): depth-first search with colours."""
    colour: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        colour[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if colour.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if not colour.get(nxt) and (found := visit(nxt)):
                return found
        colour[node] = 2
        stack.pop()
        return []

    for node in sorted(graph):
        if not colour.get(node) and (found := visit(node)):
            return found
    return []


@pytest.mark.parametrize("level", ["module", "package"])
def test_no_import_cycles(level):
    """Lazy imports count too: a cycle hidden inside a function is still a cycle in the design."""
    graph: dict[str, set[str]] = {}
    for module in modules():
        for imp in imports_of(module):
            if not imp.target.startswith("atropos_cli"):
                continue
            a, b = (module, imp.target) if level == "module" else (_package(module), _package(imp.target))
            if a != b and not (level == "module" and imp.target == _package(module)):
                graph.setdefault(a, set()).add(b)
    assert _cycle(graph) == []


def test_the_rules_see_real_imports():
    """Guards the checker itself: known edges are found, so an empty violation list means something."""
    targets = {imp.target for imp in imports_of("atropos_cli.env.base")}
    assert "atropos_cli.types" in targets and "atropos_cli.errors" in targets
    assert any(imp.target == "atropos_cli.trainer.step.grpo" for m in modules() for imp in imports_of(m))
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_imports_sit_at_the_top_of_their_module():
    """A module-level import below code (ruff's E402) is moved up, never silenced."""
    silenced = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in modules().values()
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "noqa: E402" in line
    ]
    assert not silenced, silenced
