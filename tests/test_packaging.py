"""The built wheel carries envs, templates, trainer (one import name each) and the shipped model, and works in a
fresh venv; pyproject lists every package folder and every bundled env.

The fresh venv installs offline (`pip install --no-index`): the wheel's dependencies come from the wheelhouse
.ci/run fills ($ATROPOS_WHEELHOUSE: `pip download --only-binary :all: -c constraints.txt -d DIR` of
pyproject's dependencies). Without it the test skips here and fails where the venvs are required."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib

from differential import missing

ROOT = Path(__file__).resolve().parents[1]
WHEELHOUSE = Path(os.environ.get("ATROPOS_WHEELHOUSE", "/tmp/atropos-wheelhouse"))


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
        "atropos_cli/envs/arithmetic.py",
        "atropos_cli/envs/_data/code_problems.jsonl",
        "atropos_cli/templates/viewer.html.j2",
        "atropos_cli/templates/init_env/env.py.j2",
        "atropos_cli/trainer/__init__.py",
        "atropos_cli/cli/app.py",
    ):
        assert required in names, required
    assert not any(name.startswith(("envs/", "trainer/", "templates/")) for name in names), "one import name each"
    model_files = ROOT / "src" / "atropos_cli" / "models"
    for path in model_files.rglob("*"):
        if path.is_file():
            assert f"atropos_cli/models/{path.relative_to(model_files)}" in names


def _package_folders() -> set[str]:
    """Every folder of the repo that holds Python code or shipped data, under the import name it installs as."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {name: ROOT / folder for name, folder in config["package-dir"].items() if name}
    roots["atropos_cli"] = ROOT / "src" / "atropos_cli"
    found = set()
    for name, folder in roots.items():
        for init in folder.rglob("*"):
            if init.is_dir() and "__pycache__" not in init.parts and any(init.glob("*.py")) or init == folder:
                rel = init.relative_to(folder).parts
                found.add(".".join((name, *rel)))
    return found


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert _package_folders() <= listed, sorted(_package_folders() - listed)


def test_every_bundled_env_is_an_entry_point():
    from atropos_cli.env.base import BaseEnv

    entry_points = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["atropos.envs"]
    import importlib
    import inspect

    defined = set()
    for module_file in (ROOT / "envs").glob("*.py"):
        if module_file.stem.startswith("_"):
            continue
        module = importlib.import_module(f"atropos_cli.envs.{module_file.stem}")
        for obj in vars(module).values():
            if inspect.isclass(obj) and issubclass(obj, BaseEnv) and obj.__module__ == module.__name__:
                defined.add(f"{module.__name__}:{obj.__name__}")
    assert defined == set(entry_points.values())


def test_wheel_in_a_fresh_venv_runs_process_against_a_local_server(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python, atropos = venv / "bin" / "python", venv / "bin" / "atropos"
    if not WHEELHOUSE.is_dir() or not any(WHEELHOUSE.glob("*.whl")):
        missing(
            f"no wheelhouse of atropos' requirements at {WHEELHOUSE}: `pip download --only-binary :all: -c "
            f"constraints.txt -d {WHEELHOUSE} <pyproject's dependencies>` (.ci/run does), or set ATROPOS_WHEELHOUSE"
        )
    offline = ["--no-index", "--find-links", str(WHEELHOUSE)]
    install = subprocess.run(
        [python, "-m", "pip", "install", "-q", *offline, str(wheel)], capture_output=True, text=True, timeout=600
    )
    assert install.returncode == 0, install.stderr[-2000:]
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
