"""The data files an env file reads by a relative path, found without running it (`atropos port`'s static check).

An AST scan of path expressions made of string literals:

- a path built from `__file__` (`Path(__file__).parent / "x.json"`, `os.path.join(os.path.dirname(__file__),
  "data", "x.csv")`, directly or through a name assigned one, such as `DATA = Path(__file__).parent / "data"`)
  is followed to where it points, relative to the file; it counts when its name ends like a data file
  (`.json`, `.csv`, ...) or when it is passed to a call that reads (`open(...)`, `pd.read_csv(...)`, ...);
- a relative literal passed to a call that reads (`open("prompt.txt")`, `json.load(open("x.json"))`,
  `pd.read_csv("data/x.csv")`, `np.load(...)`, `load_dataset(..., data_files="x.jsonl")`, not `open(..., "w")`)
  is read relative to the working directory the env runs from.

Each is checked relative to the env file's folder, where an sdist or a checkout puts what the env ships with.
Paths made at run time (f-strings, config values) are not followed.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

__all__ = ["DataFile", "scan_data_files"]

# the last name of a call that reads the file its first argument (or `data_files=`, `path=`) names
READERS = frozenset(
    {
        "open", "load", "safe_load", "full_load", "loadtxt", "genfromtxt", "fromfile", "read_csv", "read_json",
        "read_parquet", "read_excel", "read_table", "read_pickle", "read_feather", "load_from_disk", "from_csv",
        "from_json", "from_parquet", "imread", "load_workbook", "load_dataset", "load_dotenv",
    }
)  # fmt: skip
# what a data file's name ends with
DATA_SUFFIXES = frozenset(
    {
        ".json", ".jsonl", ".csv", ".tsv", ".txt", ".yaml", ".yml", ".parquet", ".pkl", ".pickle", ".npy",
        ".npz", ".pt", ".pth", ".xlsx", ".xml", ".db", ".sqlite", ".png", ".jpg", ".jpeg", ".wav", ".arrow",
        ".feather", ".toml", ".zip", ".gz", ".env",
    }
)  # fmt: skip
WRITE_MODES = ("w", "a", "x")
WRITERS = frozenset({"to_csv", "to_json", "to_parquet", "to_pickle", "write_text", "write_bytes", "savez", "save"})
ANCESTORS = 6  # how far up a working-directory path is looked for
# calls and methods that keep a path as it is (`Path(p)`, `p.resolve()`, `os.path.abspath(p)`, `str(p)`)
SAME_PATH = frozenset({"Path", "PurePath", "abspath", "realpath", "resolve", "absolute", "str", "fspath", "normpath"})
THE_FILE = "\0file"  # the first part of a path that starts at the env file itself


@dataclass(frozen=True)
class DataFile:
    line: int
    path: str  # relative to the env file's folder when `beside_file`, else as written
    beside_file: bool  # built from __file__: read relative to the env file, wherever it runs from
    exists: bool  # present relative to the env file's folder
    run_from: str | None = None  # a working-directory path missing beside the file: the folder above it that has it

    @property
    def anchor(self) -> str:
        return "relative to the file" if self.beside_file else "relative to the working directory"


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


def _in_scope(scope: ast.AST) -> list[ast.AST]:
    """The nodes of a module or function, without those of the functions nested in it."""
    nodes, todo = [], list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        nodes.append(node)
        if not isinstance(node, FUNCTIONS):
            todo.extend(ast.iter_child_nodes(node))
    return nodes


def _assignments(nodes: list[ast.AST], attributes: bool) -> dict[str, ast.expr | None]:
    """Names (with `attributes`, `self.x` ones only) assigned in `nodes`: their value when assigned once, else
    None (no static value)."""
    values: dict[str, list[ast.expr]] = {}
    for node in nodes:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        else:
            continue
        if isinstance(target, ast.Attribute if attributes else ast.Name):
            values.setdefault(ast.unparse(target), []).append(value)
    return {name: exprs[0] if len(exprs) == 1 else None for name, exprs in values.items()}


def _scopes(tree: ast.Module) -> list[tuple[list[ast.AST], dict[str, ast.expr | None]]]:
    """Each scope's nodes with the names they see: the module's names and attributes assigned anywhere in the
    file, under the function's own names."""
    module = _in_scope(tree)
    seen = {**_assignments(module, False), **_assignments(list(ast.walk(tree)), True)}
    functions = [n for n in ast.walk(tree) if isinstance(n, FUNCTIONS)]
    return [(module, seen)] + [(nodes, {**seen, **_assignments(nodes, False)}) for nodes in map(_in_scope, functions)]


class _Resolver:
    """Static values of path expressions: a tuple of parts (`THE_FILE` first when built from `__file__`)."""

    def __init__(self, names: dict[str, ast.expr | None], file_name: str) -> None:
        self.names = names
        self.file_name = file_name
        self.active: set[str] = set()

    def parts(self, node: ast.AST) -> tuple[str, ...] | None:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return tuple(p for p in PurePosixPath(node.value).parts) if node.value else ()
        if isinstance(node, ast.Name | ast.Attribute) and ast.unparse(node) == "__file__":
            return (THE_FILE, self.file_name)
        if isinstance(node, ast.Attribute) and node.attr == "parent":
            return self._parent(self.parts(node.value))
        if isinstance(node, ast.Name | ast.Attribute):
            return self._named(ast.unparse(node))
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            return self._join([node.left, node.right])
        if isinstance(node, ast.Call):
            return self._call(node)
        return None

    def _named(self, name: str) -> tuple[str, ...] | None:
        value = self.names.get(name)
        if value is None or name in self.active:
            return None
        self.active.add(name)
        try:
            return self.parts(value)
        finally:
            self.active.discard(name)

    def _call(self, node: ast.Call) -> tuple[str, ...] | None:
        name = _call_name(node)
        on = node.func.value if isinstance(node.func, ast.Attribute) else None
        if name in SAME_PATH:
            if node.args and len(node.args) == 1:
                return self.parts(node.args[0])
            return self.parts(on) if on is not None and not node.args else None
        if name == "dirname" and len(node.args) == 1:
            return self._parent(self.parts(node.args[0]))
        if name == "join" and node.args and isinstance(on, ast.Attribute | ast.Name) and "path" in ast.unparse(on):
            return self._join(node.args)
        if name == "joinpath" and on is not None:
            return self._join([on, *node.args])
        return None

    def _join(self, nodes: Sequence[ast.AST]) -> tuple[str, ...] | None:
        joined: tuple[str, ...] = ()
        for i, node in enumerate(nodes):
            parts = self.parts(node)
            if parts is None or (i and parts[:1] == (THE_FILE,)):
                return None
            joined += parts
        return joined

    @staticmethod
    def _parent(parts: tuple[str, ...] | None) -> tuple[str, ...] | None:
        if parts is None or not parts:
            return None
        return parts[:-1] if parts[-1] not in ("..", THE_FILE) else (*parts, "..")


def _normal(parts: tuple[str, ...]) -> str:
    """`(THE_FILE, "..", "data", "x.json")` -> `data/x.json` (relative to the file's folder)."""
    out: list[str] = []
    for part in parts[1:] if parts[:1] == (THE_FILE,) else parts:
        if part in (".", ""):
            continue
        if part == ".." and out and out[-1] != "..":
            out.pop()
        else:
            out.append(part)
    return str(PurePosixPath(*out)) if out else "."


def _is_write(node: ast.Call) -> bool:
    if _call_name(node) != "open":
        return False
    mode = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mode"), None)
    return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and any(m in mode.value for m in WRITE_MODES)


def _written(node: ast.Call) -> ast.expr | None:
    """The path a call writes to (`open(p, "w")`, `df.to_csv(p)`, `p.write_text(...)`), if it is one."""
    if _is_write(node):
        return node.args[0] if node.args else None
    name = _call_name(node)
    if name in ("write_text", "write_bytes") and isinstance(node.func, ast.Attribute):
        return node.func.value
    return node.args[0] if name in WRITERS and node.args else None


def _read_arguments(node: ast.Call) -> list[ast.expr]:
    if _call_name(node) not in READERS or _is_write(node):
        return []
    if _call_name(node) == "load_dataset":
        return [k.value for k in node.keywords if k.arg == "data_files"]
    return [*node.args[:1], *(k.value for k in node.keywords if k.arg in ("file", "path", "dotenv_path"))]


def _is_relative_file(text: str) -> bool:
    if not text or "\n" in text or "://" in text or text.startswith(("/", "~")):
        return False
    return not any(c in text for c in "{}%* ") and PurePosixPath(text).suffix.lower() in DATA_SUFFIXES


def scan_data_files(path: Path, source: str | None = None) -> list[DataFile]:
    """The data files `path` reads by a relative path made of literals, each once, at its first line."""
    path = Path(path)
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"), str(path))
    found: dict[str, DataFile] = {}
    written: set[str] = set()

    def add(line: int, text: str, beside: bool) -> None:
        if text not in found or line < found[text].line:
            found[text] = DataFile(line, text, beside, (path.parent / text).exists())

    for nodes, names in _scopes(tree):
        resolver = _Resolver(names, path.name)
        for node in nodes:
            if not isinstance(node, ast.Call | ast.BinOp):
                continue
            target = _written(node) if isinstance(node, ast.Call) else None
            if target is not None and (parts := resolver.parts(target)):
                written.add(_normal(parts))
            read = _read_arguments(node) if isinstance(node, ast.Call) else []
            candidates: list[tuple[ast.expr, bool]] = [(expr, True) for expr in read]
            if not read:
                candidates.append((node, False))  # a path built from __file__ anywhere (a default, a constant)
            for expr, is_read in candidates:
                parts = resolver.parts(expr)
                if not parts:
                    continue
                text = _normal(parts)
                if parts[0] == THE_FILE:
                    named_like_data = PurePosixPath(text).suffix.lower() in DATA_SUFFIXES
                    if text not in (".", "..") and (is_read or named_like_data):
                        add(node.lineno, text, True)
                elif is_read and _is_relative_file(text):
                    add(node.lineno, text, False)
    kept = [_run_from(f, path.parent) for f in found.values() if f.path not in written]
    return sorted(kept, key=lambda f: (f.line, f.path))


def _run_from(found: DataFile, folder: Path) -> DataFile:
    """A working-directory path missing beside the file, found from a folder above it (the repo root the env
    expects to run from, `environments/...` paths): that folder, relative to the file's."""
    if found.exists or found.beside_file:
        return found
    for up in range(1, ANCESTORS + 1):
        base = folder.joinpath(*[".."] * up)
        if (base / found.path).exists():
            return replace(found, run_from="/".join([".."] * up))
    return found
