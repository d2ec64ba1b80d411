"""Running untrusted Python in a subprocess with time, memory, output and network limits (the code env's judge).

Layers, strongest first:
- a wall-clock limit (the whole process group is SIGKILLed at `timeout_s`) and RLIMIT_CPU as a backstop
  (rlimits are set by a small guard script in the child before the code runs, not by preexec_fn);
- RLIMIT_AS (address space) at `memory_mb`: an allocation past it raises MemoryError in the child;
- stdout/stderr go to files in a fresh temp dir capped by RLIMIT_FSIZE, so a print loop cannot fill the
  parent's memory; the temp dir is the child's cwd and HOME and is deleted afterwards;
- no network: `unshare -rn` (an empty network namespace) when the kernel allows it, and in every case an
  audit hook in the child that refuses socket creation and new processes (`python -I`, so no user site or
  PYTHONPATH).

This is a guard against accidents and casual misuse (loops, memory hogs, stray requests), not a security
boundary against a determined attacker; run untrusted code at scale in a container or VM.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pydantic import BaseModel, Field

__all__ = ["SandboxLimits", "SandboxResult", "run_python", "run_python_async", "network_isolation"]

_GUARD = """\
import resource, runpy, sys
# Limits are set here, in the child, before any user code: no preexec_fn (unsafe when the parent has threads).
_mem, _cpu, _out = (int(x) for x in sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_AS, (_mem, _mem))
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu + 1))
resource.setrlimit(resource.RLIMIT_FSIZE, (_out, _out))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
_BLOCKED = ("socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "subprocess.Popen",
            "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn",
            "resource.setrlimit", "resource.prlimit", "os.kill", "os.killpg")
def _hook(event, args):
    if event in _BLOCKED:
        raise PermissionError(f"sandbox: {event} is not allowed")
sys.addaudithook(_hook)
sys.argv = sys.argv[4:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


class SandboxLimits(BaseModel):
    timeout_s: float = Field(5.0, gt=0)
    memory_mb: int = Field(512, ge=32)
    max_output_bytes: int = Field(1_000_000, ge=1024)


class SandboxResult(BaseModel):
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    memory_exceeded: bool = False
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.returncode == 0 and not self.timed_out

    @property
    def failure(self) -> str | None:
        """One word for why the run failed: timeout, memory, signal, error; None when it succeeded."""
        if self.timed_out:
            return "timeout"
        if self.memory_exceeded:
            return "memory"
        if self.returncode is not None and self.returncode < 0:
            return f"signal {-self.returncode}"
        return None if self.returncode == 0 else "error"


@functools.cache
def network_isolation() -> bool:
    """Whether `unshare -rn` works here (user + network namespaces); checked once per process."""
    if shutil.which("unshare") is None or not sys.platform.startswith("linux"):
        return False
    try:
        done = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


def _prepare(workdir: Path, code: str, files: dict[str, str] | None, limits: SandboxLimits) -> list[str]:
    (workdir / "_guard.py").write_text(_GUARD, encoding="utf-8")
    (workdir / "main.py").write_text(code, encoding="utf-8")
    for name, text in (files or {}).items():
        (workdir / name).write_text(text, encoding="utf-8")
    memory = str(limits.memory_mb * 1024 * 1024)
    cpu = str(int(limits.timeout_s) + 1)
    command = [sys.executable, "-I", "_guard.py", memory, cpu, str(limits.max_output_bytes), "main.py"]
    return ["unshare", "-rn", *command] if network_isolation() else command


def _env(workdir: Path) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def _collect(workdir: Path, returncode: int | None, timed_out: bool, started: float) -> SandboxResult:
    def read(name: str) -> str:
        return (workdir / name).read_bytes().decode("utf-8", errors="replace")

    stderr = read("stderr.txt")
    return SandboxResult(
        returncode=returncode,
        stdout=read("stdout.txt"),
        stderr=stderr,
        timed_out=timed_out,
        memory_exceeded="MemoryError" in stderr[-2000:],
        duration_s=round(time.perf_counter() - started, 4),
    )


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


def run_python(
    code: str, limits: SandboxLimits | None = None, stdin: str = "", files: dict[str, str] | None = None
) -> SandboxResult:
    """Run `code` as `main.py` in a fresh temp dir under the limits; blocks until it ends or is killed."""
    limits = limits or SandboxLimits()
    with tempfile.TemporaryDirectory(prefix="atropos-sandbox-") as tmp:
        workdir = Path(tmp)
        command = _prepare(workdir, code, files, limits)
        (workdir / "stdin.txt").write_text(stdin, encoding="utf-8")
        started = time.perf_counter()
        with (
            open(workdir / "stdin.txt", "rb") as fin,
            open(workdir / "stdout.txt", "wb") as fout,
            open(workdir / "stderr.txt", "wb") as ferr,
        ):
            proc = subprocess.Popen(
                command, cwd=workdir, env=_env(workdir), stdin=fin, stdout=fout, stderr=ferr,
                start_new_session=True,
            )  # fmt: skip
            timed_out = False
            try:
                proc.wait(timeout=limits.timeout_s)
            except subprocess.TimeoutExpired:
                timed_out = True
                _kill_group(proc.pid)
                proc.wait()
        return _collect(workdir, proc.returncode, timed_out, started)


async def run_python_async(
    code: str, limits: SandboxLimits | None = None, stdin: str = "", files: dict[str, str] | None = None
) -> SandboxResult:
    """`run_python` without blocking the event loop (the code env scores a group's rollouts concurrently)."""
    return await asyncio.to_thread(run_python, code, limits, stdin, files)
