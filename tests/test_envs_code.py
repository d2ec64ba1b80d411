"""The code env and its sandbox: real subprocesses with time, memory and network limits."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest

from atropos_cli.env.registry import resolve_env
from atropos_cli.env.sandbox import SandboxLimits, run_python, run_python_async

DATA = Path(__file__).parent / "data"
FIB_OK = "```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n```"


def make_env(**config):
    cls = resolve_env("code")
    base, _ = cls.config_init()
    return cls(base.model_copy(update=config), server=None)


def item_named(env, entry_point):
    return next(i for i in env.items("eval") if f"{entry_point}(" in i["tests"][0])


def test_sandbox_runs_code_in_a_temp_dir():
    result = run_python("import os; print(os.getcwd()); open('f.txt', 'w').write('x')")
    assert result.ok and "atropos-sandbox-" in result.stdout
    assert not Path(result.stdout.strip()).exists()  # the temp dir is gone afterwards


def test_sandbox_kills_an_infinite_loop_at_the_time_limit():
    result = run_python("while True:\n    pass", SandboxLimits(timeout_s=0.5))
    assert result.timed_out and result.failure == "timeout" and result.duration_s < 3


def test_sandbox_stops_a_memory_hog():
    result = run_python("x = bytearray(3_000_000_000)\nprint('allocated')", SandboxLimits(memory_mb=200))
    assert result.failure == "memory" and "allocated" not in result.stdout


def test_sandbox_blocks_the_network():
    code = "import socket\ns = socket.socket()\ns.connect(('127.0.0.1', 9))"
    result = run_python(code)
    assert not result.ok
    assert "not allowed" in result.stderr or "Network is unreachable" in result.stderr


def test_sandbox_async_runs_concurrently():
    async def main():
        return await asyncio.gather(*(run_python_async(f"print({i} * 2)") for i in range(3)))

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
    from atropos_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="'text', 'test_list'"):
        list(make_env(data_path=str(bad)).items("eval"))


def test_bundled_problems_pass_with_their_reference_solutions():
    import json

    from atropos_cli.envs._shared.data import BUNDLED_DATA

    env = make_env()
    rows = [json.loads(line) for line in (BUNDLED_DATA / "code_problems.jsonl").open()]
    items = list(env.items("eval"))
    assert len(items) == len(rows) >= 10
    for row, item in zip(rows, items, strict=True):
        assert env.reward(row["code"], item)["correct"] == 1.0, row["text"]
