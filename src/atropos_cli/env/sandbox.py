"""Running untrusted Python in a subprocess with time, memory, output, filesystem and network limits (the code
env's judge runs model-written code here).

Isolation, chosen once per process by `isolation()` (strongest available):

- `bwrap` (bubblewrap, when installed and the kernel allows namespaces): new user, pid, network, ipc, uts and
  mount namespaces. The child sees only the Python installation and the system libraries, read-only; a fresh
  empty /tmp; /dev and /proc of its own; its work dir (the only writable place, deleted afterwards). No
  host sockets (no network interface but loopback, no host unix socket paths), no shell or other programs
  (/bin is not mounted), runs as uid 65534, and every process it forks dies with it (the pid namespace ends).
- `unshare` (util-linux, when bwrap is missing): new user, pid, network and mount namespaces (`unshare
  --user --map-root-user --mount --pid --net --fork --kill-child`): no network, no host abstract sockets, the
  process tree killed at the end; the filesystem is NOT read-only and unix socket files stay reachable.
- `none`: only the rlimits and audit hook below, with a warning naming what is not isolated.

In every mode the child also gets: a wall-clock limit (the process group is SIGKILLed at `timeout_s`),
RLIMIT_CPU as a backstop, RLIMIT_AS at `memory_mb` (an allocation past it raises MemoryError), output files
capped by RLIMIT_FSIZE, and an audit hook that refuses sockets, subprocesses, fork and exec through Python's
own APIs (ctypes and `_posixsubprocess` bypass the hook: that is why the namespaces matter). The limits are
set by a small guard script in the child before the code runs, not by preexec_fn.
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
import sysconfig
import tempfile
import time
import warnings
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

__all__ = [
    "SandboxLimits",
    "SandboxResult",
    "SandboxWarning",
    "Isolation",
    "isolation",
    "run_python",
    "run_python_async",
]

Isolation = Literal["bwrap", "unshare", "none"]
_MOUNT = "/sandbox"  # the work dir's path inside a bwrap sandbox

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

NOT_ISOLATED: dict[Isolation, str] = {
    "bwrap": "",
    "unshare": "the filesystem is writable wherever this user can write (home included) and host unix socket "
    "files are reachable (install bubblewrap for a read-only root)",
    "none": "code can write files anywhere this user can (home included), reach the network and host unix "
    "sockets through ctypes, run a shell, and leave forked processes running "
    "(install bubblewrap, or allow user namespaces, for real isolation)",
}


class SandboxWarning(UserWarning):
    """The sandbox runs with weaker isolation than bubblewrap gives (printed once per process)."""


class SandboxLimits(BaseModel):
    timeout_s: float = Field(default=5.0, gt=0)
    memory_mb: int = Field(default=512, ge=32)
    max_output_bytes: int = Field(default=1_000_000, ge=1024)


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


def _ro_paths() -> list[str]:
    """Directories the child may read: the Python installation and the system libraries (no /bin, no /etc)."""
    paths = {sys.base_prefix, sys.base_exec_prefix, sysconfig.get_paths()["stdlib"], os.path.dirname(_python())}
    paths |= {p for p in ("/usr/lib", "/usr/lib64", "/usr/lib32", "/usr/libx32") if os.path.isdir(p)}
    if sys.base_prefix == "/usr":  # a system Python: mount its binary, not the whole of /usr/bin
        paths.discard("/usr/bin")
        paths.add(_python())
    return sorted(p for p in paths if p and os.path.exists(p))


def bwrap_command(workdir: Path) -> list[str]:
    """The bubblewrap prefix that runs a command in `workdir` (mounted at /sandbox) with nothing else writable."""
    command = [
        "bwrap", "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534", "--hostname", "sandbox",
        "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
    ]  # fmt: skip
    for path in _ro_paths():
        command += ["--ro-bind", path, path]
    for link in ("/lib", "/lib64", "/lib32"):
        if os.path.islink(link):
            command += ["--symlink", os.readlink(link), link]
        elif os.path.isdir(link):
            command += ["--ro-bind", link, link]
    command += ["--bind", str(workdir), _MOUNT, "--chdir", _MOUNT, "--clearenv"]
    for key, value in _env(Path(_MOUNT)).items():
        command += ["--setenv", key, value]
    return command


_UNSHARE = ["unshare", "--user", "--map-root-user", "--mount", "--pid", "--net", "--fork", "--kill-child"]


def _works(command: list[str]) -> bool:
    try:
        done = subprocess.run(command, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return done.returncode == 0


@functools.cache
def isolation() -> Isolation:
    """The strongest isolation this machine allows, probed once per process (env ATROPOS_SANDBOX=bwrap|unshare|
    none caps it, e.g. to test the fallback); warns (SandboxWarning) when it is weaker than bwrap."""
    wanted = os.environ.get("ATROPOS_SANDBOX", "bwrap")
    order: list[Isolation] = ["bwrap", "unshare", "none"]
    start = order.index(wanted) if wanted in order else 0  # type: ignore[arg-type]
    chosen: Isolation = "none"
    if sys.platform.startswith("linux"):
        with tempfile.TemporaryDirectory(prefix="atropos-sandbox-probe-") as tmp:
            probe = {
                "bwrap": [*bwrap_command(Path(tmp)), _python(), "-I", "-c", "pass"],
                "unshare": [*_UNSHARE, _python(), "-I", "-c", "pass"],
            }
            for mode in order[start:-1]:
                if shutil.which(mode) and _works(probe[mode]):
                    chosen = mode
                    break
    if chosen != "bwrap":
        warnings.warn(f"code sandbox: isolation '{chosen}': {NOT_ISOLATED[chosen]}", SandboxWarning, stacklevel=2)
    return chosen


def _prepare(workdir: Path, code: str, files: dict[str, str] | None, limits: SandboxLimits) -> list[str]:
    (workdir / "_guard.py").write_text(_GUARD, encoding="utf-8")
    (workdir / "main.py").write_text(code, encoding="utf-8")
    for name, text in (files or {}).items():
        (workdir / name).write_text(text, encoding="utf-8")
    memory = str(limits.memory_mb * 1024 * 1024)
    cpu = str(int(limits.timeout_s) + 1)
    command = [_python(), "-I", "_guard.py", memory, cpu, str(limits.max_output_bytes), "main.py"]
    mode = isolation()
    if mode == "bwrap":
        return [*bwrap_command(workdir), *command]
    return [*_UNSHARE, *command] if mode == "unshare" else command


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
        isolation=isolation(),
    )


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def run_python(
    code: str, limits: SandboxLimits | None = None, stdin: str = "", files: dict[str, str] | None = None
) -> SandboxResult:
    """Run `code` as `main.py` in a fresh temp dir under the limits; blocks until it ends or is killed. Whatever
    it started is killed too (in the `none` mode only what stayed in its process group)."""
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
            _kill_group(proc.pid)  # also on a normal exit: children it left in its group go with it
            proc.wait()
        return _collect(workdir, proc.returncode, timed_out, started)


async def run_python_async(
    code: str, limits: SandboxLimits | None = None, stdin: str = "", files: dict[str, str] | None = None
) -> SandboxResult:
    """`run_python` without blocking the event loop (the code env scores a group's rollouts concurrently)."""
    return await asyncio.to_thread(run_python, code, limits, stdin, files)
