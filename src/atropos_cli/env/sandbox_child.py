"""The first code that runs inside the sandbox, before the untrusted program (`atropos_cli.env.sandbox` passes
this file's text as `python -I -S -c TEXT FD`; atropos never imports it, and nothing of atropos is importable
inside the sandbox: standard library only).

It reads the run's bundle (files, limits, mode) once from the inherited descriptor FD and closes it, so nothing
of it stays on a path. Under `unshare` it then finishes the namespace as its root: size-limited tmpfs over
`/tmp`, `/var/tmp` and `/dev/shm`; as host root it drops to uid 65534 (bind-mounting the interpreter past a
non-traversable parent such as a 0700 home first), as root of a user namespace it drops every capability (so
the mounts cannot be undone); and it stays as a trusted pid 1 that only waits, running the program in its
child (a program that clears its parent-death signal and calls setsid() still dies with pid 1). Then it writes
the files into the work dir, restricts itself with Landlock (fallback modes, where the kernel has it), sets
the rlimits, installs the seccomp filter and the audit hook and runs main.py.
"""

import ctypes
import json
import os
import resource
import runpy
import struct
import sys

NOBODY = 65534
MS_NOSUID, MS_NODEV, MS_BIND, MS_MOVE, MS_REC = 2, 4, 4096, 8192, 16384
PR_CAPBSET_DROP, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 24, 38, 22, 2
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


# seccomp: the machine's own syscall numbers. Denied: new processes (fork, vfork, clone without CLONE_THREAD;
# clone3 answers ENOSYS so threads fall back to clone), exec, sockets, io_uring (it can open sockets past the
# filter), ptrace, process_vm_* and pidfd_getfd, SysV shared memory and message queues (memory RLIMIT_AS does
# not count), signals to any process but itself, and prlimit (read or set the rlimits) of any process but
# itself; any other syscall ABI (x32, i386 through int 0x80) is denied whole.
SECCOMP_ARCH = {
    "x86_64": (0xC000003E, 0x40000000, {
        "fork": 57, "vfork": 58, "execve": 59, "execveat": 322, "socket": 41, "io_uring_setup": 425,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "shmget": 29, "msgget": 68,
        "tkill": 200, "pidfd_send_signal": 424, "pidfd_getfd": 438, "kill": 62, "tgkill": 234, "clone": 56,
        "clone3": 435, "prlimit64": 302,
    }),
    "aarch64": (0xC00000B7, None, {
        "execve": 221, "execveat": 281, "socket": 198, "io_uring_setup": 425, "ptrace": 117,
        "process_vm_readv": 270, "process_vm_writev": 271, "shmget": 194, "msgget": 186, "tkill": 130,
        "pidfd_send_signal": 424, "pidfd_getfd": 438, "kill": 129, "tgkill": 131, "clone": 220, "clone3": 435,
        "prlimit64": 261,
    }),
}  # fmt: skip
CLONE_THREAD, ALLOW, DENY, NOSYS = 0x10000, 0x7FFF0000, 0x00050001, 0x00050026  # RET_ERRNO | EPERM / ENOSYS


def seccomp_program(machine, pid):
    """The filter as (code, jt, jf, k) rows, or None on a machine whose numbers are not listed here."""
    if machine not in SECCOMP_ARCH:
        return None
    arch, abi_bit, nr = SECCOMP_ARCH[machine]
    special = ("kill", "tgkill", "clone", "clone3", "prlimit64")
    rows = [("ld", 4), ("jeq", arch, 1, 0), ("ret", DENY), ("ld", 0)]
    if abi_bit is not None:
        rows.append(("jge", abi_bit, "deny", 0))
    rows += [("jeq", number, "deny", 0) for name, number in nr.items() if name not in special]
    rows += [("jeq", nr["clone3"], "nosys", 0), ("jeq", nr["clone"], "clone", 0)]
    rows += [("jeq", nr["kill"], "self", 0), ("jeq", nr["tgkill"], "self", 0)]
    rows += [("jeq", nr["prlimit64"], "zero", 0), ("ret", ALLOW)]
    rows += [("label", "zero"), ("ld", 16), ("jeq", 0, "allow", "self_pid")]  # prlimit: pid 0 (itself) ...
    rows += [("label", "clone"), ("ld", 16), ("and", CLONE_THREAD), ("jeq", 0, "deny", 0), ("ret", ALLOW)]
    rows += [("label", "self"), ("ld", 16), ("label", "self_pid"), ("jeq", pid, 0, "deny")]  # arg 0: its own pid
    rows += [("label", "allow"), ("ret", ALLOW)]
    rows += [("label", "deny"), ("ret", DENY), ("label", "nosys"), ("ret", NOSYS)]
    labels, program = {}, []
    for row in rows:
        if row[0] == "label":
            labels[row[1]] = len(program)
        else:
            program.append(row)
    codes = {"ld": 0x20, "jeq": 0x15, "jge": 0x35, "and": 0x54, "ret": 0x06}
    out = []
    for i, row in enumerate(program):
        jt, jf = (row[2], row[3]) if row[0] in ("jeq", "jge") else (0, 0)
        jt, jf = (labels[j] - i - 1 if isinstance(j, str) else j for j in (jt, jf))
        out.append((codes[row[0]], jt, jf, row[1]))
    return out


def install_seccomp():
    program = seccomp_program(os.uname().machine, os.getpid())
    if program is None or not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Filter))]

    filters = (Filter * len(program))(*(Filter(*row) for row in program))
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
        PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), filters)), 0, 0
    ):
        raise OSError(ctypes.get_errno(), "sandbox: could not install the seccomp filter")


LANDLOCK_CREATE_RULESET, LANDLOCK_ADD_RULE, LANDLOCK_RESTRICT_SELF, LANDLOCK_RULE_PATH_BENEATH = 444, 445, 446, 1
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR, FS_TRUNCATE, FS_IOCTL_DEV = 1, 2, 4, 8, 1 << 14, 1 << 15
FS_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
FS_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR


def restrict_filesystem(rules):
    """Landlock (the fallback modes): from here on only `rules` ([path, "list" | "read" | "write"]) reach the
    filesystem: "list" lists a folder's names, "read" reads beneath it, "write" does anything beneath it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    arg = ctypes.c_long
    abi = libc.syscall(arg(LANDLOCK_CREATE_RULESET), None, arg(0), arg(1))  # LANDLOCK_CREATE_RULESET_VERSION
    if abi < 1:
        raise OSError(ctypes.get_errno(), "sandbox: Landlock is not available")
    handled = (1 << 13) - 1 | (1 << 13 if abi >= 2 else 0) | (FS_TRUNCATE if abi >= 3 else 0)
    handled |= FS_IOCTL_DEV if abi >= 5 else 0
    attr = ctypes.c_uint64(handled)
    ruleset = libc.syscall(arg(LANDLOCK_CREATE_RULESET), ctypes.byref(attr), arg(8), arg(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "sandbox: landlock_create_ruleset failed")
    rights = {"list": FS_READ_DIR, "read": FS_READ, "write": handled}
    for path, kind in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except FileNotFoundError:
            continue
        is_dir = os.path.isdir(f"/proc/self/fd/{fd}")
        allowed = rights[kind] & handled & (handled if is_dir else FS_FILE_RIGHTS)
        beneath = ctypes.create_string_buffer(struct.pack("=Qi", allowed, fd), 12)
        done = libc.syscall(arg(LANDLOCK_ADD_RULE), arg(ruleset), arg(LANDLOCK_RULE_PATH_BENEATH), beneath, arg(0))
        os.close(fd)
        if done != 0:
            raise OSError(ctypes.get_errno(), f"sandbox: landlock_add_rule {path}")
    libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)
    if libc.syscall(arg(LANDLOCK_RESTRICT_SELF), arg(ruleset), arg(0)) != 0:
        raise OSError(ctypes.get_errno(), "sandbox: landlock_restrict_self failed")
    os.close(ruleset)


def set_limits(limits):
    memory, cpu, output = limits
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_FSIZE, (output, output))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))  # memfds: at most 64 files of the output cap
    install_seccomp()

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
    if bundle.get("landlock"):
        restrict_filesystem([*bundle["landlock"], [workdir, "write"]])
    set_limits(bundle["limits"])
    sys.argv = ["main.py"]
    del bundle
    runpy.run_path("main.py", run_name="__main__")


if __name__ == "__main__":
    main()
