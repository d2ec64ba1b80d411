"""`nemogym:` against real NeMo Gym resources servers (nemo-gym 0.7.0 in its own venv, .ci/run builds it; never
our dependency): a server written in NeMo Gym's style (tests/nemogym_envs/sum_tool: a per-session `add` tool and
a multi-reward verify) and one NeMo Gym ships (example_single_tool_call), each started from its folder on a free
port of 127.0.0.1 and stopped after. The policy is the shipped model, or a scripted OpenAI-compatible fake where
a test needs tool calls (the tiny model never writes one). Local runs without ATROPOS_NEMOGYM_PYTHON skip.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from adapter_cases import NEMOGYM_CASE, python_of
from atropos_cli.cli.app import app
from atropos_cli.testing import FakeInferenceServer, free_port
from atropos_cli.tokens import MASKED
from served_envs import assert_one_line_errors

SUM_TOOL = Path(__file__).parent / "nemogym_envs" / "sum_tool"
TASKS = SUM_TOOL / "data" / "example.jsonl"
CALL = '<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


def process(args: list[str], out: Path) -> list[dict[str, Any]]:
    """`atropos process ...` through our Typer app in this process; the groups it wrote."""
    result = CliRunner().invoke(app, ["process", *args, "--out", str(out)])
    assert result.exit_code == 0, result.output[-3000:]
    return [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]


def sum_agent(prompt: str, index: int) -> str:
    """A scripted policy: asks the add tool for the task's sum, then answers with the tool's result."""
    if "<|tool|>" in prompt:
        return re.findall(r'"sum":\s*(-?\d+)', prompt)[-1]
    question = re.search(r"What is (\d+) \+ (\d+)\?", prompt)
    assert question, prompt
    a, b = question.groups()
    return CALL.format(name="add", arguments=json.dumps({"a": int(a), "b": int(b)}))


async def one_group(spec: str, dotted: list[str]) -> tuple[Any, Any]:
    """Load SPEC as `process` does, collect item 0's group; (the outcome, the env, its server stopped)."""
    from atropos_cli.env.loading import load_env
    from atropos_cli.runs.rollout import collect_group

    loaded = load_env(spec, dotted, None, mode="process")
    try:
        await loaded.env.setup()
        outcome = await collect_group(loaded.env, await loaded.env.get_next_item(), index=0)
    finally:
        await loaded.env.server.aclose()
        server = getattr(loaded.env, "_server", None)
        if server is not None:
            server.stop()
    return outcome, loaded.env


@pytest.fixture(autouse=True)
def nemogym_venv() -> None:
    """Skip without nemo-gym's venv here; in CI (which builds it) its absence fails."""
    python_of(NEMOGYM_CASE)


@pytest.fixture(scope="module")
def sum_tool_url() -> Iterator[str]:
    """The sum_tool server, started once from its folder (as `nemogym:DIR` starts it), for `nemogym:URL` runs."""
    from atropos_cli.adapters.nemogym.server import ResourcesServer, find_folder

    server = ResourcesServer(find_folder(str(SUM_TOOL), None), python_of(NEMOGYM_CASE))
    yield server.start(timeout_s=120)
    server.stop()
    assert server.process.poll() is not None


def test_tool_calls_run_in_the_rollouts_own_session(sum_tool_url):
    with FakeInferenceServer(rule=sum_agent, whole_chat=True) as fake:
        dotted = ["--openai.base_url", fake.base_url, "--openai.model_name", "fake-model", "--env.group_size", "3",
                  "--env.dataset", str(TASKS)]  # fmt: skip
        outcome, _ = asyncio.run(one_group(f"nemogym:{sum_tool_url}", dotted))
    (group,) = outcome.groups
    assert group.scores == [1.0, 1.0, 1.0]  # the answer is the tool's sum, verified in the session that added
    for parts in (r.reward_parts for r in group.meta.rollouts):
        assert parts == {"reward": 1.0, "answered": 1.0, "used_tool": 1.0, "turns": 2.0, "tool_calls": 1.0,
                         "complete": 1.0}  # fmt: skip
    chat = group.messages[0]
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(chat[2]["content"]) == {"sum": 7} and chat[3]["content"] == "7"


def test_multi_turn_tokens_are_the_backends_own(sum_tool_url):
    """Sent as token ids turn after turn: each request extends the last, trained tokens are exactly the ids the
    backend returned (the fake's ids are bytes; the template's bridges between them come from the tiny model's
    tokenizer), and the last turn's tool calls still run (NeMo Gym's agent runs them, then stops)."""
    from atropos_cli.adapters.nemogym.wire import chat_tools
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import DEFAULT_MODEL
    from atropos_cli.tokens import chat_prompt_ids

    call = CALL.format(name="add", arguments='{"a": 1, "b": 2}')
    with FakeInferenceServer(rule=[call]) as fake:
        dotted = ["--openai.base_url", fake.base_url, "--openai.model_name", "fake-model", "--openai.server_type",
                  "vllm", "--env.tokenizer_name", str(DEFAULT_MODEL), "--env.max_turns", "2", "--env.group_size",
                  "2", "--env.max_token_length", "128", "--env.dataset", str(TASKS)]  # fmt: skip
        outcome, _ = asyncio.run(one_group(f"nemogym:{sum_tool_url}", dotted))
    (group,) = outcome.groups
    assert group.scores == [0.0, 0.0]  # never answered
    ids = list(call.encode())
    row = json.loads(TASKS.read_text().splitlines()[0])
    tools = chat_tools(row["responses_create_params"])
    first = chat_prompt_ids(load_tokenizer(str(DEFAULT_MODEL)), group.messages[0][:1], tools)
    for tokens, masks, rollout in zip(group.tokens, group.masks, group.meta.rollouts, strict=True):
        trained = [t for t, m in zip(tokens, masks, strict=True) if m != MASKED]
        assert tokens[: len(first) + len(ids)] == first + ids and tokens[-len(ids) :] == ids
        assert trained == ids + ids and masks[: len(first)] == [MASKED] * len(first)
        assert rollout.reward_parts["turns"] == 2.0 and rollout.reward_parts["tool_calls"] == 2.0
        assert rollout.reward_parts["complete"] == 0.0


def test_process_on_the_shipped_model_scores_with_the_servers_verify(sum_tool_url, tmp_path):
    """`atropos process` end to end (the battery runs the folder form, `nemogym:DIR`, the same way)."""
    groups = process([f"nemogym:{sum_tool_url}", "--env.dataset", str(TASKS), "--num-groups", "2", "--group-size",
                      "2", "--env.max_token_length", "8"], tmp_path / "run")  # fmt: skip
    assert len(groups) == 2
    for group in groups:
        assert group["meta"]["env"] == f"nemogym:{sum_tool_url}" and group["tokens"]
        for tokens, masks, rollout in zip(group["tokens"], group["masks"], group["meta"]["rollouts"], strict=True):
            assert any(m != MASKED for m in masks) and all(m in (MASKED, t) for t, m in zip(tokens, masks, strict=True))
            assert set(rollout["reward_parts"]) >= {"reward", "answered", "used_tool", "turns"}
        assert group["scores"] == [r["reward_parts"]["answered"] for r in group["meta"]["rollouts"]]


def test_a_server_nemo_gym_ships_is_scored_by_its_own_verify():
    """`nemogym:example_single_tool_call`: NeMo Gym's own example server and rows, found in its install."""
    call = CALL.format(name="get_weather", arguments='{"city": "San Francisco"}')
    weather = lambda prompt, i: call if "<|tool|>" not in prompt else "It is cold."  # noqa: E731
    with FakeInferenceServer(rule=weather, whole_chat=True) as fake:
        dotted = ["--openai.base_url", fake.base_url, "--openai.model_name", "fake-model", "--env.group_size", "2"]
        outcome, env = asyncio.run(one_group("nemogym:example_single_tool_call", dotted))
    assert env._server.process.poll() is not None  # the server it started is stopped
    (group,) = outcome.groups
    assert group.scores == [1.0, 1.0]  # its verify: the response called get_weather
    assert "cold" in group.messages[0][3]["content"]  # the server's own tool answered


def test_bad_targets_and_rows_are_one_line_errors(tmp_path):
    bad_rows = tmp_path / "rows.jsonl"
    bad_rows.write_text('{"input": "no responses_create_params"}\n')
    cases = {
        "nemogym:": "names no nemogym env",
        f"nemogym:{tmp_path}/nowhere": "no such folder",
        "nemogym:no_such_server_anywhere": "not a folder, nor a resources server",
        f"nemogym:{SUM_TOOL} --env.python /no/such/python": "no Python with nemo-gym",
        "nemogym:http://127.0.0.1:9": "needs its task rows",
        f"nemogym:http://127.0.0.1:{free_port()} --env.dataset {TASKS}": "cannot reach the NeMo Gym resources server",
        f"nemogym:{SUM_TOOL} --env.dataset {bad_rows}": "rows.jsonl:1: a task row needs a responses_create_params",
        f"nemogym:{SUM_TOOL} --env.tool_parser nope": "nope",
    }
    assert_one_line_errors(cases, tmp_path)
