"""The tool_agent env: its tools, its reward, and multi-turn runs through `atropos process`.

Scripted policies play against a real fake inference server (HTTP on 127.0.0.1): one solves each question with
the tools over several turns (reading the values from the tool results in its prompt), others answer wrong,
answer blind, write malformed calls or recover from bad ones. The token test uses the byte-level tokenizer of
tests/byte_tokenizer.py, whose ids equal the fake server's, so the prompts the env sends as token ids can be
checked on the server side. The last runs use the shipped tiny model (256 positions).
"""

from __future__ import annotations

import itertools
import json
import re
import sys

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.env.registry import resolve_env
from byte_tokenizer import save_byte_tokenizer

runner = CliRunner()
RESULT = re.compile(r"<\|(?:tool|user)\|>(\{.*?\})(?:<\|end\|>|\n)")
QUESTION = re.compile(r"<\|user\|>(.*?)(?:<\|end\|>|\n)")
BEHAVIOURS = ("solve", "parallel", "wrong", "blind", "malformed", "recover")
# one group per behaviour; 256 tokens a reply hold two calls
SCRIPTED = ("--num-groups", str(len(BEHAVIOURS)), "--group-size", "2", "--env.max_turns", "8",
            "--env.max_token_length", "256")  # fmt: skip
# behaviour -> (score, parts) with --env.max_turns 8 and 2 towns a question
EXPECTED = {
    "solve": (1.0, {"correct": 1, "found": 1, "calls": 3, "bad_calls": 0, "wasted": 0, "turns": 4, "answered": 1}),
    "parallel": (1.0, {"correct": 1, "found": 1, "calls": 2, "bad_calls": 0, "wasted": 0, "turns": 2}),
    "wrong": (0.2, {"correct": 0, "found": 1, "calls": 2, "wasted": 0, "turns": 3, "answered": 1}),
    "blind": (0.0, {"correct": 0, "found": 0, "calls": 0, "wasted": 0, "turns": 1, "answered": 1}),
    "malformed": (-0.8, {"correct": 0, "calls": 0, "bad_calls": 8, "wasted": 8, "turns": 8, "answered": 0}),
    "recover": (0.7, {"correct": 1, "found": 1, "calls": 3, "bad_calls": 2, "wasted": 3, "turns": 7}),
}


def module():
    resolve_env("tool_agent")
    return sys.modules["atropos_cli.envs.tool_agent"]


def call(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def solve(prompt: str, item: dict, turn: int) -> str:
    """Look each town up (one a turn), then the calculator over the looked-up values, then its result."""
    results = [json.loads(r) for r in RESULT.findall(prompt)]
    records = {r["town"]: r for r in results if "town" in r}
    todo = [t for t in item["towns"] if t not in records]
    if todo:
        return call("lookup", town=todo[0].lower())  # names match case-insensitively
    calculated = [r["result"] for r in results if "result" in r]
    if calculated:
        return f"The answer: <answer>{calculated[-1]:,}</answer>"
    values = [f"{records[t][item['field']]:,}" for t in item["towns"]]
    return call("calculator", expression=(" + " if item["op"] == "sum" else " - ").join(values))


def policy(behaviour: str, prompt: str, item: dict, turn: int) -> str:
    if behaviour == "solve":
        return solve(prompt, item, turn)
    if behaviour == "parallel":  # both lookups in one reply, then the answer worked out without the calculator
        records = [json.loads(r) for r in RESULT.findall(prompt)]
        if not records:
            return "".join(call("lookup", town=t) for t in item["towns"])
        values = [r[item["field"]] for r in records]
        return f"<answer>{sum(values) if item['op'] == 'sum' else values[0] - values[1]}</answer>"
    if behaviour == "wrong":
        reply = solve(prompt, item, turn)
        return f"<answer>{item['answer'] + 1}</answer>" if "calculator" in reply else reply
    if behaviour == "blind":
        return f"<answer>{item['answer'] + 7}</answer>"
    if behaviour == "malformed":
        return '<tool_call>{"name": "lookup", "arguments": </tool_call>'
    # recover: an unknown tool, an unknown town, plain text, then the solution
    return (
        [call("search", query="towns"), call("lookup", town="Atlantis"), "Let me think."][turn]
        if turn < 3
        else (solve(prompt, item, turn))
    )


def scripted_server(fake_server, prompts: list[str], **server):
    env_cls = resolve_env("tool_agent")
    base, _ = env_cls.config_init()
    items = itertools.islice(env_cls(base, server=None).items("train"), len(BEHAVIOURS))
    book = {item["question"]: (behaviour, item) for behaviour, item in zip(BEHAVIOURS, items, strict=True)}

    def rule(prompt: str, index: int) -> str:
        prompts.append(prompt)
        behaviour, item = book[QUESTION.search(prompt).group(1)]
        return policy(behaviour, prompt, item, prompt.count("<|assistant|>") - 1)

    return fake_server(rule=rule, **server), book


def process(out, *args: str) -> list[dict]:
    result = runner.invoke(app, ["process", "tool_agent", "--out", str(out), *args])
    assert result.exit_code == 0, result.output
    return [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]


def check_rewards(groups: list[dict], book: dict) -> None:
    assert len(groups) == len(BEHAVIOURS)
    for group in groups:
        behaviour, _ = book[group["messages"][0][1]["content"]]
        score, parts = EXPECTED[behaviour]
        assert group["scores"] == [score, score], behaviour
        for rollout in group["meta"]["rollouts"]:
            got = rollout["reward_parts"]
            assert {k: got[k] for k in parts} == pytest.approx(parts), behaviour


def test_calculator_and_tools():
    ta = module()
    assert ta.calculate("48,213 + 1,000") == 49213 and ta.calculate("(3 + 4) * -2") == -14
    assert ta.calculate("7 / 2") == 3.5 and ta.calculate("10 / 4 * 2") == 5
    for bad in ("__import__('os')", "2 ** 10", "1 / 0", "9" * 16 + " * 9", "x + 1", "1 +", "1" * 201):
        with pytest.raises(ValueError):
            ta.calculate(bad)
    records = {"Brakel": {"town": "Brakel", "population": 5}}
    assert ta.run_tool({"name": "lookup", "arguments": {"town": " brakel "}}, records) == (records["Brakel"], "Brakel")
    for bad_call in (
        {"name": "lookup", "arguments": {"town": "Oslo"}},
        {"name": "lookup", "arguments": {"name": "Brakel"}},
        {"name": "calculator", "arguments": {"expression": 3}},
        {"name": "search", "arguments": {}},
    ):
        result, town = ta.run_tool(bad_call, records)
        assert set(result) == {"error"} and town is None
    from atropos_cli.envs._shared.tools import parse_calls

    two = call("lookup", town="A") + '<tool_call>{"name": </tool_call>' + call("calculator", expression="1+1")
    assert [c["name"] for c in parse_calls(two)[0]] == ["lookup", "calculator"] and parse_calls(two)[1] == 1
    assert parse_calls('<tool_call>{"name": "lookup", "argu') == ([], 1)
    assert parse_calls("<answer>3</answer>") == ([], 0)


def test_questions_are_seeded_and_answered_by_their_records():
    ta = module()
    env_cls = resolve_env("tool_agent")
    base, _ = env_cls.config_init()
    for facts in (2, 3, 4):
        env = env_cls(base.model_copy(update={"facts": facts}), server=None)
        for item in itertools.islice(env.items("train"), 20):
            values = [item["records"][t][item["field"]] for t in item["towns"]]
            want = sum(values) if item["op"] == "sum" else values[0] - values[1]
            assert item["answer"] == want and len(item["towns"]) == facts and want >= 0
            assert all(t in item["question"] for t in item["towns"])
        again = env_cls(base.model_copy(update={"facts": facts}), server=None)
        assert next(iter(env.items("eval"))) == next(iter(again.items("eval")))
        assert next(iter(env.items("eval")))["question"] != next(iter(env.items("train")))["question"]
    assert ta.make_question(__import__("random").Random(1), 2)["op"] in ("sum", "difference")


def test_scripted_policies_get_the_documented_rewards_with_exact_tokens(fake_server, tmp_path):
    prompts: list[str] = []
    server, book = scripted_server(fake_server, prompts)
    tokenizer = save_byte_tokenizer(tmp_path / "tok")
    groups = process(
        tmp_path / "run", *SCRIPTED,
        "--openai.base_url", server.base_url, "--openai.server_type", "vllm", "--env.tokenizer_name", str(tokenizer),
    )  # fmt: skip
    check_rewards(groups, book)
    for group in groups:
        assert not group["meta"]["tokens_missing"]
        for tokens, masks, logprobs, chat in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], group["messages"], strict=True
        ):
            replies = [m["content"] for m in chat if m["role"] == "assistant"]
            # masks only on the model's turns: the trained ids are exactly the replies' bytes, in order
            trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
            assert bytes(trained).decode() == "".join(replies)
            for t, m, lp in zip(tokens, masks, logprobs, strict=True):
                assert lp == (1.0 if m == -100 else -round(0.05 + (t % 13) / 10, 4))
            # tool results are in the tokens, masked (every result but those after the last reply)
            masked = bytes(t for t, m in zip(tokens, masks, strict=True) if m == -100).decode()
            last = max(i for i, m in enumerate(chat) if m["role"] == "assistant")
            sent = [m["content"] for m in chat[:last] if m["role"] in ("tool", "user")]
            assert all(s in masked for s in sent)
            assert any(m["role"] == "tool" for m in chat) == (group["scores"][0] not in (0.0, -0.8))
            # the tokens are the last prompt sent plus the last reply; every earlier prompt is a prefix
            text = bytes(tokens).decode()
            assert text.removesuffix(replies[-1]) in prompts
            assert len({p for p in prompts if text.startswith(p)}) == len(replies)


def test_chat_only_backend_plays_the_same_rollouts(fake_server, tmp_path):
    server, book = scripted_server(fake_server, [], whole_chat=True)
    groups = process(
        tmp_path / "chat", *SCRIPTED,
        "--env.result_role", "user", "--env.system_prompt", "Use the tools.", "--openai.base_url", server.base_url,
    )  # fmt: skip
    check_rewards(groups, book)
    assert {chat[0]["content"] for g in groups for chat in g["messages"]} == {"Use the tools."}
    assert all(g["meta"]["tokens_missing"] and not g["tokens"] for g in groups)
    roles = {m["role"] for g in groups for chat in g["messages"] for m in chat}
    assert roles == {"system", "user", "assistant"}  # --env.result_role user: no tool messages


def test_a_rollout_ends_before_the_context_is_full(fake_server, tmp_path):
    server = fake_server(rule=lambda prompt, index: "Let me think about it.")
    groups = process(
        tmp_path / "ctx", "--num-groups", "2", "--group-size", "2", "--env.max_context", "400",
        "--env.max_token_length", "30", "--openai.base_url", server.base_url, "--openai.server_type", "vllm",
        "--env.tokenizer_name", str(save_byte_tokenizer(tmp_path / "tok")),
    )  # fmt: skip
    for group in groups:
        assert all(len(tokens) <= 400 for tokens in group["tokens"])
        for rollout in group["meta"]["rollouts"]:
            parts = rollout["reward_parts"]
            assert parts["context_full"] == 1 and 1 < parts["turns"] < 6 and parts["answered"] == 0


def test_shipped_model_plays_two_turns_in_its_256_positions(tmp_path):
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import shipped_models

    if "atropos-tiny-arith" not in shipped_models():
        pytest.skip("the shipped model is not built here")
    groups = process(tmp_path / "tiny", "--num-groups", "2", "--group-size", "2")
    tokenizer = load_tokenizer("atropos-tiny-arith")
    for group in groups:
        for tokens, masks, logprobs, chat in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], group["messages"], strict=True
        ):
            assert len(tokens) <= 256
            trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
            replies = "".join(m["content"] for m in chat if m["role"] == "assistant")
            assert tokenizer.decode(trained, skip_special_tokens=True) == replies
            assert all(lp < 0 for lp, m in zip(logprobs, masks, strict=True) if m != -100)
        assert all(r["reward_parts"]["turns"] >= 2 for r in group["meta"]["rollouts"])


def test_train_one_step_on_the_shipped_model(tmp_path):
    out = tmp_path / "train"
    result = runner.invoke(
        app, ["train", "tool_agent", "--out", str(out), "--steps", "1", "--groups-per-step", "2", "--device", "cpu",
              "--env.group_size", "2", "--save-every", "0"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    (step,) = metrics
    assert step["reward_mean"] < 0  # the tiny model answers with bare numbers: wasted turns
    assert step["truncated"] == 0 and abs(step["logprob_gap"]) < 1e-3  # the trained tokens are the sampled ones


@pytest.mark.parametrize(
    ("flag", "value"), [("max_turns", "0"), ("facts", "5"), ("result_role", "bot"), ("max_context", "8")]
)
def test_bad_env_values_are_one_line_errors(tmp_path, flag, value):
    result = runner.invoke(app, ["process", "tool_agent", "--out", str(tmp_path / "bad"), f"--env.{flag}", value])
    assert result.exit_code == 2
    errors = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"env.{flag}" in errors[0] and "Traceback" not in result.output
