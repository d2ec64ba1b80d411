"""Benchmark `atropos --help`: median wall time of N fresh processes, this tree against a baseline commit.

    .venv/bin/python benchmarks/bench_cli_startup.py [--runs 7] [--baseline REF]

Rows: the bare interpreter, `import typer, rich.console` (the floor any Typer+rich CLI pays), `atropos --help`
from this tree, and, with `--baseline REF`, `atropos --help` from that commit's `src/` (exported with
`git archive` to a temp dir and put first on PYTHONPATH, so it runs with the same interpreter and packages).
Runs alternate between the rows, so machine load hits them alike; the load average is printed with the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HELP = "import sys; sys.argv = ['atropos', '--help']; from atropos_cli.cli.app import main; main()"


def _export(ref: str, into: Path) -> Path:
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return into / "src"


def _once(code: str, pythonpath: str | None) -> float:
    env = {**os.environ, "COLUMNS": "120"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--baseline", help="a git ref whose `atropos --help` to time in the same run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows: list[tuple[str, str, str | None]] = [
            ("python -c pass", "pass", None),
            ("import typer, rich.console", "import typer, rich.console", None),
            ("atropos --help (this tree)", HELP, str(ROOT / "src")),
        ]
        if args.baseline:
            rows.append((f"atropos --help ({args.baseline})", HELP, str(_export(args.baseline, Path(tmp)))))
        times: dict[str, list[float]] = {label: [] for label, _, _ in rows}
        for _ in range(args.runs):
            for label, code, path in rows:
                times[label].append(_once(code, path))
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs, python {sys.version.split()[0]}")
    print(f"| what | median of {args.runs} (s) | min (s) |")
    print("|---|---:|---:|")
    for label, samples in times.items():
        print(f"| {label} | {statistics.median(samples):.3f} | {min(samples):.3f} |")


if __name__ == "__main__":
    main()
