"""What a sandboxed interpreter needs from the host's filesystem, and the bubblewrap/unshare command lines that
give it exactly that (`atropos_cli.env.sandbox` runs them).

The layout is asked of the interpreter itself (its standard library and extension-module folders) and of
`ldd` (the shared libraries the binary and those modules load). Nothing else is mounted under bubblewrap: not
the installation prefix, not `site-packages`/`dist-packages` (hidden by an empty read-only tmpfs where they sit
inside the standard library's folder, as in a pyenv, conda or python.org install), not `/usr` or `/bin`. So
installed packages (atropos and its data included) are out of the sandbox's reach and no shell or other program
exists in it.
"""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
from pathlib import Path

from pydantic import BaseModel

__all__ = [
    "Layout",
    "layout",
    "bwrap_command",
    "unshare_command",
    "exposed_dirs",
    "landlock_rules",
    "SANDBOX_DIR",
    "NOBODY",
]

SANDBOX_DIR = "/sandbox"  # the work dir's path inside a bwrap sandbox (a size-limited tmpfs)
NOBODY = 65534

_QUERY = (
    "import json, os, sys, sysconfig\n"
    "p = sysconfig.get_paths()\n"
    "dyn = sysconfig.get_config_var('DESTSHARED') or os.path.join(p['platstdlib'], 'lib-dynload')\n"
    "print(json.dumps({'stdlib': [p['stdlib'], p['platstdlib']], 'dynload': dyn}))\n"
)
_LDD_PATH = re.compile(r"(?:=>\s*)?(/\S+)\s+\(0x[0-9a-f]+\)")
_HIDDEN = ("site-packages", "dist-packages")


class Layout(BaseModel):
    """The host paths one interpreter needs, read-only."""

    python: str
    """The real binary (never a venv's symlink)."""
    stdlib: list[str]
    """Standard-library folders (extension modules included)."""
    hidden: list[str]
    """Package folders inside them that are covered by an empty tmpfs."""
    libraries: list[str]
    """Shared library files (the loader included), as `ldd` resolves them."""


@functools.cache
def layout(python: str) -> Layout:
    """Ask `python` where its standard library is and `ldd` which libraries it and its extension modules load."""
    python = os.path.realpath(python)
    done = subprocess.run([python, "-I", "-S", "-c", _QUERY], capture_output=True, text=True, timeout=30, check=True)
    info = json.loads(done.stdout)
    stdlib = sorted({os.path.realpath(p) for p in [*info["stdlib"], info["dynload"]] if os.path.isdir(p)})
    stdlib = [p for p in stdlib if not any(p.startswith(q + os.sep) for q in stdlib)]  # no folder twice
    hidden = [os.path.join(d, name) for d in stdlib for name in _HIDDEN if os.path.isdir(os.path.join(d, name))]
    modules = sorted(str(p) for p in Path(info["dynload"]).glob("*.so")) if os.path.isdir(info["dynload"]) else []
    return Layout(python=python, stdlib=stdlib, hidden=hidden, libraries=_libraries([python, *modules]))


def _libraries(binaries: list[str]) -> list[str]:
    ldd = shutil.which("ldd")
    if ldd is None:
        raise OSError("ldd is not installed (it tells which shared libraries the interpreter loads)")
    done = subprocess.run([ldd, *binaries], capture_output=True, text=True, timeout=60)
    found = {m.group(1) for line in done.stdout.splitlines() if (m := _LDD_PATH.search(line))}
    return sorted(p for p in found if os.path.exists(p))


def _in_sandbox(path: str) -> str:
    """Where a host file goes inside the sandbox: its folder's real path (so `/lib/x.so` lands in `/usr/lib` when
    `/lib` is a link to it) with the file's own name kept (a library's soname is often itself a link)."""
    return os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))


def bwrap_command(lay: Layout, tmpfs_bytes: int, env: dict[str, str]) -> list[str]:
    """The bubblewrap prefix: new user/pid/net/ipc/uts/cgroup namespaces, uid 65534, a read-only root with only
    `lay` in it, `/tmp` and `/sandbox` tmpfs of `tmpfs_bytes` each, `/dev` and `/proc` of its own."""
    size = str(max(tmpfs_bytes, 4096))
    command = [
        "bwrap", "--unshare-all", "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox",
        "--die-with-parent", "--new-session", "--proc", "/proc", "--dev", "/dev",
        "--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", SANDBOX_DIR,
    ]  # fmt: skip
    for path in [lay.python, *lay.stdlib]:
        command += ["--ro-bind", path, path]
    for path in lay.hidden:
        command += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    for path in lay.libraries:
        command += ["--ro-bind", path, _in_sandbox(path)]
    if os.path.isfile("/etc/ld.so.cache"):  # where the loader finds libraries by name (no secrets in it)
        command += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for link in ("/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(link):
            command += ["--symlink", os.readlink(link), link]
    command += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", SANDBOX_DIR, "--clearenv"]
    for key, value in env.items():
        command += ["--setenv", key, value]
    return command


def unshare_command() -> list[str]:
    """util-linux `unshare`: new mount, pid, net, ipc and uts namespaces with a fresh /proc; as root no user
    namespace (the child drops to uid 65534 itself), otherwise root of a user namespace mapped to the caller."""
    user = [] if os.geteuid() == 0 else ["--user", "--map-root-user"]
    return ["unshare", *user, "--mount", "--pid", "--net", "--ipc", "--uts", "--fork", "--kill-child", "--mount-proc"]


def exposed_dirs(lay: Layout) -> list[str]:
    """The folders a dropped-to-65534 child must still reach (the unshare mode bind-mounts them past a
    non-traversable parent such as a 0700 home)."""
    dirs = {os.path.dirname(lay.python), *lay.stdlib, *(os.path.dirname(p) for p in lay.libraries)}
    return sorted(d for d in dirs if not any(d.startswith(e + os.sep) for e in dirs))


def landlock_rules(lay: Layout) -> list[list[str]]:
    """The same view as bubblewrap's, as Landlock rules for the fallback modes: read the binary, each entry of
    the standard library but the package folders (whose names alone can be listed) and the libraries."""
    rules = [[lay.python, "read"], *([p, "read"] for p in lay.libraries), ["/dev/null", "write"]]
    if os.path.isfile("/etc/ld.so.cache"):
        rules.append(["/etc/ld.so.cache", "read"])
    for folder in lay.stdlib:
        rules.append([folder, "list"])
        rules += [[os.path.join(folder, n), "read"] for n in sorted(os.listdir(folder)) if n not in _HIDDEN]
    return rules
