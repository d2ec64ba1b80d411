"""Every server reports a taken port the same way: `error: cannot listen on HOST:PORT: ...` and a `hint:`, exit 1,
nothing said about serving first, and no uvicorn traceback (one check: `httpserve.listen`)."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.errors import PortUnavailableError
from atropos_cli.testing.fake_server import FakeInferenceServer


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "groups.jsonl").write_text('{"scores": [1.0], "messages": [[{"role": "user", "content": "x"}]]}\n')
    return run


def _says_port_taken(output: str, port: int) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    error = next(i for i, line in enumerate(lines) if line.startswith("error:"))
    assert lines[error] == f"error: cannot listen on 127.0.0.1:{port}: Address already in use", output
    assert lines[error + 1].startswith("hint: pick another --port"), output
    assert not any("serving" in line or " on http://" in line for line in lines[:error]), output
    assert "Errno" not in output and "Traceback" not in output, output


@pytest.mark.parametrize(
    "args",
    [["inference"], ["api"], ["view", "{run}", "--serve"], ["export", "openenv", "arithmetic"]],
    ids=lambda args: " ".join(args[:2]),
)
def test_every_command_reports_a_taken_port_the_same_way(args: list[str], busy_port: int, tmp_path: Path):
    argv = [a.format(run=_run_dir(tmp_path)) if a == "{run}" else a for a in args]
    result = CliRunner().invoke(app, [*argv, "--port", str(busy_port)])
    assert result.exit_code == 1, result.output
    _says_port_taken(result.output, busy_port)


def test_the_fake_server_script_reports_a_taken_port_the_same_way(busy_port: int):
    done = subprocess.run(
        [sys.executable, "-m", "atropos_cli.testing.fake_server", "--port", str(busy_port)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == "", done
    _says_port_taken(done.stderr, busy_port)


def test_the_fake_server_class_raises_the_library_error(busy_port: int):
    with pytest.raises(PortUnavailableError, match=f"127.0.0.1:{busy_port}"):
        FakeInferenceServer(port=busy_port).start()
