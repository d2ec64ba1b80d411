"""vf_runtime's offline check of a harness program: the PEP 723 dependencies it declares, and which of them this
interpreter does not satisfy (a missing package, a version its pin excludes)."""

from __future__ import annotations

import sys
from importlib import metadata

import pytest

from atropos_cli.adapters.vf_runtime import missing_dependencies, script_dependencies

SCRIPT = """# /// script
# requires-python = ">=3.10"
# dependencies = ["pydantic", "httpx>=0.1", "no-such-package-atropos", "typer==0.0.1", "pytest; python_version < '3'"]
# ///
print("hi")
"""


pytestmark = pytest.mark.skipif(sys.version_info < (3, 11), reason="verifiers 0.4.0 needs Python >= 3.11")


def test_the_script_block_gives_the_declared_dependencies():
    assert script_dependencies(SCRIPT) == [
        "pydantic", "httpx>=0.1", "no-such-package-atropos", "typer==0.0.1", "pytest; python_version < '3'"
    ]  # fmt: skip
    assert script_dependencies("print('no block')\n") == []


def test_missing_dependencies_name_what_is_absent_or_the_wrong_version():
    typer = metadata.version("typer")
    assert missing_dependencies(script_dependencies(SCRIPT)) == [
        "no-such-package-atropos (not installed)",
        f"typer==0.0.1 ({typer} is installed)",
    ]
