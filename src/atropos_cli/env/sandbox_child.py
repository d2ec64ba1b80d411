"""The first code that runs inside the sandbox, before the untrusted program (`atropos_cli.env.sandbox` passes
this file's text as `python -I -S -c TEXT FD`; atropos never imports it, and nothing of atropos is importable
inside the sandbox: standard library only).

It reads the run's bundle (files, limits, mode) once from the inherited descriptor FD and closes it, so nothing
of it stays on a path. Under `unshare` it then finishes the namespace as its root: size-limited tmpfs over
`/tmp`, `/var/tmp` and `/dev/shm`; as host root it drops to uid 65534 (bind-mounting the interpreter past a
non-traversable parent such as a 0700 home first), as root of a user namespace it drops every capability (so
the mounts cannot be undone); and it stays as a trusted pid 1 that only waits, running the program in its
child (a program that clears its parent-death signal and calls setsid() still dies with pid 1). Then it writes
the files into the work dir, sets the rlimits, installs the audit hook and runs main.py.
"""

import ctypes
import json
import os
import resource
import runpy
import sys

NOBODY = 65534
MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC = 2, 4, 4096, 8192, 16384
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS = 24, 38
BLOCKED = (
    "socket.__new__", "socket.connect", "socket.bind", "socket.getaddrinfo", "subprocess.Popen", "os.system",
    "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "pty.spawn", "resource.setrlimit",
    "resource.prlimit", "os.kill", "os.killpg",
)  # fmt: skip


def read_bundle(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return json.loads(b"".join(chunks))


def mount(libc, source, target, fstype, flags, data):
    encode = lambda s: s.encode() if s is not None else None  # noqa: E731
    if libc.mount(encode(source), encode(target), encode(fstype), flags, encode(data)) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"sandbox: mount {target}: {os.strerror(err)}")


def blocked_ancestor(path):
    """The outermost folder on `path` that uid 65534 cannot traverse (no execute bit for others), or None."""
    parts = path.split("/")
    for i in range(2, len(parts) + 1):
        folder = "/".join(parts[:i])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def expose(libc, dirs):
    """Bind each folder in `dirs` to its own path again under a fresh tmpfs over its blocked parent (hiding
    the rest of that parent, e.g. root's home), so the dropped child can still load the interpreter."""
    moves = []
    for n, folder in enumerate(dirs):
        blocked = blocked_ancestor(folder)
        if blocked is not None:
            staging = f"/tmp/.expose{n}"
            os.mkdir(staging)
            mount(libc, folder, staging, None, MS_BIND | MS_REC, None)
            moves.append((staging, folder, blocked))
    tops = {b for _, _, b in moves}
    for blocked in sorted(tops):
        if not any(blocked.startswith(t + "/") for t in tops):
            mount(libc, "tmpfs", blocked, "tmpfs", MS_NOSUID | MS_NODEV, "size=65536,mode=0755")
    for staging, folder, _ in moves:
        os.makedirs(folder, mode=0o755, exist_ok=True)
        mount(libc, staging, folder, None, MS_MOVE, None)
        os.rmdir(staging)


def drop_capabilities(libc):
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    for cap in range(64):  # the bounding set too: an exec as uid 0 gets nothing back
        libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    header = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3
    if libc.capset(header, (ctypes.c_uint32 * 6)()) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: could not drop capabilities")


def enter_namespace(bundle):
    """unshare mode (root of fresh mount and pid namespaces): returns in the child that runs the program."""
    libc = ctypes.CDLL(None, use_errno=True)
    places = [p for p in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(p) and not os.path.islink(p)]
    size = bundle["tmpfs_bytes"] // len(places)  # together at most memory_mb
    for place in places:
        mount(libc, "tmpfs", place, "tmpfs", MS_NOSUID | MS_NODEV, f"size={size},mode=1777")
    os.umask(0o022)
    os.mkdir(bundle["workdir"], 0o700)
    if bundle["drop_to_nobody"]:
        expose(libc, bundle["expose"])
        os.chown(bundle["workdir"], NOBODY, NOBODY)
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    else:
        drop_capabilities(libc)
    pid = os.fork()
    if pid == 0:
        return
    os.close(0)
    os.close(1)
    os.close(2)
    status = os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)  # pid 1 cannot kill itself with the signal: 128 + N


def set_limits(limits):
    memory, cpu, output = limits
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))

    def hook(event, args):
        if event in BLOCKED:
            raise PermissionError(f"sandbox: {event} is not allowed")

    sys.addaudithook(hook)


def main():
    bundle = read_bundle(int(sys.argv[1]))
    if bundle["mode"] == "unshare":
        enter_namespace(bundle)
    workdir = bundle["workdir"]
    for name, text in bundle["files"].items():
        with open(os.path.join(workdir, name), "x", encoding="utf-8") as file:
            file.write(text)
    os.chdir(workdir)
    set_limits(bundle["limits"])
    sys.argv = ["main.py"]
    del bundle
    runpy.run_path("main.py", run_name="__main__")


if __name__ == "__main__":
    main()
