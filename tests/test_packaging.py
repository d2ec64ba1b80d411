"""The built wheel carries envs, templates, trainer and the shipped model, and works in a fresh venv."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        text=True,
    )
    (path,) = out.glob("atropos-*.whl")
    return path


def test_wheel_carries_the_bundled_folders(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    for required in (
        "atropos_cli/_bundled/envs/arithmetic.py",
        "atropos_cli/_bundled/templates/viewer.html.j2",
        "atropos_cli/_bundled/trainer/__init__.py",
        "atropos_cli/cli/app.py",
    ):
        assert required in names, required
    model_files = ROOT / "src" / "atropos_cli" / "models"
    for path in model_files.rglob("*"):
        if path.is_file():
            assert f"atropos_cli/models/{path.relative_to(model_files)}" in names


def test_wheel_in_a_fresh_venv_runs_process_against_a_local_server(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, atropos = venv / "bin" / "python", venv / "bin" / "atropos"
    subprocess.run([python, "-m", "pip", "install", "-q", str(wheel)], check=True, capture_output=True)
    server = subprocess.Popen(
        [python, "-m", "atropos_cli.testing.fake_server", "--port", "0", "--rule", "arithmetic"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=tmp_path,
    )
    try:
        url = server.stdout.readline().strip()
        run = subprocess.run(
            [atropos, "process", "arithmetic", "--out", "run", "--num-groups", "4", "--base-url", url],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr
        assert "wrote 4 groups" in run.stdout
        assert len((tmp_path / "run" / "groups.jsonl").read_text().splitlines()) == 4
        assert "What is" in (tmp_path / "run" / "index.html").read_text()
        envs = subprocess.run([atropos, "envs"], cwd=tmp_path, capture_output=True, text=True, check=True)
        assert "arithmetic" in envs.stdout
    finally:
        server.terminate()
        server.wait(timeout=10)
