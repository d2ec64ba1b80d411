"""Running untrusted Python in a subprocess with time, memory, output, filesystem and network limits (the code
env's judge runs model-written code here).

Isolation, chosen once per process by `isolation()` (the strongest that works here):

- `bwrap` (bubblewrap installed, the kernel allows user namespaces): new user, pid, network, ipc, uts and
  cgroup namespaces, uid 65534, a read-only root holding only the interpreter binary, its standard library
  (site-packages hidden) and the shared libraries it loads (`sandbox_layout`): no installed package, no shell,
  no `/usr`, no host file. `/tmp` and the work dir `/sandbox` are tmpfs of `memory_mb / 2` each; `/dev` and `/`
  are read-only. Every process dies with bwrap's own pid 1.
- `unshare` (util-linux only): new mount, pid, net, ipc and uts namespaces, a fresh /proc, tmpfs over `/tmp`,
  `/var/tmp` and `/dev/shm`; as root the program runs as uid 65534, else as root of a user namespace with no
  capabilities; a trusted pid 1 (`sandbox_child`) so whatever it forks dies at the end. Without Landlock the
  host's files stay readable (the code env's hidden tests included).
- `none`: only what every mode gets (below).

In both fallbacks, where the kernel enforces Landlock (`landlock_available`), the child restricts itself to
bwrap's view: it reads only the interpreter's files (package folders' names at most) and writes only its work
dir. The code env still refuses both unless allowed.

`run_python` refuses a mode weaker than bwrap unless `SandboxLimits.allow_unisolated`; `not_isolated(mode)`
names every gap left by each mode (the code env prints it as one warning line). In every mode the child gets: a
wall-clock limit (the process group is SIGKILLed at `timeout_s`), RLIMIT_CPU as a backstop, RLIMIT_AS at
`memory_mb`, RLIMIT_FSIZE at the output cap, 64 descriptors, an audit hook refusing sockets, subprocesses,
fork and exec through Python's own APIs, and a seccomp filter (x86_64, aarch64) refusing them to ctypes too:
no new process (threads are fine), no exec, no socket, no io_uring, no ptrace, no signal to another process,
no SysV shared memory or message queues, so neither a fork bomb nor memory outside RLIMIT_AS multiplies
`memory_mb`, and the fallbacks reach no network. Its files arrive through a descriptor it reads once (no
host path), and its stdout and stderr are pipes this process owns and reads up to `max_output_bytes` each: the
parent never opens a file the sandboxed code could have replaced.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any, Literal

from pydantic import BaseModel, Field

from atropos_cli.env.sandbox_layout import (
    SANDBOX_DIR,
    bwrap_command,
    exposed_dirs,
    landlock_rules,
    layout,
    unshare_command,
)
from atropos_cli.errors import AtroposWarning, ConfigError

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxWarning",
    "Isolation",
    "not_isolated",
    "landlock_available",
    "isolation",
    "require_isolation",
    "run_python",
    "run_python_async",
]

Isolation = Literal["bwrap", "unshare", "none"]
_CHILD = (Path(__file__).parent / "sandbox_child.py").read_text(encoding="utf-8")
_UNSHARE_DIR = "/tmp/sandbox"  # the work dir inside the unshare mode's private /tmp

_SECCOMP_MACHINES = ("x86_64", "aarch64")  # sandbox_child's syscall tables
_NO_SECCOMP = "; no seccomp filter here: it runs programs, forks and opens sockets"
if sys.platform.startswith("linux") and os.uname().machine in _SECCOMP_MACHINES:
    _NO_SECCOMP = ""
_GAPS: dict[Isolation, str] = {
    "bwrap": "",
    "unshare": "it can read every file the host lets its user read (installed packages and the code env's "
    "hidden tests included) and write where that user can outside /tmp, /var/tmp and /dev/shm; it runs as uid "
    "65534 when atropos runs as root, else as you (your home writable)",
    "none": "it runs as you: it reads and writes your files (the code env's hidden tests included), sees every "
    "process's command line in /proc, and writes past memory_mb to disk and /dev/shm, leaving those files "
    "behind",
}
_GAPS_WITH_LANDLOCK: dict[Isolation, str] = {
    "bwrap": "",
    "unshare": "Landlock keeps its reads to the interpreter's files and its writes to its work dir, but it "
    "runs as you unless atropos runs as root",
    "none": "Landlock keeps its reads to the interpreter's files and its writes to its work dir, but that dir "
    "sits in the host's /tmp unbounded by memory_mb (deleted after the run), and it runs as you in the host's "
    "pid namespace",
}


@functools.cache
def landlock_available() -> bool:
    """Whether this kernel enforces Landlock (Linux 5.13+ with the LSM on): the fallback modes then get bwrap's
    view of the filesystem."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    return int(libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))) >= 1


def not_isolated(mode: Isolation) -> str:
    """Every gap `mode` leaves on this machine, in one line ("" for bwrap)."""
    gaps = (_GAPS_WITH_LANDLOCK if landlock_available() else _GAPS)[mode]
    return gaps + _NO_SECCOMP if gaps else gaps


class SandboxWarning(AtroposWarning):
    """The sandbox runs with weaker isolation than bubblewrap gives."""


class SandboxLimits(BaseModel):
    timeout_s: float = Field(default=5.0, gt=0)
    memory_mb: int = Field(default=512, ge=32)
    max_output_bytes: int = Field(default=1_000_000, ge=1024)
    allow_unisolated: bool = False
    """Run even when bubblewrap is unusable (the `unshare` or `none` mode; see not_isolated)."""


class SandboxResult(BaseModel):
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool = False
    memory_exceeded: bool = False
    duration_s: float = 0.0
    isolation: Isolation = "none"

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


def _python() -> str:
    """The real interpreter (not a venv's symlink): the sandbox mounts its installation, not the venv."""
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def _env(home: str) -> dict[str, str]:
    return {"PATH": "/usr/bin:/bin", "HOME": home, "LANG": "C.UTF-8", "PYTHONHASHSEED": "0"}


def _descriptor(data: bytes) -> int:
    """An anonymous file holding `data`, rewound (a memfd; an unlinked temp file where there is none)."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create("atropos-sandbox")
    else:  # pragma: no cover - not Linux
        with tempfile.TemporaryFile() as file:
            fd = os.dup(file.fileno())
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _command(mode: Isolation, limits: SandboxLimits, python: str, bundle_fd: int) -> tuple[list[str], dict[str, Any]]:
    """The command line and the bundle fields that depend on the mode."""
    child = [python, "-I", "-S", "-c", _CHILD, str(bundle_fd)]
    tmpfs = limits.memory_mb * 1024 * 1024  # what all its tmpfs together may hold
    if mode == "bwrap":  # two: /tmp and the work dir
        return [*bwrap_command(layout(python), tmpfs // 2, _env(SANDBOX_DIR)), *child], {"workdir": SANDBOX_DIR}
    extra: dict[str, Any] = {"landlock": landlock_rules(layout(python)) if landlock_available() else []}
    if mode == "unshare":
        root = os.geteuid() == 0
        extra |= {"workdir": _UNSHARE_DIR, "tmpfs_bytes": tmpfs, "drop_to_nobody": root}
        extra["expose"] = exposed_dirs(layout(python)) if root else []
        return [*unshare_command(), *child], extra
    return child, extra


def _execute(
    mode: Isolation, code: str, limits: SandboxLimits, stdin: str, files: dict[str, str] | None
) -> SandboxResult:
    python = _python()
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        bundle_fd = _descriptor(b"")
        stdin_fd = _descriptor(stdin.encode("utf-8"))
        stack.callback(os.close, bundle_fd)
        stack.callback(os.close, stdin_fd)
        command, extra = _command(mode, limits, python, bundle_fd)
        cwd = None
        if mode == "none":
            cwd = stack.enter_context(tempfile.TemporaryDirectory(prefix="atropos-sandbox-"))
            extra["workdir"] = cwd
        memory = limits.memory_mb * 1024 * 1024
        bundle = {
            "mode": mode, "files": {**(files or {}), "main.py": code},
            "limits": [memory, int(limits.timeout_s) + 1, limits.max_output_bytes], **extra,
        }  # fmt: skip
        os.write(bundle_fd, json.dumps(bundle).encode("utf-8"))
        os.lseek(bundle_fd, 0, os.SEEK_SET)
        proc = subprocess.Popen(
            command, cwd=cwd, env=_env(cwd or SANDBOX_DIR), stdin=stdin_fd, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, pass_fds=(bundle_fd,), start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None and proc.stderr is not None
        out, err, timed_out = _collect(proc, proc.stdout, proc.stderr, limits)
    returncode = proc.returncode
    if mode != "none" and returncode > 128:  # bwrap's and our pid 1 report a signal as 128 + N
        returncode = 128 - returncode
    stdout, stderr = (b.decode("utf-8", errors="replace") for b in (out, err))
    return SandboxResult(
        returncode=returncode, stdout=stdout, stderr=stderr, timed_out=timed_out,
        memory_exceeded="MemoryError" in stderr[-2000:], duration_s=round(time.perf_counter() - started, 4),
        isolation=mode,
    )  # fmt: skip


def _collect(
    proc: subprocess.Popen[bytes], out: IO[bytes], err: IO[bytes], limits: SandboxLimits
) -> tuple[bytes, bytes, bool]:
    """Read both pipes (at most the cap each; the rest is read and dropped) until the process ends or the time
    limit passes, then kill its process group and take what is still buffered."""
    cap = limits.max_output_bytes
    out_fd, err_fd = out.fileno(), err.fileno()
    buffers = {out_fd: bytearray(), err_fd: bytearray()}
    deadline = time.monotonic() + limits.timeout_s
    timed_out = False
    with selectors.DefaultSelector() as selector, contextlib.ExitStack() as stack:
        for fd in buffers:
            os.set_blocking(fd, False)
            selector.register(fd, selectors.EVENT_READ)
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(proc.pid)
            stack.callback(os.close, pidfd)
            selector.register(pidfd, selectors.EVENT_READ)
        while proc.poll() is None:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in selector.select(remaining if pidfd is not None else min(remaining, 0.05)):
                if key.fd in buffers and _read(key.fd, buffers[key.fd], cap) is False:  # end of file
                    selector.unregister(key.fd)
        _kill_group(proc.pid)  # also on a normal exit: children it left in its group go with it
        proc.wait()
        for fd, buffer in buffers.items():  # what it wrote before it died; a survivor cannot keep us here
            budget = cap + (1 << 20)
            while budget > 0 and _read(fd, buffer, cap) is True:
                budget -= 1 << 16
    out.close()
    err.close()
    return bytes(buffers[out_fd]), bytes(buffers[err_fd]), timed_out


def _read(fd: int, buffer: bytearray, cap: int) -> bool | None:
    """One read into `buffer` (kept up to `cap`): True when it got bytes, False at end of file, None when
    nothing is waiting."""
    try:
        chunk = os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    if chunk and len(buffer) < cap:
        buffer += chunk[: cap - len(buffer)]
    return bool(chunk)


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


_WHY_NOT: dict[str, str] = {}  # mode -> why it did not run here (for the error and warning lines)


@functools.cache
def isolation() -> Isolation:
    """The strongest isolation that runs a program on this machine, probed once per process (env
    ATROPOS_SANDBOX=bwrap|unshare|none caps it, e.g. to test a fallback)."""
    wanted = os.environ.get("ATROPOS_SANDBOX", "bwrap")
    order: list[Isolation] = ["bwrap", "unshare", "none"]
    start = order.index(wanted) if wanted in order else 0  # type: ignore[arg-type]
    _WHY_NOT.clear()
    for mode in order[:start]:
        _WHY_NOT[mode] = f"ATROPOS_SANDBOX={wanted} skips it"
    if not sys.platform.startswith("linux"):
        _WHY_NOT.setdefault("bwrap", "not Linux")
        return "none"
    for mode in order[start:-1]:
        if _probe(mode):
            return mode
    return "none"


def _probe(mode: Isolation) -> bool:
    if shutil.which(mode) is None:
        _WHY_NOT[mode] = f"{mode} is not installed"
        return False
    try:
        result = _execute(mode, "print('ok')", SandboxLimits(timeout_s=10), "", None)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        _WHY_NOT[mode] = f"{type(exc).__name__}: {exc}"[:300]
        return False
    if result.ok and result.stdout.strip() == "ok":
        return True
    _WHY_NOT[mode] = ((result.stderr.strip().splitlines() or [""])[-1] or f"exit status {result.returncode}")[:300]
    return False


def require_isolation(allow_unisolated: bool) -> Isolation:
    """The mode code will run in; a ConfigError when it is weaker than bwrap and not allowed."""
    mode = isolation()
    if mode != "bwrap" and not allow_unisolated:
        raise ConfigError(
            f"the code sandbox needs bubblewrap, which cannot run here ({_WHY_NOT.get('bwrap', 'unknown')}); "
            f"the '{mode}' fallback leaves gaps: {not_isolated(mode)}",
            hint="install bubblewrap (apt-get install bubblewrap) and allow user namespaces, or accept the gaps "
            "with --env.allow_unisolated true",
        )
    return mode


def run_python(
    code: str, limits: SandboxLimits | None = None, stdin: str = "", files: dict[str, str] | None = None
) -> SandboxResult:
    """Run `code` as `main.py` beside `files` in a fresh work dir under the limits; blocks until it ends or is
    killed, and whatever it started is killed too (in the `none` mode only what stayed in its process group).
    Raises ConfigError when isolation is weaker than bwrap and `limits.allow_unisolated` is off."""
    limits = limits or SandboxLimits()
    return _execute(require_isolation(limits.allow_unisolated), code, limits, stdin, files)


async def run_python_async(
    code: str, limits: SandboxLimits | None = None, stdin: str = "", files: dict[str, str] | None = None
) -> SandboxResult:
    """`run_python` without blocking the event loop (the code env scores a group's rollouts concurrently)."""
    return await asyncio.to_thread(run_python, code, limits, stdin, files)
