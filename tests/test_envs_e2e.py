"""Every bundled env end to end: `atropos process` through a real fake inference server (HTTP on 127.0.0.1).

The fake server's rule answers each prompt with what a perfect model would say (looked up from the env's
own items), so every group must score full marks; judge and blackjack get rules of their own.
"""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.env.registry import resolve_env

DATA = Path(__file__).parent / "data"
runner = CliRunner()


def make_env(name: str, **config):
    cls = resolve_env(name)
    base, _ = cls.config_init()
    return cls(base.model_copy(update=config), server=None)


def last_user(prompt) -> str:
    return prompt if isinstance(prompt, str) else [m for m in prompt if m["role"] == "user"][-1]["content"]


def answer_book(env, solve, count: int) -> dict[str, str]:
    return {last_user(env.prompt(item)): solve(item) for item in itertools.islice(env.items("train"), count)}


def process(env: str, out: Path, url: str, *args: str, groups: int = 3, group_size: int = 2):
    result = runner.invoke(
        app,
        ["process", env, "--out", str(out), "--num-groups", str(groups), "--group-size", str(group_size),
         "--openai.base_url", url, *args],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]


def run_with_book(fake_server, tmp_path, name, solve, *args, count=40):
    book = answer_book(make_env(name, **_config(args)), solve, count)
    server = fake_server(rule=lambda prompt, index: book.get(prompt, "I do not know."))
    return process(name, tmp_path / name, server.base_url, *args)


def _config(args) -> dict:
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    return {k.removeprefix("--env."): v for k, v in pairs.items()}


def test_letter_counting_and_text_reversal(fake_server, tmp_path):
    groups = run_with_book(fake_server, tmp_path, "letter_counting", lambda i: f"<answer>{i['answer']}</answer>")
    assert len(groups) == 3 and all(g["scores"] == [1.0, 1.0] for g in groups)
    groups = run_with_book(fake_server, tmp_path, "text_reversal", lambda i: f"<answer>{i['answer']}</answer>")
    assert all(g["scores"] == [1.0, 1.0] for g in groups)
    assert groups[0]["meta"]["env"] == "text_reversal"


def test_gsm8k_and_math_on_local_files(fake_server, tmp_path):
    groups = run_with_book(
        fake_server, tmp_path, "gsm8k", lambda i: f"so \\boxed{{{i['answer']}}}", "--env.data_path",
        str(DATA / "gsm8k_tiny.jsonl"),
    )  # fmt: skip
    assert all(g["scores"] == [1.0, 1.0] for g in groups)
    groups = run_with_book(
        fake_server, tmp_path, "math", lambda i: f"\\boxed{{{i['answer']}}}", "--env.data_path",
        str(DATA / "math_tiny.jsonl"),
    )  # fmt: skip
    assert all(g["scores"] == [1.0, 1.0] for g in groups)


def test_tool_calling(fake_server, tmp_path):
    groups = run_with_book(
        fake_server, tmp_path, "tool_calling", lambda i: f"<tool_call>{json.dumps(i['expected'])}</tool_call>"
    )
    assert all(g["scores"] == [1.0, 1.0] for g in groups)
    assert groups[0]["messages"][0][0]["role"] == "system" and '"parameters"' in groups[0]["messages"][0][0]["content"]


def _any_sandbox() -> list[str]:
    """The code env's opt-in where bubblewrap cannot run (these tests judge solutions, not isolation)."""
    from atropos_cli.env.sandbox import isolation

    return [] if isolation() == "bwrap" else ["--env.allow_unisolated", "true"]


@pytest.mark.filterwarnings("ignore::atropos_cli.env.sandbox.SandboxWarning")  # the opt-in's line
def test_code_runs_solutions_in_the_sandbox(fake_server, tmp_path):
    from atropos_cli.envs._shared.data import BUNDLED_DATA

    rows = [json.loads(x) for x in (BUNDLED_DATA / "code_problems.jsonl").open()]
    reference = {r["text"]: r["code"] for r in rows}
    solve = lambda i: f"```python\n{reference[i['text']]}\n```"  # noqa: E731
    groups = run_with_book(fake_server, tmp_path, "code", solve, *_any_sandbox())
    assert all(g["scores"] == [1.0, 1.0] for g in groups)


@pytest.mark.filterwarnings("ignore::atropos_cli.env.sandbox.SandboxWarning")  # the opt-in's line
def test_code_infinite_loop_is_killed_and_scored_zero(fake_server, tmp_path):
    server = fake_server(rule=["while True:\n    pass"])
    groups = process("code", tmp_path / "loop", server.base_url, "--env.timeout_s", "1", *_any_sandbox(), groups=1)
    assert groups[0]["scores"] == [0.0, 0.0]
    assert groups[0]["meta"]["rollouts"][0]["reward_parts"]["timeout"] == 1.0


def test_reasoning_gym(fake_server, tmp_path):
    groups = run_with_book(
        fake_server, tmp_path, "reasoning_gym", lambda i: f"<answer>{i['entry']['answer']}</answer>",
        "--env.task", "basic_arithmetic",
    )  # fmt: skip
    assert all(g["scores"] == [1.0, 1.0] for g in groups)


def test_blackjack_plays_several_turns(fake_server, tmp_path):
    def policy(prompt: str, index: int) -> str:
        total = int(re.findall(r"total (\d+)", prompt)[-1])
        return "I will hit." if total < 17 else "stand"

    server = fake_server(rule=policy)
    groups = process("blackjack", tmp_path / "bj", server.base_url, groups=6)
    assert len(groups) == 6
    for group in groups:
        assert set(group["scores"]) <= {-1.0, 0.0, 1.0}
        assert group["scores"][0] == group["scores"][1]  # same deck, same deterministic policy
        chat = group["messages"][0]
        assert [m["role"] for m in chat[:3]] == ["system", "user", "assistant"]
    turns = [len([m for m in g["messages"][0] if m["role"] == "assistant"]) for g in groups]
    assert max(turns) >= 2  # some hands took more than one move


def test_judge_pointwise_saves_reasoning(fake_server, tmp_path):
    def rule(prompt: str, index: int) -> str:
        if "SCORE: N" in prompt:
            return f"Clear and kind.\nSCORE: {8 if 'long answer' in prompt else 3}"
        return "A long answer, carefully written." if index % 2 == 0 else "meh"

    server = fake_server(rule=rule)
    groups = process("judge", tmp_path / "judge", server.base_url, groups=2, group_size=2)
    assert len(groups) == 2
    for group in groups:
        assert sorted(group["scores"]) == [0.3, 0.8]
        judged = group["meta"]["judge"]
        assert len(judged) == 2 and all("Clear and kind." in j["reasoning"] for j in judged)


def test_judge_pairwise_and_unparseable_output_is_retried_then_recorded(fake_server, tmp_path):
    calls = {"n": 0}

    def pairwise(prompt: str, index: int) -> str:
        if "VERDICT" in prompt:
            calls["n"] += 1
            if calls["n"] == 1:
                return "I cannot decide."  # unparseable once: the retry gets a verdict
            a = prompt.split("Response A:\n")[1].split("\n")[0]
            return f"The first is better.\nVERDICT: {'A' if a.startswith('good') else 'B'}"
        return "good answer" if index % 2 == 0 else "bad answer"

    server = fake_server(rule=pairwise)
    groups = process("judge", tmp_path / "pair", server.base_url, "--env.mode", "pairwise", groups=1)
    assert sorted(groups[0]["scores"]) == [0.0, 1.0]
    assert groups[0]["meta"]["judge"][0]["verdict"] in ("A", "B")

    junk = fake_server(rule=lambda prompt, index: "no marker here" if "SCORE: N" in prompt else "an answer")
    out = tmp_path / "junk"
    result = runner.invoke(
        app, ["process", "judge", "--out", str(out), "--num-groups", "1", "--group-size", "2",
              "--openai.base_url", junk.base_url, "--env.judge_retries", "1"],
    )  # fmt: skip
    assert result.exit_code == 1 and "every group failed" in result.output
    failures = [json.loads(x) for x in (out / "failures.jsonl").read_text().splitlines()]
    assert {f["error_type"] for f in failures} == {"JudgeOutputError"}
    assert "after 2 tries" in failures[0]["error"] and failures[0]["rollout_index"] in (0, 1)


def test_a_reward_that_raises_is_a_recorded_failed_rollout(fake_server, tmp_path):
    env_file = tmp_path / "fragile.py"
    env_file.write_text(
        "from atropos_cli import SimpleEnv\n\n"
        "class Fragile(SimpleEnv):\n"
        "    name = 'fragile'\n"
        "    def items(self, split):\n"
        "        return iter([{'id': '0', 'q': 'What is 1 + 1?'}] * 5)\n"
        "    def prompt(self, item):\n"
        "        return item['q']\n"
        "    def reward(self, completion, item):\n"
        "        return 1.0 / (int(completion) - 2)\n"  # ZeroDivisionError on the right answer
    )
    server = fake_server(rule=["2", "3"])
    groups = process(str(env_file), tmp_path / "fragile", server.base_url, groups=1)
    assert groups[0]["scores"] == [1.0] and groups[0]["meta"]["failed_rollouts"] == 1
    failure = json.loads((tmp_path / "fragile" / "failures.jsonl").read_text().splitlines()[0])
    assert failure["error_type"] == "ZeroDivisionError" and "fragile.py" in failure["error"]
