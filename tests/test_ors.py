"""The Open Reward Standard both ways, against the real `openreward` 0.1.167 in its own venv (.ci/run builds it;
never our dependency; ATROPOS_ORS_PYTHON names its python).

In: `ors:guess_ors` serves tests/ors_envs/guess_ors.py (envs written in the SDK's style) with openreward's own
`Server` and plays its tasks with the shipped model (multi-turn through the terminal tool, tokens that train) or
a scripted model that calls a tool. Out: `atropos export ors` serves our envs; the SDK's own client drives it,
and reading it back through `ors:URL` gives the groups of a direct run. Local runs without the venv skip.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import httpx
import pytest

from adapter_cases import ORS_CASE, python_of, run_env
from served_envs import assert_faithful, assert_one_line_errors, process

ENVS = Path(__file__).parent / "ors_envs"
ATROPOS_FILE = str(Path(__file__).parent / "data" / "atropos_envs" / "math_n_choices.py")


@pytest.fixture(autouse=True)
def ors_venv(monkeypatch) -> str:
    """openreward's python (skip without it here; in CI, which builds it, its absence fails), and the test envs
    on the path of the servers `ors:guess_ors` starts."""
    python = python_of(ORS_CASE)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")]))
    return python


def test_a_module_of_ors_envs_plays_multi_turn_through_the_terminal_tool(tmp_path):
    groups = process(
        ["ors:guess_ors", "--num-groups", "2", "--group-size", "3", "--env.max_token_length", "8"], tmp_path / "run"
    )
    turns = []
    for group in groups:
        assert group["meta"]["env"] == "ors:guess_ors" and not group["meta"]["tokens_missing"]
        assert_faithful(group)
        for score, rollout, chat in zip(group["scores"], group["meta"]["rollouts"], group["messages"], strict=True):
            assert chat[0] == {"role": "user", "content": "Guess my number from 1 to 9. Reply with one digit."}
            parts, rewards = rollout["reward_parts"], rollout["step_rewards"]
            assert score == sum(rewards) == parts["reward:guess"] and set(rewards) <= {0.0, 1.0}
            assert parts["calls"] == parts["turns"] == len(rewards) <= 3 and not parts["truncated"]
            feedback = [m["content"] for m in chat[1:] if m["role"] == "user"]
            assert set(feedback) <= {"higher", "lower"} and len(feedback) == parts["turns"] - 1
            turns.append(parts["turns"])
    assert max(turns) > 1  # the env answered a wrong guess and the model tried again


def test_the_models_tool_calls_go_through_the_session_and_their_rewards_are_parts(tmp_path, fake_server):
    from atropos_cli.compat.tool_parsers import get_parser
    from atropos_cli.compat.tool_parsers.base import tool_call

    call_hint = get_parser("hermes").render(None, [tool_call(0, "hint", {})])

    def rule(last_user_message: str, index: int) -> str:  # the hint first, then guess 1, then 5 when told higher
        if last_user_message.startswith("Guess my number"):
            return call_hint
        return "5" if last_user_message == "higher" else "1"

    server = fake_server(rule=rule)
    flags = ["--num-groups", "2", "--group-size", "2", "--base-url", server.base_url, "--concurrency", "1"]
    groups = process(["ors:guess_ors:HintEnv", *flags], tmp_path / "run")
    by_index = {g["meta"]["index"]: g for g in groups}
    first, second = by_index[0], by_index[1]  # secrets 1 and 5 (tests/ors_envs/guess_ors.py)
    system = first["messages"][0][0]
    assert system["role"] == "system" and '"name": "hint"' in system["content"] and "<tool_call>" in system["content"]
    for rollout in first["meta"]["rollouts"]:
        assert rollout["step_rewards"] == [0.1, 1.0]
        assert rollout["reward_parts"]["reward:hint"] == 0.1 and rollout["reward_parts"]["reward:guess"] == 1.0
    assert first["scores"] == [pytest.approx(1.1)] * 2 and first["messages"][0][3]["content"] == "[tool hint] odd"
    for rollout in second["meta"]["rollouts"]:
        assert rollout["step_rewards"] == [0.1, 0.0, 1.0] and rollout["reward_parts"]["turns"] == 3


def test_bad_targets_are_one_line_errors(tmp_path):
    from atropos_cli.testing import free_port

    cases = {
        f"ors:http://127.0.0.1:{free_port()}": "cannot reach the ORS server",
        "ors:not-a-module!": "not a URL nor a Python module name",
        "ors:no_such_ors_module": "package 'no_such_ors_module' is not installed",
        "ors:guess_ors --env.python /no/such/python": "does not exist",
        "ors:guess_ors --env.tool_parser nope": "unknown tool-call parser 'nope'",
    }
    assert_one_line_errors(cases, tmp_path)


# ---- out: atropos export ors --------------------------------------------------------------------------------


class Exported(NamedTuple):
    url: str
    spec: str


@pytest.fixture
def exported(request) -> Iterator[Exported]:
    """`atropos export ors ENV` (the app the command serves) on a free port."""
    from atropos_cli.runs.openenv_export import build_exported_env
    from atropos_cli.runs.ors_app import create_ors_app
    from atropos_cli.testing.threaded import ThreadedServer

    spec, *flags = request.param
    key = "s3cret" if "--api-key" in flags else None
    flags = [f for f in flags if f != "--api-key"]
    app_ = create_ors_app(build_exported_env(spec, flags, None), api_key=key)
    with ThreadedServer(app_, lifespan="on").start() as server:
        yield Exported(server.url, spec)


SDK_CLIENT = """
import asyncio, json, os, sys
from openreward import AsyncOpenReward

async def play(url, name, key, replies):
    os.environ["OPENREWARD_API_KEY"] = key
    client = AsyncOpenReward()
    env = client.environments.get(name, base_url=url)
    out = {"splits": await env.list_splits(), "num": await env.num_tasks("train")}
    out["task"] = (await env.get_task("train", 2)).task_spec
    async with env.session(split="train", index=2) as session:
        out["prompt"] = [b.text for b in await session.get_prompt()]
        out["messages"] = [[m.role, [b.text for b in m.blocks]] for m in await session.get_messages()]
        out["tools"] = await session.list_tools()
        out["terminal"] = (await session.terminal_tool()).name
        out["results"] = []
        for reply in replies:
            result = await session.call_terminal_tool(reply)
            out["results"].append([[b.text for b in result.blocks], result.reward, result.finished, result.metadata])
            if result.finished:
                break
        try:
            await session.call_terminal_tool("again")
        except Exception as exc:
            out["after"] = f"{type(exc).__name__}: {exc}"
    await client.environments.aclose()
    return out

async def main(jobs):
    print(json.dumps([await play(**job) for job in jobs]))

asyncio.run(main(json.loads(sys.argv[1])))
"""


def sdk_client(python: str, *jobs: dict[str, Any]) -> list[Any]:
    """The SDK's client playing task 2 of each job's server ({url, name, key, replies}), in one process."""
    done = subprocess.run([python, "-c", SDK_CLIENT, json.dumps(jobs)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def job(url: str, name: str, *replies: str, key: str = "") -> dict[str, Any]:
    return {"url": url, "name": name, "key": key, "replies": list(replies)}


@pytest.mark.parametrize("exported", [("arithmetic", "--api-key", "--env.max_token_length", "16")], indirect=True)
def test_the_sdks_client_drives_exported_envs(exported, ors_venv):
    """A task of a single-turn env (behind an API key: the SDK sends OPENREWARD_API_KEY), of a multi-turn env and
    of an Atropos env file, each played to its end by the SDK's own client."""
    from atropos_cli.runs.openenv_export import build_exported_env
    from atropos_cli.runs.ors_app import create_ors_app
    from atropos_cli.testing.threaded import ThreadedServer

    blackjack = create_ors_app(build_exported_env("blackjack", ["--env.max_turns", "3"], None))
    tokenizer = ["--env.tokenizer_name", "atropos-tiny-arith"]
    atropos_file = create_ors_app(build_exported_env(ATROPOS_FILE, tokenizer, None))
    with (
        ThreadedServer(blackjack, lifespan="on").start() as other,
        ThreadedServer(atropos_file, lifespan="on").start() as third,
    ):
        name = httpx.get(third.url + "/list_environments").json()[0]
        single, multi, ported = sdk_client(
            ors_venv,
            job(exported.url, "arithmetic", "The answer is 5", key="s3cret"),
            job(other.url, "blackjack", "hit", "hit", "stand", "stand"),
            job(third.url, name, "4"),
        )
    assert single["splits"] == ["train", "eval"] and single["num"] == 1000
    assert single["task"] == {"split": "train", "index": 2, "item_id": "train-2"}
    assert single["prompt"][0].startswith("What is") and single["messages"] == [["user", single["prompt"]]]
    assert single["tools"] == [] and single["terminal"] == "reply"  # the plain message is the answer
    [(blocks, reward, finished, metadata)] = single["results"]
    assert finished and reward in (0.0, 1.0) and blocks == []
    assert metadata["item_id"] == "train-2" and metadata["reward_parts"]["correct"] == reward
    assert single["after"].startswith("ToolCallError: episode_finished")
    *middle, (_, reward, finished, metadata) = multi["results"]
    assert finished and reward in (-1.0, 0.0, 1.0) and "reward_parts" in metadata
    assert all(not f and r == 0.0 and text for text, r, f, _ in middle)  # the env's next request, as text
    assert "blackjack" in multi["messages"][0][1][0].lower()
    assert ported["messages"][0][1][0].startswith("You are a calculator")  # an Atropos env file, its own rule:
    assert ported["results"][0][2] and ported["results"][0][1] in (-1.0, 1.0)


ROUND_TRIP = ("arithmetic", "--env.max_token_length", "16", "--env.seed", "7")


@pytest.mark.parametrize("sessions", ["1", "4"])  # one rollout at a time, or the whole group at once
@pytest.mark.parametrize("exported", [ROUND_TRIP], indirect=True)
def test_round_trip_gives_the_groups_of_a_direct_run(exported, sessions, tmp_path):
    flags = ["--num-groups", "4", "--group-size", "4", "--seed", "7", "--env.max_token_length", "16"]
    flags += ["--concurrency", "1"]  # one group per batch: float bits that depend on batching cannot flip a sample
    direct = process([exported.spec, *flags], tmp_path / "direct")
    back = process([f"ors:{exported.url}", *flags, "--env.max_sessions", sessions], tmp_path / "back")
    direct.sort(key=lambda g: g["meta"]["index"])
    back.sort(key=lambda g: g["meta"]["index"])
    assert len(direct) == len(back) == 4
    assert len({m[-1]["content"] for g in direct for m in g["messages"]}) > 2  # real samples, not one answer
    for a, b in zip(direct, back, strict=True):
        for key in ("tokens", "masks", "scores", "messages"):
            assert a[key] == b[key], key
        parts = [r["reward_parts"] for r in b["meta"]["rollouts"]]
        assert [p["reward:reply"] for p in parts] == a["scores"]  # the score came back as the reply's reward


@pytest.mark.parametrize("exported", [("arithmetic", "--api-key", "--env.max_token_length", "16")], indirect=True)
def test_export_is_guarded_like_our_other_servers(exported, tmp_path, monkeypatch):
    assert httpx.get(exported.url + "/list_environments").status_code == 401
    keyed = {"X-API-Key": "s3cret"}
    assert httpx.get(exported.url + "/list_environments", headers=keyed).json() == ["arithmetic"]
    cross = {**keyed, "Sec-Fetch-Site": "cross-site"}
    assert httpx.post(exported.url + "/create_session", headers=cross).status_code == 403
    call = httpx.post(exported.url + "/call", headers={**keyed, "X-Session-ID": "nope"}, json={"name": "reply"})
    assert call.status_code == 404  # no such session
    monkeypatch.setenv("OPENREWARD_API_KEY", "s3cret")  # what our adapter sends
    assert len(process([f"ors:{exported.url}", "--num-groups", "1", "--group-size", "2"], tmp_path / "b")) == 1


def test_export_ors_command_serves_until_interrupted():
    import signal

    from atropos_cli.testing import free_port
    from served_envs import wait_for_export

    port = free_port()
    cmd = [sys.executable, "-m", "atropos_cli", "export", "ors", "arithmetic", "--port", str(port)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=run_env(ORS_CASE))
    try:
        wait_for_export(server, port)
        assert httpx.get(f"http://127.0.0.1:{port}/list_environments").json() == ["arithmetic"]
    finally:
        server.send_signal(signal.SIGINT)
        stdout, err = server.communicate(timeout=60)
    assert server.returncode == 130, err.decode()[-2000:]
    assert b"serving arithmetic as an ORS env on" in stdout and b"Traceback" not in err


OTHER_FRAMEWORK_PLAY = """
import asyncio, json, sys, urllib.request
from openreward import AsyncOpenReward

async def main(url, game):
    name = json.load(urllib.request.urlopen(url + "/list_environments"))[0]
    client = AsyncOpenReward(api_key="")
    async with client.environments.get(name, base_url=url).session(split="train", index=0) as session:
        prompt = " ".join(block.text for block in await session.get_prompt())
        print(prompt.replace("\\n", " "))
        if game in ("gym", "openenv"):  # bisect: the game says lower/higher until the guess is right
            low, high = 1, 16 if game == "gym" else 9
            for _ in range(8):
                guess = (low + high) // 2
                result = await session.call_terminal_tool(str(guess))
                if result.finished:
                    break
                said = " ".join(block.text for block in result.blocks).lower()
                low, high = (low, guess - 1) if "lower" in said else (guess + 1, high)
        else:
            result = await session.call_terminal_tool(prompt.rsplit(" ", 1)[-1][::-1])
        print(result.reward, result.finished)
    await client.environments.aclose()

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""

OTHER_FRAMEWORKS = {  # case id: (its first prompt, the reward of a right answer)
    "gym": ("I picked a number from 1 to 16", 1.0),
    "vf": ("Reverse the word:", 1.5),  # vf_reverse_text: exact 1.0 + overlap 0.5 (its reward weights)
    "openenv": ("I picked a number from 1 to 9", 1.0),  # tests/openenv_envs/guess_env, served from its package
}


@pytest.mark.parametrize("case_id", list(OTHER_FRAMEWORKS))
def test_an_env_of_another_framework_exported_plays_through_the_sdks_client(case_id, ors_venv):
    """`atropos export ors gym:...|vf:...|openenv:...` (the adapter's env, in its framework's venv): the SDK's
    client plays a task to the end and gets the framework's reward."""
    from adapter_cases import CASES, atropos_python
    from atropos_cli.testing import free_port
    from served_envs import wait_for_export

    case = next(c for c in CASES if c.id == case_id)
    first, reward = OTHER_FRAMEWORKS[case_id]
    port = free_port()
    cmd = [atropos_python(case), "-m", "atropos_cli", "export", "ors", case.spec, "--port", str(port)]
    server = subprocess.Popen(cmd, env=run_env(case), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_export(server, port)
        url = f"http://127.0.0.1:{port}"
        done = subprocess.run([ors_venv, "-c", OTHER_FRAMEWORK_PLAY, url, case_id], capture_output=True, text=True)
    finally:
        server.terminate()
        server.communicate(timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    prompt, result = done.stdout.strip().splitlines()
    assert first in prompt and result == f"{reward} True"


def test_a_session_still_starting_is_asked_again_after_its_retry_after():
    """ORS servers answer 503 + `X-Backend-State: starting` while a session's setup() runs (a sandbox starting):
    our client waits the server's Retry-After and asks again; any other 503 is an answer."""
    from atropos_cli.adapters.ors.wire import _starting_wait

    starting = httpx.Response(503, headers={"X-Backend-State": "starting", "Retry-After": "2"})
    assert 2.0 <= (_starting_wait(starting, 0) or 0) <= 2.2
    assert _starting_wait(httpx.Response(503, headers={"Retry-After": "2"}), 0) is None
    assert _starting_wait(httpx.Response(200), 0) is None
