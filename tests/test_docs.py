"""The docs site builds strictly (every link and anchor checked, the CLI reference generated from the commands'
help), and the README's links point at pages and anchors that exist."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

pytest.importorskip("mkdocs", reason="the docs toolchain comes with the dev extra (mkdocs-material)")


def test_site_builds_strictly_without_a_warning(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    assert "WARNING" not in output, output
    cli = (tmp_path / "site" / "cli" / "index.html").read_text()
    # the generated reference has every command, with an option that only the command's own help knows
    for command in ("process", "train", "sft-gen", "dpo-gen", "api", "serve", "inference", "export openenv"):
        assert f"atropos {command}" in cli, command
    assert "--groups-per-step" in cli


def test_readme_links_reach_existing_pages_and_anchors():
    text = README.read_text()
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", text)
    assert len(links) >= 10, "the README links into the docs"
    for path, anchor in links:
        page = ROOT / path
        assert page.is_file(), f"README links to {path}, which does not exist"
        if anchor:
            headings = re.findall(r"(?m)^#{1,6} (.+)$", page.read_text())
            slugs = {re.sub(r"[^\w\- ]", "", h.lower()).strip().replace(" ", "-") for h in headings}
            assert anchor in slugs, f"README links to {path}#{anchor}: no such heading"
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert images and all((ROOT / image).is_file() for image in images), images


def test_readme_test_block_is_what_ci_runs():
    """`.ci/run` ends with the README's test block, verbatim."""
    blocks = re.findall(r"```bash\n(.*?)```", README.read_text(), flags=re.S)
    test_block = next(block for block in blocks if "pytest" in block)
    ci = (ROOT / ".ci" / "run").read_text()
    assert ci.rstrip().endswith(test_block.rstrip()), test_block
