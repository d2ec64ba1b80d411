"""Hostile programs against the code sandbox: each tries to reach the answer key, steer the files the parent reads
back, outlive its time limit, read host secrets or fill the host's memory. Every mode that runs on this machine
is attacked (bwrap where it works; `unshare` and `none` as explicit opt-ins)."""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from pathlib import Path

import pytest

from atropos_cli.env import sandbox
from atropos_cli.env.sandbox import SandboxLimits, isolation, landlock_available, not_isolated, run_python
from atropos_cli.errors import ConfigError

OPT_IN = SandboxLimits(allow_unisolated=True)


@pytest.fixture
def mode(request, monkeypatch):
    """Run the test under one isolation mode, skipping when this machine cannot give it."""
    monkeypatch.setenv("ATROPOS_SANDBOX", request.param)
    isolation.cache_clear()
    try:
        if isolation() != request.param:
            pytest.skip(f"isolation '{request.param}' does not work on this machine")
        yield request.param
    finally:
        isolation.cache_clear()


def _run_with_deadline(code: str, limits: SandboxLimits, seconds: float = 60):
    """run_python in a thread: a run that never returns fails the test instead of hanging it."""
    box: dict = {}
    thread = threading.Thread(target=lambda: box.setdefault("result", run_python(code, limits)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), "the sandbox run never returned"
    return box["result"]


# ---- 1 and 8: nothing but the interpreter and its standard library is in reach under bubblewrap ----
WALK = """\
import json, os
found = {"files": 0, "packages": [], "programs": [], "answer_key": []}
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    for name in files:
        path = os.path.join(root, name)
        found["files"] += 1
        if "-packages" in path:
            found["packages"].append(path)
        if name in ("sh", "bash", "dash", "env", "ls", "cat") or (os.access(path, os.X_OK) and "/bin/" in path
                and not name.startswith("python")):
            found["programs"].append(path)
        if name.endswith((".jsonl", ".json", ".parquet")):
            try:
                if "assert " in open(path, errors="ignore").read(1_000_000):
                    found["answer_key"].append(path)
            except OSError:
                pass
print(json.dumps(found))
"""


def _walk(result) -> dict:
    assert result.ok, result.stderr
    return json.loads(result.stdout)


@pytest.mark.parametrize("mode", ["bwrap"], indirect=True)
def test_bwrap_shows_no_installed_package_no_program_and_no_answer_key(mode):
    found = _walk(run_python(WALK, SandboxLimits(timeout_s=30)))
    assert found["files"] > 100  # the standard library is there
    assert found == {**found, "packages": [], "programs": [], "answer_key": []}


@pytest.mark.parametrize("mode", ["bwrap"], indirect=True)
def test_bwrap_with_a_system_python_mounts_neither_usr_nor_its_packages(mode, monkeypatch):
    system = next((p for p in ("/usr/bin/python3", "/usr/bin/python3.11") if os.path.exists(p)), None)
    if system is None:
        pytest.skip("no system Python at /usr/bin/python3")
    monkeypatch.setattr(sandbox, "_python", lambda: os.path.realpath(system))
    found = _walk(run_python(WALK, SandboxLimits(timeout_s=30)))
    assert found["packages"] == [] and found["programs"] == [] and found["answer_key"] == []
    shell = run_python("import ctypes\nprint(ctypes.CDLL(None).system(b'/usr/bin/sh -c true'))")
    assert shell.ok and shell.stdout.strip() == "32512", shell  # exit status 127: no /usr/bin/sh


def test_code_env_refuses_fallback_isolation_unless_allowed(monkeypatch):
    from atropos_cli.env.registry import resolve_env
    from atropos_cli.env.sandbox import SandboxWarning

    monkeypatch.setenv("ATROPOS_SANDBOX", "none")
    isolation.cache_clear()
    try:
        cls = resolve_env("code")
        base, _ = cls.config_init()
        with pytest.raises(ConfigError, match="needs bubblewrap") as refused:
            cls.check_config(base)
        assert "--env.allow_unisolated" in (refused.value.hint or "")
        with pytest.raises(ConfigError):
            run_python("print(1)")  # the library refuses too, for any caller
        with pytest.warns(SandboxWarning, match=re.escape(not_isolated("none"))):
            cls.check_config(base.model_copy(update={"allow_unisolated": True}))
    finally:
        isolation.cache_clear()


def test_cli_prints_one_error_line_or_one_warning_line_for_fallback_isolation(fake_server, tmp_path):
    import subprocess
    import sys

    server = fake_server(rule=["def f():\n    return 1"])
    base = [sys.executable, "-m", "atropos_cli", "process", "code", "--num-groups", "1", "--group-size", "2"]
    base += ["--openai.base_url", server.base_url]
    env = {**os.environ, "ATROPOS_SANDBOX": "none"}
    refused = subprocess.run([*base, "--out", str(tmp_path / "a")], capture_output=True, text=True, env=env)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("error: the code sandbox needs bubblewrap"), refused.stderr
    allowed = subprocess.run(
        [*base, "--out", str(tmp_path / "b"), "--env.allow_unisolated", "true"], capture_output=True, text=True, env=env
    )
    assert allowed.returncode == 0, allowed.stderr
    warnings = [line for line in allowed.stderr.splitlines() if "sandbox" in line.lower()]
    assert warnings == [f"warning: code sandbox without bubblewrap ('none' mode): {not_isolated('none')}"]
    assert "Warning:" not in allowed.stderr and "warnings.warn" not in allowed.stderr


HOST_FILES = """\
import os
for action, path in (("read", {key!r}), ("read", {secret!r}), ("write", {out!r}), ("list", "/proc")):
    try:
        os.listdir(path) if action == "list" else open(path, "w" if action == "write" else "r").close()
        print(action, path, "allowed")
    except OSError as exc:
        print(action, path, type(exc).__name__)
"""


@pytest.mark.skipif(not landlock_available(), reason="this kernel does not enforce Landlock")
@pytest.mark.parametrize("mode", ["unshare", "none"], indirect=True)
def test_landlock_keeps_the_fallbacks_off_the_answer_key_host_files_and_proc(mode, tmp_path):
    from atropos_cli.envs._shared.data import BUNDLED_DATA

    secret = tmp_path / "secret.txt"
    secret.write_text("HOST-SECRET")
    code = HOST_FILES.format(key=str(BUNDLED_DATA / "code_problems.jsonl"), secret=str(secret), out=str(tmp_path / "o"))
    result = run_python(code, OPT_IN)
    assert result.ok and "allowed" not in result.stdout, result
    assert not (tmp_path / "o").exists() and len(result.stdout.splitlines()) == 4


# ---- 2: the parent reads only its own pipes, never a file the code controls ----
STEER = """\
import os
for name in ("stdout.txt", "stderr.txt", "stdin.txt"):
    try:
        os.remove(name)
    except OSError:
        pass
os.mkfifo("stdout.txt")
os.symlink("/dev/zero", "stderr.txt")
os.symlink({secret!r}, "stdin.txt")
print("steered")
"""


@pytest.mark.parametrize("mode", ["bwrap", "unshare", "none"], indirect=True)
def test_fifo_and_symlinks_in_place_of_the_output_files_are_never_read(mode, tmp_path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("HOST-SECRET-VALUE")
    result = _run_with_deadline(STEER.format(secret=str(secret)), OPT_IN)
    assert result.ok and result.stdout == "steered\n", result
    assert "HOST-SECRET" not in result.stdout + result.stderr and len(result.stderr) < 10_000


@pytest.mark.parametrize("mode", ["bwrap", "none"], indirect=True)
def test_output_is_capped_at_the_limit(mode):
    code = "import sys\nfor _ in range(400):\n    sys.stdout.write('x' * 100_000)\nsys.stderr.write('e' * 5_000_000)"
    result = _run_with_deadline(code, SandboxLimits(max_output_bytes=50_000, allow_unisolated=True))
    assert result.ok and len(result.stdout) == 50_000 and len(result.stderr) == 50_000


# ---- 5: the time limit ends every process, /proc and the host's secrets stay out of reach ----
def _survivors(token: str) -> list[int]:
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == token:
                    pids.append(int(entry.name))
            except OSError:
                pass
    return pids


ESCAPE_TIMEOUT = """\
import ctypes, time
libc = ctypes.CDLL(None)
libc.prctl(1, 0, 0, 0, 0)  # PR_SET_PDEATHSIG 0: no death signal
libc.setsid()
for _ in range(5):
    if libc.fork() == 0:
        libc.setsid()
        break
libc.prctl(15, {token!r}.encode(), 0, 0, 0)  # PR_SET_NAME: findable from the host
print("ready", flush=True)
while True:
    time.sleep(1)
"""


@pytest.mark.parametrize("mode", ["bwrap", "unshare"], indirect=True)
def test_setsid_processes_without_death_signal_die_at_the_time_limit(mode):
    token = "sbx" + uuid.uuid4().hex[:10]
    result = run_python(ESCAPE_TIMEOUT.format(token=token), SandboxLimits(timeout_s=1.5, allow_unisolated=True))
    assert result.timed_out and "ready" in result.stdout, result
    deadline = time.monotonic() + 10
    while _survivors(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _survivors(token)
    for pid in left:  # processes this test started: do not leave them on the machine
        os.kill(pid, signal.SIGKILL)
    assert left == []


PROC_AND_SHADOW = """\
import os
try:
    print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
except PermissionError:  # Landlock
    print([1])
try:
    open("/etc/shadow").read()
    print("shadow read")
except OSError as exc:
    print("shadow", type(exc).__name__)
"""


@pytest.mark.parametrize("mode", ["bwrap", "unshare"], indirect=True)
def test_host_proc_and_shadow_are_out_of_reach(mode):
    result = run_python(PROC_AND_SHADOW, OPT_IN)
    pids, shadow = result.stdout.splitlines()
    assert os.getpid() not in json.loads(pids) and max(json.loads(pids)) < 10, pids
    if os.path.exists("/etc/shadow"):
        assert shadow != "shadow read"


# ---- seccomp in every mode: no new process, exec, socket, ptrace, signal to others or SysV memory ----
SYSCALLS = """\
import ctypes, json, os, sys, threading
libc = ctypes.CDLL(None, use_errno=True)
out = {}
pid = libc.fork()
if pid == 0:
    os._exit(0)
out["fork"] = pid
out["shmget"] = libc.shmget(0, 1 << 20, 0o1000 | 0o600)
out["msgget"] = libc.msgget(0, 0o1000 | 0o600)
out["execv"] = libc.execv(sys.executable.encode(), None)
out["socket"] = libc.socket(2, 1, 0)  # AF_INET: the network in the none mode
out["unix socket"] = libc.socket(1, 1, 0)
out["kill -1"] = libc.kill(-1, 0)  # every process the user owns (all of them as root)
out["ptrace"] = libc.ptrace(16, 1, 0, 0)  # PTRACE_ATTACH
out["io_uring"] = libc.syscall(425, 1, None)
out["kill self"] = libc.kill(os.getpid(), 0)
limits = (ctypes.c_uint64 * 2)()  # prlimit on another process: read only (setting RLIMIT_CPU there kills it)
out["prlimit parent"] = libc.prlimit(os.getppid(), 0, None, limits)
out["prlimit self"] = libc.prlimit(0, 0, None, limits) + libc.prlimit(os.getpid(), 0, None, limits)
fds = []
try:
    while len(fds) < 500:
        fds.append(os.memfd_create("m"))
except OSError:
    pass
out["memfds"] = len(fds)
for fd in fds:
    os.close(fd)
done = []
thread = threading.Thread(target=lambda: done.append(1))
thread.start()
thread.join()
out["thread"] = done
print(json.dumps(out))
"""


@pytest.mark.skipif(os.uname().machine not in ("x86_64", "aarch64"), reason="seccomp numbers only for x86_64/aarch64")
@pytest.mark.parametrize("mode", ["bwrap", "unshare", "none"], indirect=True)
def test_processes_exec_sockets_signals_and_sysv_memory_are_refused_threads_still_run(mode):
    result = run_python(SYSCALLS, OPT_IN)
    assert result.ok, result.stderr
    out = json.loads(result.stdout)
    refused = ("fork", "shmget", "msgget", "execv", "socket", "unix socket", "kill -1", "ptrace", "io_uring",
               "prlimit parent")  # fmt: skip
    assert {name: out[name] for name in refused} == dict.fromkeys(refused, -1)
    assert out["kill self"] == 0 and out["prlimit self"] == 0 and out["memfds"] < 64 and out["thread"] == [1]


# ---- 7: memory_mb bounds the tmpfs; without bubblewrap nothing stays in the host's /tmp or /dev/shm ----
FILL = """\
import os
total = 0
for place in ("/tmp", ".", "/dev/shm", "/var/tmp", "/dev", "/"):
    for i in range(24):  # 24 files x 8 MB per place: three times the 64 MB limit
        try:
            with open(os.path.join(place, f"fill-{{i}}-{token}"), "wb") as f:
                for _ in range(8):
                    f.write(b"x" * 1_000_000)
                    f.flush()
                    total += 1_000_000
        except OSError:
            break
print(total)
"""


@pytest.mark.parametrize("mode", ["bwrap", "unshare"], indirect=True)
def test_tmpfs_writes_are_bounded_by_memory_mb_and_leave_nothing_on_the_host(mode):
    token = uuid.uuid4().hex
    limits = SandboxLimits(memory_mb=64, max_output_bytes=10_000_000, timeout_s=30, allow_unisolated=True)
    result = run_python(FILL.format(token=token), limits)
    assert result.ok, result.stderr
    assert int(result.stdout) <= 64 * 1024 * 1024
    for place in ("/tmp", "/dev/shm", "/var/tmp"):
        if os.path.isdir(place):
            assert not [p for p in os.listdir(place) if token in p], place


def test_the_seccomp_program_of_each_machine_jumps_inside_itself_and_ends_in_return():
    from atropos_cli.env.sandbox_child import SECCOMP_ARCH, seccomp_program

    for machine in SECCOMP_ARCH:
        program = seccomp_program(machine, 1234)
        assert program[-1][0] == 0x06 and len(program) < 256
        for i, (code, jt, jf, _) in enumerate(program):
            if code in (0x15, 0x35):
                assert i + 1 + max(jt, jf) < len(program), (machine, i)
    assert seccomp_program("riscv64", 1) is None
