"""Attack the code sandbox in every isolation mode this machine gives and print what each attack got (the table
in docs/security.md comes from here).

    .venv/bin/python benchmarks/sandbox_attacks.py [--modes bwrap,unshare,none,unshare-nolandlock,none-nolandlock]

Each mode runs with `allow_unisolated` on (the code env refuses the fallbacks without it). Every attack is a
program the sandbox runs as model-written code; the host checks what it left behind. Host paths used: a secret
file and a unix socket under a fresh /tmp dir, a file under $HOME, unique names in /tmp, /var/tmp, /dev/shm.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from pathlib import Path

from atropos_cli.env import sandbox
from atropos_cli.env.sandbox import SandboxLimits, isolation, run_python
from atropos_cli.envs._shared.data import BUNDLED_DATA

_LANDLOCK = sandbox.landlock_available
ALLOW = SandboxLimits(allow_unisolated=True, timeout_s=20)


def _code_rows(secret: Path, sock: Path, home: Path, token: str) -> dict[str, str]:
    answer_key = str(BUNDLED_DATA / "code_problems.jsonl")
    return {
        "reads the code env's answer key (its host path)": f"print(len(open({answer_key!r}).read()))",
        "reads a host file outside its dir": f"print(open({str(secret)!r}).read())",
        "reads /etc/shadow": "print(len(open('/etc/shadow').read()))",
        "writes to $HOME": f"open({str(home)!r}, 'w').write('x'); print('wrote')",
        "lists host processes in /proc": "import os\nprint(sum(p.isdigit() for p in os.listdir('/proc')), 'pids')",
        "imports an installed package (pip)": "import pip\nprint(pip.__file__)",
        "runs /bin/sh through ctypes": "import ctypes\nprint('exit', ctypes.CDLL(None).system(b'/bin/sh -c true'))",
        "execs /bin/sh through ctypes": "import ctypes\nprint('execv', ctypes.CDLL(None).execv(b'/bin/sh', None))",
        "forks through ctypes": "import ctypes, os\npid = ctypes.CDLL(None).fork()\nif pid == 0:\n    os._exit(0)\n"
        "print('fork', pid)",
        "signals every process (kill(-1, 0))": "import ctypes\nprint('kill', ctypes.CDLL(None).kill(-1, 0))",
        "reads another process's rlimits (prlimit on its parent)": (
            "import ctypes, os\nl = (ctypes.c_uint64 * 2)()\n"
            "print('prlimit', ctypes.CDLL(None).prlimit(os.getppid(), 0, None, l))"
        ),
        "SysV shared memory (shmget 16 MB)": (
            "import ctypes\nprint('shmget', ctypes.CDLL(None).shmget(0, 16 << 20, 0o1600))"
        ),
        "connects to a host unix socket through ctypes": (
            "import ctypes\nlibc = ctypes.CDLL(None)\ns = libc.socket(1, 1, 0)\n"
            f"a = (b'\\x01\\x00' + {str(sock).encode()!r}).ljust(110, bytes(1))\n"
            "print('connect', libc.connect(s, a, len(a)))"
        ),
        "connects to 1.1.1.1:53 through ctypes": (
            "import ctypes\nlibc = ctypes.CDLL(None)\ns = libc.socket(2, 1, 0)\n"
            "a = b'\\x02\\x00\\x00\\x35\\x01\\x01\\x01\\x01' + bytes(8)\nprint('connect', libc.connect(s, a, 16))"
        ),
        "replaces stdout.txt by a FIFO, stderr.txt by /dev/zero": (
            "import os\nos.mkfifo('stdout.txt')\nos.symlink('/dev/zero', 'stderr.txt')\n"
            f"os.symlink({str(secret)!r}, 'stdin.txt')\nprint('steered')"
        ),
        "fills every writable place (memory_mb 64)": (
            "import os\ntotal = 0\n"
            "for place in ('/tmp', '.', '/dev/shm', '/var/tmp', '/dev', '/'):\n"
            "    for i in range(24):\n"
            "        try:\n"
            f"            with open(os.path.join(place, f'fill-{{i}}-{token}'), 'wb') as f:\n"
            "                for _ in range(8):\n"
            "                    f.write(b'x' * 1_000_000); f.flush(); total += 1_000_000\n"
            "        except OSError:\n"
            "            break\n"
            "print(total // 1_000_000, 'MB written')"
        ),
        "setsid + no death signal (and 5 forks), past the time limit": (
            "import ctypes, time\nlibc = ctypes.CDLL(None)\nlibc.prctl(1, 0, 0, 0, 0)\nlibc.setsid()\n"
            "for _ in range(5):\n    if libc.fork() == 0:\n        libc.setsid()\n        break\n"
            f"libc.prctl(15, {token[:12]!r}.encode(), 0, 0, 0)\nprint('ready', flush=True)\n"
            "while True:\n    time.sleep(1)"
        ),
    }


def _survivors(name: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == name:
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def attack(name: str) -> list[tuple[str, str]]:
    """`name` is a mode, with `-nolandlock` to run a fallback as on a kernel without Landlock."""
    mode = name.removesuffix("-nolandlock")
    sandbox.landlock_available = (lambda: False) if name.endswith("-nolandlock") else _LANDLOCK  # type: ignore[assignment]
    os.environ["ATROPOS_SANDBOX"] = mode
    isolation.cache_clear()
    if isolation() != mode:
        return [("(mode)", f"not available here (got {isolation()})")]
    scratch = Path(tempfile.mkdtemp(prefix="sbx-", dir="/tmp"))
    secret, sock, home = scratch / "secret.txt", scratch / "s", Path.home() / f".sbx-attack-{os.getpid()}"
    secret.write_text("HOST-SECRET")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(sock))
    server.listen(1)
    server.setblocking(False)
    token = uuid.uuid4().hex
    rows = []
    try:
        for name, code in _code_rows(secret, sock, home, token).items():
            limits = ALLOW
            if "memory_mb" in name:
                limits = ALLOW.model_copy(update={"memory_mb": 64, "max_output_bytes": 10_000_000})
            if "time limit" in name:
                limits = ALLOW.model_copy(update={"timeout_s": 1.5})
            started = time.monotonic()
            result = run_python(code, limits)
            took = time.monotonic() - started
            got = (result.stdout.strip().splitlines() or [""])[-1][:60] or result.stderr.strip().splitlines()[-1][-60:]
            if "HOST-SECRET" in result.stdout + result.stderr and "host file" not in name:
                got += " (LEAKED the host secret)"
            if "FIFO" in name:
                got += f"; returned in {took:.1f} s, stderr {len(result.stderr)} chars"
            if "unix socket" in name:
                try:
                    server.accept()[0].close()
                    got += "; host accepted"
                except BlockingIOError:
                    got += "; host saw nothing"
            if "$HOME" in name:
                got += "; file on host" if home.exists() else "; nothing on host"
                home.unlink(missing_ok=True)
            if "memory_mb" in name:
                left = [p for d in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(d) for p in os.listdir(d)]
                left = [p for p in left if token in p]
                got += f"; {len(left)} files left on the host"
                for d in ("/tmp", "/var/tmp", "/dev/shm"):
                    for p in Path(d).glob(f"*{token}") if os.path.isdir(d) else []:
                        p.unlink()
            if "time limit" in name:
                deadline = time.monotonic() + 5
                while _survivors(token[:12]) and time.monotonic() < deadline:
                    time.sleep(0.1)
                alive = _survivors(token[:12])
                got = f"timed out={result.timed_out}; {len(alive)} processes alive after it"
                for pid in alive:
                    os.kill(pid, signal.SIGKILL)
            rows.append((name, got))
    finally:
        server.close()
        shutil.rmtree(scratch, ignore_errors=True)
        home.unlink(missing_ok=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modes", default="bwrap,unshare,none,unshare-nolandlock,none-nolandlock")
    args = parser.parse_args()
    print(f"uid {os.getuid()}, python {sys.executable}, libc {ctypes.util.find_library('c')}")
    for mode in args.modes.split(","):
        print(f"\n## {mode}\n\n| attack | result |\n|---|---|")
        for name, got in attack(mode):
            print(f"| {name} | {got.replace('|', '/')} |")


if __name__ == "__main__":
    main()
