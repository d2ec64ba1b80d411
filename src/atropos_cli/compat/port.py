"""`atropos port FILE`'s library half: what an Atropos env file uses that this compatibility layer lacks.

`scan_env_file(path)` reads the file (AST, without running it): its `atroposlib` imports, each name checked
against `atropos_cli.compat.atroposlib`; what needs the Hugging Face hub (datasets, tokenizers), which an
offline machine does not have; the data files it reads by a relative path and whether each is there
(`compat.datafiles`); and the env class its `__main__` block runs (`env.main_block`), the one `atropos` runs
when the file defines several.
"""

from __future__ import annotations

import ast
import importlib
from dataclasses import dataclass, field
from pathlib import Path

from atropos_cli.compat.datafiles import DataFile, scan_data_files
from atropos_cli.env.main_block import main_block_class

__all__ = ["PortFinding", "PortReport", "scan_env_file"]

TARGET = "atropos_cli.compat.atroposlib"
# (substring of the source, what we do instead)
NOTES = (
    ("load_dataset(", "datasets from the Hugging Face hub need the hub (or its cache): offline, load local files"),
    ("from_pretrained(", "tokenizers/models from the hub need the hub (or its cache): offline, pass a local dir"),
)


@dataclass
class PortFinding:
    line: int
    message: str


@dataclass
class PortReport:
    path: Path
    imported: list[str] = field(default_factory=list)
    missing: list[PortFinding] = field(default_factory=list)
    notes: list[PortFinding] = field(default_factory=list)
    data_files: list[DataFile] = field(default_factory=list)
    main_class: str | None = None  # the X of `X.cli()` in its `if __name__ == "__main__":` block
    classes: list[str] = field(default_factory=list)  # the classes it defines at module level


def _check_import(node: ast.ImportFrom | ast.Import, report: PortReport) -> None:
    modules = [(node.module or "", [a.name for a in node.names])] if isinstance(node, ast.ImportFrom) else []
    if isinstance(node, ast.Import):
        modules = [(alias.name, []) for alias in node.names]
    for module, names in modules:
        if module != "atroposlib" and not module.startswith("atroposlib."):
            continue
        report.imported.append(module)
        try:
            loaded = importlib.import_module(TARGET + module[len("atroposlib") :])
        except ImportError:
            report.missing.append(PortFinding(node.lineno, f"module {module} is not provided"))
            continue
        for name in names:
            if name != "*" and not hasattr(loaded, name):
                report.missing.append(PortFinding(node.lineno, f"{module} has no {name!r}"))


def scan_env_file(path: Path) -> PortReport:
    source = Path(path).read_text(encoding="utf-8")
    report = PortReport(Path(path), main_class=main_block_class(source))
    report.data_files = scan_data_files(Path(path), source)
    tree = ast.parse(source, str(path))
    report.classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            _check_import(node, report)
    for number, text in enumerate(source.splitlines(), start=1):
        for needle, message in NOTES:
            if needle in text:
                report.notes.append(PortFinding(number, message))
    return report
