"""benchmarks/bench_trainer.py --isolate: each row in fresh processes, the median run reported with the range (a
process's first trainer row runs slower than its later rows on an H100, so rows that share a process are not
compared). Run for real on the CPU with the tiny config."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_trainer.py"


def test_isolated_rows_report_the_median_of_fresh_processes(tmp_path):
    out = tmp_path / "table.md"
    args = ["--tiny", "--device", "cpu", "--steps", "1", "--warmup", "1", "--lengths", "mixed", "--no-grad-check"]
    args += ["--ours-mixed", "a:0:a:auto:a", "--ours-equal", "", "--atropos", "", "--isolate", "--repeat", "3"]
    done = subprocess.run([sys.executable, str(BENCH), *args, "--out", str(out)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    table = out.read_text()
    assert "each row in fresh processes (--isolate, 3 a row)" in table
    (row,) = [line for line in table.splitlines() if line.startswith("| ours | mixed |")]
    spread = re.search(r"\(([\d,]+)-([\d,]+); mean ([\d,]+)\)", row)
    assert spread is not None, row
    low, high, _mean = (float(x.replace(",", "")) for x in spread.groups())
    reported = float(row.split("|")[4].replace(",", ""))
    assert "median of 3 fresh processes" in row and low <= reported <= high
