"""A framework's server as a child process on 127.0.0.1 (OpenEnv's env servers, NeMo Gym's resources servers).

`ChildServer.start(command, base_url, ...)` runs the command (its output into a log file), polls
`base_url + health_path` until it answers 200, and returns; a process that exits first, or never answers within the
deadline, is one `EnvLoadError` with the log's last lines and the caller's hint. The process is stopped
(SIGTERM, then SIGKILL) by `stop()`, when the object goes away, or when our process exits; its log goes with it.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

from atropos_cli.errors import EnvLoadError

__all__ = ["ChildServer"]


def _stop(process: subprocess.Popen[bytes], log_dir: str) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    shutil.rmtree(log_dir, ignore_errors=True)


class ChildServer:
    """One server process, named `what` in its errors (`the OpenEnv server echo_env.server.app:app`)."""

    def __init__(self, what: str, hint: str) -> None:
        self.what = what
        self.hint = hint
        self._process: subprocess.Popen[bytes] | None = None
        self._finalizer: Any = None

    def start(
        self,
        command: list[str],
        base_url: str,
        timeout_s: float,
        health_path: str = "/health",
        *,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        log_dir = tempfile.mkdtemp(prefix="atropos-server-")
        log = Path(log_dir) / "server.log"
        with log.open("wb") as out:
            self._process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=cwd, env=env
            )
        self._finalizer = weakref.finalize(self, _stop, self._process, log_dir)
        self._wait_healthy(base_url, health_path, log, timeout_s)

    @property
    def process(self) -> subprocess.Popen[bytes] | None:
        return self._process

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer()

    def _wait_healthy(self, base_url: str, path: str, log: Path, timeout_s: float) -> None:
        import httpx

        assert self._process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                tail = log.read_text(errors="replace").strip().splitlines()[-3:]
                self.stop()
                raise EnvLoadError(
                    f"{self.what} exited with code {self._process.returncode}: " + (" | ".join(tail) or "no output"),
                    hint=self.hint,
                )
            try:
                if httpx.get(base_url + path, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)  # polling a starting process, bounded by the deadline above
        self.stop()
        raise EnvLoadError(
            f"{self.what} did not answer GET {path} within {timeout_s:g}s",
            hint="raise --env.startup_timeout_s",
        )
