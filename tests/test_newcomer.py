"""A newcomer's first minutes: the README's first command block, typed as it is into bash in a clean clone of HEAD
(a fresh venv, the project's own install line), writes the files the README lists and ends with the summary line
it shows. The commands, the files and the line are all read from the README, so this cannot drift from it.

It needs `git`, `python3` with venv, and pip's usual sources (the local pip cache serves a warm machine; CI
downloads the wheels once). About 70 s on 2 cores with a warm pip cache, most of it pip installing torch and
transformers: cheap enough for the default run.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def quick_start(readme: str) -> tuple[str, Path, list[str], re.Pattern[str]]:
    """(the first bash block, the run directory, the files promised in it, the summary line as a pattern)."""
    match = re.search(r"```bash\n(.*?)```(.*?)```text\n(.*?)\n```", readme, flags=re.S)
    assert match is not None, "the README's quick start: a bash block, then the files it writes, then its summary"
    block, prose, summary = match.groups()
    writes = re.search(r"writes `([^`]+)/`:(.*?)\(", prose, flags=re.S)
    assert writes is not None, "the README says which directory and files the first block writes"
    files = re.findall(r"`([^`/]+)`", writes.group(2))
    assert len(files) >= 3, files
    # the time varies ("in 1.2s"); every other character of the line is promised
    timed = re.search(r"in [\d.]+s$", summary.strip())
    assert timed is not None, f"the summary line ends with its time: {summary!r}"
    pattern = re.escape(summary.strip()).replace(re.escape(timed.group(0)), r"in [\d.]+s")
    return block, Path(writes.group(1)), files, re.compile(pattern)


def test_the_readme_quick_start_parses():
    block, run_dir, files, summary = quick_start((ROOT / "README.md").read_text())
    assert "pip install" in block and "atropos" in block
    assert str(run_dir) == "runs/arithmetic" and "groups.jsonl" in files
    line = "wrote 64 groups (512 rollouts, mean score 0.406; 0 rollouts failed) to runs/arithmetic in 9.9s"
    assert summary.fullmatch(line) and not summary.fullmatch(line.replace("0.406", "0.407"))


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git to clone the repository")
def test_the_readme_first_block_works_in_a_clean_clone(tmp_path):
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing to clone")
    clone = tmp_path / "atropos"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(clone)], check=True, timeout=300)
    block, run_dir, files, summary = quick_start((clone / "README.md").read_text())

    # a newcomer's shell: no venv of ours active, no import path of ours
    ours = {str(ROOT / ".venv" / "bin"), os.environ.get("VIRTUAL_ENV", "") + "/bin"}
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep) if p not in ours)
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    env.update(PATH=path, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_PROGRESS_BAR="off")
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", block],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    for name in files:
        assert (clone / run_dir / name).is_file(), f"the README promises {run_dir / name}: {output[-2000:]}"
    groups = int(re.search(r"wrote (\d+) groups", summary.pattern.replace("\\", "")).group(1))
    assert (clone / run_dir / "groups.jsonl").read_text().count("\n") == groups
    last_lines = [line.strip() for line in output.splitlines() if line.strip()]
    assert any(summary.fullmatch(line) for line in last_lines), f"no line matches {summary.pattern}:\n{output[-2000:]}"
