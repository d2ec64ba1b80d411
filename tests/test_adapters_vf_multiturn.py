"""`vf:NAME` multi-turn: verifiers (0.4.0, v1) envs written in verifiers' own style (tests/vf_envs/) played
through verifiers' own episodes (the `null` harness program in the subprocess runtime, offline; MCP tool
servers; a custom env whose `run()` is a scripted user simulator; verifiers' `user-sim` env with a modeled
user), every model call sampled by our router from token ids. Run by `atropos process|train` in the vf
adapter's venv (ATROPOS_VF_PYTHON, built by .ci/run) as parallel subprocesses in one module fixture.

The policy is a real fake inference server (127.0.0.1) scripted from the prompt text, with a byte-level
tokenizer (tests/byte_tokenizer.py: token id = byte), so the test knows every id the server sampled and checks
that the trained tokens are exactly those, turn by turn, with the server's logprobs on them.

Opt-in (`-m slow`): verifiers' own `vf-eval` pointed at `atropos inference`, offline, in the subprocess runtime."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from adapter_cases import CASES, ROOT, groups, python_of, read_jsonl, run_commands
from byte_tokenizer import save_byte_tokenizer

SECRETS = [3, 7, 5, 9]  # vf_guess_user's tasks, in order
USER_OPENS = "Guess my number from 1 to 9."
DONE = "###DONE###"


def policy(prompt: str, index: int) -> str:
    """The scripted model, from the prompt text: call the add tool, then state its result; guess 5, then 7
    after "higher" and 3 after "lower"; as verifiers' modeled user, open with a request, then end."""
    if "role-playing a USER" in prompt:
        return DONE if prompt.count("<|user|>") >= 2 else USER_OPENS
    if prompt.startswith("<|system|>tools:"):
        results = re.findall(r"<\|tool\|>(-?\d+)<\|end\|>", prompt)
        if results:
            return f"The sum is {results[-1]}."
        name = re.search(r'"name": "(\w*add)"', prompt).group(1)  # type: ignore[union-attr]
        a, b = re.search(r"what is (\d+) \+ (\d+)\?", prompt).groups()  # type: ignore[union-attr]
        return f'<tool_call>{{"name": "{name}", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
    said = re.findall(r"<\|user\|>([^<]*)<\|end\|>", prompt)
    return {"higher": "7", "lower": "3"}.get(said[-1] if said else "", "5")


def played_guessing(secret: int) -> list[dict]:
    """The conversation after the prompt: vf_guess_user's env (at most 2 answers, "correct" ends it) and
    `policy` (5, then 7 after "higher", 3 after "lower", 5 otherwise)."""
    said, chat = "", []
    for answers in range(3):
        guess = {"higher": "7", "lower": "3"}.get(said, "5")
        chat.append({"role": "assistant", "content": guess})
        if answers == 2 or said == "correct":
            break
        said = "correct" if int(guess) == secret else "higher" if int(guess) < secret else "lower"
        chat.append({"role": "user", "content": said})
    return chat


def vf_eval_on_atropos_inference(case, tmp: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """verifiers' `vf-eval` (through `python -m atropos_cli.adapters.vf_eval`: harness programs offline) on
    vf_arithmetic, 2 tasks x 1 rollout with the `null` harness in the subprocess runtime, pointed at
    `atropos inference` serving the shipped model on 127.0.0.1."""
    import httpx

    from adapter_cases import run_env
    from atropos_cli.testing import free_port

    python, port = python_of(case), free_port()
    env = {**run_env(case), "PYTHONPATH": str(ROOT / "examples" / "verifiers"), "ATROPOS_TEST_KEY": "unused"}
    log = tmp / "inference.log"
    with log.open("w") as sink:
        server = subprocess.Popen(
            [python, "-m", "atropos_cli", "inference", "--port", str(port)], env=env, stdout=sink, stderr=sink
        )
    try:
        deadline, healthy = time.monotonic() + 300, False
        while not healthy and server.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(httpx.TransportError):
                healthy = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200
            if not healthy:
                time.sleep(0.5)  # polling a starting server (bounded by the deadline), not synchronisation
        assert healthy, f"atropos inference did not come up: {log.read_text()[-2000:]}"
        workdir = tmp / "vf-eval"
        workdir.mkdir()
        command = [python, "-m", "atropos_cli.adapters.vf_eval", "vf_arithmetic", "-m", "atropos-tiny-arith",
                   "--client.base-url", f"http://127.0.0.1:{port}/v1", "--client.api-key-var", "ATROPOS_TEST_KEY",
                   "-n", "2", "-r", "1", "--env.agent.runtime.type", "subprocess", "--env.agent.harness.id", "null",
                   "--sampling.max-tokens", "8", "--no-push"]  # fmt: skip
        done = subprocess.run(command, cwd=workdir, env=env, capture_output=True, text=True, timeout=600)
        return done, workdir
    finally:
        server.terminate()
        server.wait(timeout=60)


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    from atropos_cli.testing.fake_server import FakeInferenceServer

    case = dataclasses.replace(next(c for c in CASES if c.id == "vf"), pythonpath=(ROOT / "tests" / "vf_envs",))
    python_of(case)
    tmp = tmp_path_factory.mktemp("vfmt")
    tokenizer = save_byte_tokenizer(tmp / "byte-tokenizer")
    with FakeInferenceServer(rule=policy) as server:
        served = ["--base-url", server.base_url, "--openai.server_type", "vllm", "--env.tokenizer_name", str(tokenizer)]
        usersim = json.dumps({"id": "user-sim", "user": {"max_turns": 3}})
        commands = {
            "tools": ["process", "vf:vf_tool_add", "--out", str(tmp / "tools"), "--num-groups", "1", "--group-size",
                      "2", *served],
            "guess": ["process", "vf:vf_guess_user", "--out", str(tmp / "guess"), "--num-groups", "2", "--group-size",
                      "1", *served],
            "usersim": ["process", "vf:vf_guess_user", "--out", str(tmp / "usersim"), "--num-groups", "1",
                        "--group-size", "1", "--env.env_args", usersim, *served],
            "train": ["train", "vf:vf_guess_user", "--steps", "1", "--groups-per-step", "1", "--env.group_size", "2",
                      "--env.max_token_length", "6", "--out", str(tmp / "train")],
        }  # fmt: skip
        return tmp, run_commands(case, commands)


def trained_runs(tokens: list[int], masks: list[int]) -> list[list[int]]:
    """The trained (unmasked) spans of a rollout, in order: one per sampled turn."""
    runs: list[list[int]] = []
    previous = -100
    for token, mask in zip(tokens, masks, strict=True):
        if mask != -100:
            if previous == -100:
                runs.append([])
            runs[-1].append(token)
        previous = mask
    return runs


def assert_trained_exactly_sampled(group: dict, replies: list[list[str]]) -> None:
    """Each rollout's trained spans are the server's ids of its replies (one per turn, in order), the mask is
    the token itself there and -100 elsewhere, and the logprobs are the server's there and 1.0 elsewhere."""
    from atropos_cli.testing.fake_server import token_logprob

    assert len(group["tokens"]) == len(replies)
    for tokens, masks, logprobs, texts in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], replies, strict=True
    ):
        assert trained_runs(tokens, masks) == [list(text.encode()) for text in texts]
        assert all(m in (-100, t) for t, m in zip(tokens, masks, strict=True))
        for token, mask, logprob in zip(tokens, masks, logprobs, strict=True):
            assert logprob == (token_logprob(token) if mask != -100 else 1.0)


def test_a_toolset_task_plays_tool_calls_and_trains_exactly_the_sampled_tokens(ran):
    tmp, done = ran
    assert done["tools"].returncode == 0, done["tools"].stderr
    found = groups(tmp / "tools")
    assert len(found) == 1 and all(len(g["tokens"]) == 2 for g in found)
    for group in found:
        a, b = map(int, re.search(r"what is (\d+) \+ (\d+)\?", group["messages"][0][0]["content"]).groups())
        call = f'<tool_call>{{"name": "calc_add", "arguments": {{"a": {a}, "b": {b}}}}}</tool_call>'
        assert_trained_exactly_sampled(group, [[call, f"The sum is {a + b}."]] * 2)
        assert group["scores"] == [1.0, 1.0]  # the task's own reward read the final reply
        for messages, rollout in zip(group["messages"], group["meta"]["rollouts"], strict=True):
            assert [m["role"] for m in messages] == ["user", "assistant", "tool", "assistant"]
            arguments = f'{{"a": {a}, "b": {b}}}'
            assert messages[1]["tool_calls"][0]["function"] == {"name": "calc_add", "arguments": arguments}
            assert messages[2]["content"] == str(a + b)  # verifiers' MCP tool server answered
            assert rollout["reward_parts"] == {"score": 1.0, "correct": 1.0, "tool_calls": 1.0}
            assert rollout["turns"] == 2
        # The model saw the tools' schemas: the template rendered them into the first prompt.
        assert bytes(group["tokens"][0]).decode().startswith('<|system|>tools: [{"type": "function"')


def test_a_scripted_user_simulator_env_plays_several_turns(ran):
    tmp, done = ran
    assert done["guess"].returncode == 0, done["guess"].stderr
    found = groups(tmp / "guess")
    assert len(found) == 2
    for group in found:
        secret = SECRETS[int(group["meta"]["item_id"].rsplit("-", 1)[1])]
        for messages, rollout in zip(group["messages"], group["meta"]["rollouts"], strict=True):
            assert messages == [{"role": "user", "content": "I think of a number from 1 to 9. Guess it."},
                                *played_guessing(secret)]  # fmt: skip
            guesses = [m["content"] for m in messages if m["role"] == "assistant"]
            assert rollout["reward_parts"] == {
                "score": float(str(secret) in guesses), "solved": float(str(secret) in guesses),
                "guesses": float(len(guesses)),
            }  # fmt: skip
            assert rollout["turns"] == len(guesses) > 1
        assert_trained_exactly_sampled(
            group, [[m["content"] for m in messages if m["role"] == "assistant"] for messages in group["messages"]]
        )


def test_verifiers_user_sim_env_trains_the_assistant_not_the_modeled_user(ran):
    tmp, done = ran
    assert done["usersim"].returncode == 0, done["usersim"].stderr
    (group,) = groups(tmp / "usersim")
    (messages,) = group["messages"]
    # The user opened (the assistant's prompt is nulled: it learns the goal only from the user) and ended it.
    assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"][: len(messages)]
    assert messages[0]["content"] == USER_OPENS and messages[1]["content"] == "5"
    assert_trained_exactly_sampled(group, [[m["content"] for m in messages if m["role"] == "assistant"]])
    text = bytes(group["tokens"][0]).decode()
    assert "role-playing a USER" not in text and DONE not in text  # the user's own run is not trained
    assert group["meta"]["rollouts"][0]["reward_parts"]["guesses"] == 1.0


def test_train_runs_a_multi_turn_verifiers_env_on_the_shipped_model(ran):
    tmp, done = ran
    assert done["train"].returncode == 0, done["train"].stderr
    steps = read_jsonl(tmp / "train" / "metrics.jsonl")
    assert len([s for s in steps if "loss" in s]) == 1


@pytest.mark.slow  # its parts run in quick tests: streamed answers (test_inference_server), offline programs (above)
def test_vf_eval_runs_offline_on_atropos_inference_with_the_local_runtime(tmp_path):
    case = next(c for c in CASES if c.id == "vf")
    result, workdir = vf_eval_on_atropos_inference(case, tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (traces,) = workdir.glob("outputs/*/traces.jsonl")
    episodes = read_jsonl(traces)
    assert len(episodes) == 2 and all(e["ok"] and not e["errors"] for e in episodes)
    assert {e["task"]["data"]["idx"] for e in episodes} == {0, 1}
