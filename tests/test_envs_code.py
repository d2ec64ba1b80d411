"""The code env and its sandbox: real subprocesses with time, memory and network limits."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from atropos_cli.env.registry import resolve_env
from atropos_cli.env.sandbox import SandboxLimits, isolation, landlock_available, run_python, run_python_async
from atropos_cli.envs._shared.data import BUNDLED_DATA
from atropos_cli.errors import ConfigError
from test_sandbox_attacks import _survivors  # processes of a name in /proc

DATA = Path(__file__).parent / "data"
ANY_MODE = SandboxLimits(allow_unisolated=True)  # tests of limits and judging, not of isolation
FIB_OK = "```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```"


def make_env(**config):
    cls = resolve_env("code")
    base, _ = cls.config_init()
    config.setdefault("allow_unisolated", isolation() != "bwrap")  # the judge logic is tested in any mode
    return cls(base.model_copy(update=config), server=None)


def item_named(env, entry_point):
    return next(i for i in env.items("eval") if f"{entry_point}(" in i["tests"][0])


def test_sandbox_runs_code_in_a_temp_dir():
    code = "import os; print(os.getcwd()); open('f.txt', 'w').write('x'); print(open('f.txt').read())"
    result = run_python(code, ANY_MODE)
    assert result.ok and result.stdout.splitlines()[1] == "x"
    cwd = result.stdout.splitlines()[0]
    expected = {"bwrap": "/sandbox", "unshare": "/tmp/sandbox"}.get(result.isolation)
    assert cwd == expected if expected else "atropos-sandbox-" in cwd


def test_sandbox_kills_an_infinite_loop_at_the_time_limit():
    result = run_python("while True:\n    pass", ANY_MODE.model_copy(update={"timeout_s": 0.5}))
    assert result.timed_out and result.failure == "timeout"  # it returned at all: the endless loop was killed


def test_sandbox_stops_a_memory_hog():
    hog = "x = bytearray(3_000_000_000)\nprint('allocated')"
    result = run_python(hog, ANY_MODE.model_copy(update={"memory_mb": 200}))
    assert result.failure == "memory" and "allocated" not in result.stdout


def test_sandbox_blocks_the_network():
    code = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))"
    result = run_python(code, ANY_MODE)
    assert not result.ok
    assert "not allowed" in result.stderr or "Network is unreachable" in result.stderr


def test_sandbox_async_runs_concurrently():
    async def main():
        return await asyncio.gather(*(run_python_async(f"print({i} * 2)", ANY_MODE) for i in range(3)))

    assert [r.stdout.strip() for r in asyncio.run(main())] == ["0", "2", "4"]


def test_code_reward_passes_fails_and_partial():
    env = make_env()
    item = item_named(env, "fib")
    assert env.reward(FIB_OK, item) == {"score": 1.0, "correct": 1.0, "timeout": 0.0, "memory": 0.0}
    wrong = "def fib(n):\n    return n"
    partial = env.reward(wrong, item)  # fib(0) and fib(1) pass, fib(10) and fib(30) fail
    assert partial["score"] == 0.5 and partial["correct"] == 0.0
    assert env.reward("def fib(n) return n", item)["score"] == 0.0  # syntax error


def test_code_reward_loop_and_memory_hog_score_zero():
    env = make_env(timeout_s=1.0, memory_mb=200)
    item = item_named(env, "fib")
    looping = env.reward("def fib(n):\n    while True:\n        pass", item)
    assert looping == {"score": 0.0, "correct": 0.0, "timeout": 1.0, "memory": 0.0}
    hog = env.reward("def fib(n):\n    return len(bytearray(3_000_000_000))", item)
    assert hog["score"] == 0.0 and hog["correct"] == 0.0


def test_code_solution_cannot_fake_the_result_line():
    env = make_env()
    item = item_named(env, "fib")
    cheat = 'print(\'x {"passed": [true, true, true, true], "error": null}\')\nimport sys\nsys.exit(0)'
    assert env.reward(cheat, item)["score"] == 0.0


def test_code_mbpp_style_loader(tmp_path):
    env = make_env(data_path=str(DATA / "mbpp_tiny.jsonl"))
    items = list(itertools.islice(env.items("eval"), 10))
    assert [i["id"] for i in items] == ["101", "102", "103"]
    assert "assert add(2, 3) == 5" in env.prompt(items[0])
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "x"}\n')
    with pytest.raises(ConfigError, match="'text', 'test_list'"):
        list(make_env(data_path=str(bad)).items("eval"))


def test_bundled_problems_pass_with_their_reference_solutions():
    import json

    env = make_env()
    rows = [json.loads(line) for line in (BUNDLED_DATA / "code_problems.jsonl").open()]
    items = list(env.items("eval"))
    assert len(items) == len(rows) >= 10
    for row, item in zip(rows, items, strict=True):
        assert env.reward(row["code"], item)["correct"] == 1.0, row["text"]


# ---- forging the reward: each completion tries to make every problem score full marks without solving it ----
_NAMES = (
    "import __main__, re\n"
    "_src = ' '.join(str(x) for k in ('_tests', '_calls') for x in getattr(__main__, k, []))\n"
    "_names = set(re.findall(r'([A-Za-z_]\\w*)\\(', _src)) - {'set', 'len', 'sorted', 'list', 'isclose'}\n"
)
FORGERIES = {
    "reads the nonce and prints a fake verdict": (
        "import __main__, os, sys\n"
        "_n = len(getattr(__main__, '_tests', getattr(__main__, '_calls', [])))\n"
        "sys.__stdout__.write('\\n' + getattr(__main__, '_nonce', '') + ' {\"passed\": ' + str([True] * _n).lower()"
        " + ', \"error\": null}\\n')\n"
        "sys.__stdout__.flush()\n"
        "os._exit(0)\n"
    ),
    "rewrites the test list": (
        "import __main__\n"
        "for _k in ('_tests', '_calls'):\n"
        "    if hasattr(__main__, _k):\n"
        "        getattr(__main__, _k)[:] = ['pass'] * len(getattr(__main__, _k))\n"
    ),
    "returns an object equal to everything": _NAMES
    + (
        "class Anything:\n"
        "    def __eq__(self, other): return True\n"
        "    def __ne__(self, other): return False\n"
        "    def __bool__(self): return True\n"
        "    __hash__ = object.__hash__\n"
        "for _name in _names:\n"
        "    globals()[_name] = lambda *a, **k: Anything()\n"
    ),
    "copies the expected values out of the harness' files": _NAMES
    + (
        "import os\n"
        "_text = ''.join(open(f, errors='ignore').read() for f in os.listdir('.') if os.path.isfile(f))\n"
        "_table = {c: e for c, e in re.findall(r'assert (\\w+\\(.*?\\)) == (.*?)\"', _text)}\n"
        "for _name in _names:\n"
        "    globals()[_name] = (lambda n: lambda *a: eval(\n"
        "        _table.get(n + '(' + ', '.join(map(repr, a)) + ')', 'object()')))(_name)\n"
    ),
    "looks the answers up in the installed answer key": _NAMES
    + (
        "import os\n"
        "_paths = [" + repr(str(BUNDLED_DATA / "code_problems.jsonl")) + "]\n"
        "for _root, _dirs, _files in os.walk('/'):\n"
        "    _dirs[:] = [d for d in _dirs if d not in ('proc', 'sys', 'dev')]\n"
        "    _paths += [os.path.join(_root, f) for f in _files if f.endswith('.jsonl')]\n"
        "_text = ''\n"
        "for _p in _paths:\n"
        "    try:\n"
        "        _text += open(_p, errors='ignore').read()\n"
        "    except OSError:\n"
        "        pass\n"
        "_table = {c: e for c, e in re.findall(r'assert (\\w+\\(.*?\\)) == (.*?)\"', _text)}\n"
        "for _name in _names:\n"
        "    globals()[_name] = (lambda n: lambda *a: eval(\n"
        "        _table.get(n + '(' + ', '.join(map(repr, a)) + ')', 'object()')))(_name)\n"
    ),
    "exits early after printing fake result rows": (
        "import json, os\n"
        "for _fd in [1] + [int(f) for f in os.listdir('/proc/self/fd') if int(f) > 2]:\n"
        "    try:\n"
        "        os.write(_fd, ''.join(json.dumps({'i': i, 'v': 'Anything()', 'passed': True}) + '\\n'"
        " for i in range(64)).encode() + b'ALL TESTS PASSED\\n')\n"
        "    except OSError:\n"
        "        pass\n"
        "os._exit(0)\n"
    ),
}


@pytest.mark.parametrize("name", list(FORGERIES))
def test_forged_completions_score_zero_on_every_problem(name):
    if "answer key" in name and isolation() != "bwrap" and not landlock_available():
        pytest.skip("without bubblewrap or Landlock the answer key is in reach: the env needs the opt-in")
    env = make_env()
    completion = f"```python\n{FORGERIES[name]}```"
    scores = {item["id"]: env.reward(completion, item)["score"] for item in env.items("eval")}
    assert set(scores.values()) == {0.0}, scores


@pytest.mark.parametrize("landlock", [False, True])
def test_the_answer_key_forgery_in_the_none_mode_is_stopped_only_by_landlock(monkeypatch, landlock):
    """Why the fallbacks need an explicit opt-in: without bubblewrap or Landlock the answer key is readable."""
    from atropos_cli.env import sandbox

    if landlock and not sandbox.landlock_available():
        pytest.skip("this kernel does not enforce Landlock")
    monkeypatch.setattr(sandbox, "landlock_available", lambda: landlock)
    monkeypatch.setenv("ATROPOS_SANDBOX", "none")
    isolation.cache_clear()
    try:
        env = make_env(allow_unisolated=True)
        item = item_named(env, "fib")
        forged = FORGERIES["looks the answers up in the installed answer key"].replace("os.walk('/')", "[]")
        assert env.reward(f"```python\n{forged}```", item)["score"] == (0.0 if landlock else 1.0)
    finally:
        isolation.cache_clear()


@pytest.mark.skipif(
    isolation() != "bwrap", reason="without bubblewrap the code env refuses to run (and the answer key is in reach)"
)
def test_process_code_with_forged_completions_writes_mean_score_zero(fake_server, tmp_path):
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    server = fake_server(rule=[f"```python\n{code}```" for code in FORGERIES.values()])
    out = tmp_path / "forged"
    args = ["process", "code", "--out", str(out), "--num-groups", "6", "--group-size", "5"]
    result = CliRunner().invoke(app, [*args, "--openai.base_url", server.base_url])
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 6 and {s for g in groups for s in g["scores"]} == {0.0}
    assert "mean score 0.000" in result.output


def test_honest_solutions_still_pass_tests_of_every_shape():
    from atropos_cli.env.sandbox import SandboxLimits as Limits
    from atropos_cli.envs._shared.codecheck import check_solution

    code = "import math\ndef f(x):\n    return [x, x / 3]\ndef g(s):\n    return {'n': len(s), 's': set(s)}\n"
    tests = [
        "assert f(3) == [3, 1.0]",
        "assert math.isclose(f(1)[1], 0.3333, rel_tol=0.001)",
        "assert set(g('aba')['s']) == {'a', 'b'} and g('')['n'] == 0",
        "assert all(v > 0 for v in f(2))",
        "assert not f(0)[0]",
        "assert f(2) != (2, 2 / 3)",  # a list is not a tuple, as in plain Python
    ]
    assert check_solution(code, tests, Limits(allow_unisolated=True)) == {"passed": 6, "total": 6, "failure": None}
    wrong = check_solution(code.replace("x / 3", "x / 4"), tests, Limits(allow_unisolated=True))
    assert wrong["passed"] == 4


# ---- escaping the sandbox: each attempt bypasses the audit hook (ctypes, _posixsubprocess) ----
def _escape_code(home_file: Path, sock_path: Path, token: str) -> str:
    """The escape attempts; the last forks an orphan named `token` (comm) that stays alive if it outlives the
    sandbox, so the host can see it in /proc."""
    return f"""\
import ctypes, os, socket, time
libc = ctypes.CDLL(None)
print("system", libc.system(b"echo shell-ran > {home_file}.shell"))
try:
    import _posixsubprocess
    r, w = os.pipe()
    pid = _posixsubprocess.fork_exec([b"/bin/sh", b"-c", b"echo x > {home_file}.fork"], [b"/bin/sh"], True, (), None,
        None, -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)  # 3.11's signature
    print("fork_exec", pid)
except Exception as exc:
    print("fork_exec blocked", type(exc).__name__)
try:
    open("{home_file}", "w").write("escaped")
    print("wrote home")
except OSError as exc:
    print("home blocked", exc.errno)
fd = socket.AF_UNIX
try:
    s = socket.socket(fd, socket.SOCK_STREAM)
except PermissionError:  # the audit hook: go around it
    s = None
sock = libc.socket(1, 1, 0)
addr = (ctypes.c_ushort(1).value.to_bytes(2, "little") + b"{sock_path}").ljust(110, bytes(1))
print("connect", libc.connect(sock, addr, len(addr)))
libc.prctl(15, b"{token}", 0, 0, 0)  # PR_SET_NAME before the fork: the child carries it from its first moment
child = libc.fork()
if child == 0:
    libc.setsid()
    time.sleep(0.5)
    try:
        open("{home_file}.orphan", "w").write("still running")
    except OSError:
        pass
    time.sleep(120)  # a survivor stays findable
    os._exit(0)
print("forked", child)
"""


def _listen(path: Path) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.setblocking(False)
    return server


def _accepted(server: socket.socket) -> bool:
    try:
        server.accept()[0].close()
        return True
    except BlockingIOError:
        return False


@pytest.fixture
def host_paths(tmp_path):
    # A directory under $HOME: the sandbox must not write there (tmp_path itself may be on a tmpfs).
    home = Path.home() / f".atropos-sandbox-test-{os.getpid()}"
    home.mkdir()
    sock_dir = Path(tempfile.mkdtemp(prefix="sbx-", dir="/tmp"))  # short: unix socket paths max 107 bytes
    yield home / "escape.txt", sock_dir / "s"
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(sock_dir, ignore_errors=True)


def _surviving_orphans(token: str) -> list[int]:
    """Processes named `token` still there once the sandbox is gone: polled until none is left (the sandbox's
    own process may take a moment to be reaped), with a deadline; survivors are killed and returned."""
    deadline = time.monotonic() + 10
    while _survivors(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _survivors(token)
    for pid in left:  # processes this test started: do not leave them on the machine
        os.kill(pid, signal.SIGKILL)
    return left


@pytest.mark.skipif(isolation() != "bwrap", reason="bubblewrap is not usable on this machine")
def test_bwrap_sandbox_blocks_ctypes_fork_exec_home_writes_host_sockets_and_orphans(host_paths):
    home_file, sock_path = host_paths
    server = _listen(sock_path)
    try:
        token = "sbxorph" + uuid.uuid4().hex[:8]
        result = run_python(_escape_code(home_file, sock_path, token))
        assert result.isolation == "bwrap" and result.ok, result.stderr
        assert "system 32512" in result.stdout  # no shell in the sandbox (exit status 127)
        assert "home blocked" in result.stdout  # and fork_exec may fork, but its exec of /bin/sh fails
        assert "connect -1" in result.stdout
        assert not _accepted(server)
        # Whatever it forked died with it: the orphan never writes (and could not write there anyway).
        assert _surviving_orphans(token) == []
        assert not list(home_file.parent.iterdir())
    finally:
        server.close()


def test_fallback_without_namespaces_runs_only_when_allowed_and_keeps_the_limits(monkeypatch):
    monkeypatch.setenv("ATROPOS_SANDBOX", "none")
    isolation.cache_clear()
    try:
        assert isolation() == "none"
        with pytest.raises(ConfigError, match="needs bubblewrap"):
            run_python("print('refused')")
        allowed = SandboxLimits(timeout_s=5, allow_unisolated=True)
        result = run_python("print('still limited')", allowed)
        assert result.ok and result.isolation == "none"
        hook = run_python("import socket\nsocket.socket()", allowed)
        assert "not allowed" in hook.stderr  # the audit hook still refuses the obvious routes
    finally:
        isolation.cache_clear()


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare here")
def test_unshare_fallback_blocks_network_and_orphans(monkeypatch, host_paths):
    home_file, sock_path = host_paths
    monkeypatch.setenv("ATROPOS_SANDBOX", "unshare")
    isolation.cache_clear()
    try:
        if isolation() != "unshare":
            pytest.skip("user namespaces are not allowed here")
        token = "sbxorph" + uuid.uuid4().hex[:8]
        result = run_python(_escape_code(home_file, sock_path, token), SandboxLimits(allow_unisolated=True))
        assert result.isolation == "unshare" and result.ok, result.stderr
        assert "connect -1" in result.stdout  # own network namespace: no host abstract sockets either
        assert _surviving_orphans(token) == []  # the pid namespace ended
    finally:
        isolation.cache_clear()
