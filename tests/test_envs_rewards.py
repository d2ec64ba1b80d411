"""Reward tests for the bundled single-turn envs, on hand-written completions (no server needed)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from atropos_cli.env.registry import list_envs, resolve_env
from atropos_cli.errors import ConfigError

DATA = Path(__file__).parent / "data"


def make_env(name: str, **config):
    cls = resolve_env(name)
    base, _ = cls.config_init()
    return cls(base.model_copy(update=config), server=None)


def first(env, split="eval", n=1):
    return list(itertools.islice(env.items(split), n))


def score(env, completion, item):
    value = env.reward(completion, item)
    return value["score"] if isinstance(value, dict) else value


def test_catalogue_lists_every_bundled_env_with_a_description():
    infos = {i.name: i.description for i in list_envs()}
    for name in ("arithmetic", "letter_counting", "text_reversal", "gsm8k", "math", "tool_calling",
                 "code", "reasoning_gym", "blackjack", "tool_agent", "judge"):  # fmt: skip
        assert name in infos, f"{name} missing from `atropos envs`"
        assert infos[name] and not infos[name].startswith("(cannot load"), infos[name]


@pytest.mark.parametrize("name", ["letter_counting", "text_reversal", "tool_calling", "tool_agent", "reasoning_gym"])
def test_procedural_items_are_seeded_and_eval_differs_from_train(name):
    spec = name
    a, b = make_env(spec, seed=3), make_env(spec, seed=3)
    assert json.dumps(first(a, "train", 5), default=str) == json.dumps(first(b, "train", 5), default=str)
    other = make_env(spec, seed=4)
    assert json.dumps(first(a, "train", 5), default=str) != json.dumps(first(other, "train", 5), default=str)
    assert json.dumps(first(a, "train", 5), default=str) != json.dumps(first(a, "eval", 5), default=str)


def test_letter_counting_reward():
    env = make_env("letter_counting")
    item = {"id": "x", "text": "strawberry", "letter": "r", "answer": 3}
    assert env.reward("There are <answer>3</answer> r's.", item) == {"score": 1.0, "correct": 1.0, "tagged": 1.0}
    assert score(env, "I count 3", item) == 1.0
    assert score(env, "<answer>2</answer> though 3 is tempting", item) == 0.0
    assert score(env, "no idea", item) == 0.0
    for item in first(env, "eval", 20):
        assert item["text"].count(item["letter"]) == item["answer"]


def test_text_reversal_reward():
    env = make_env("text_reversal")
    item = {"id": "x", "text": "red fox", "answer": "xof der"}
    assert score(env, "<answer>xof der</answer>", item) == 1.0
    assert score(env, "  xof der\n", item) == 1.0
    near = env.reward("<answer>xof dr</answer>", item)
    assert near["score"] == 0.0 and 0.8 < near["similarity"] < 1.0


def test_gsm8k_reward_on_local_file():
    env = make_env("gsm8k", data_path=str(DATA / "gsm8k_tiny.jsonl"))
    items = first(env, "eval", 10)
    assert [i["answer"] for i in items] == ["72", "10", "5", "2500"]
    assert env.reward("48 + 24 = 72, so \\boxed{72}", items[0]) == {"score": 1.0, "correct": 1.0, "boxed": 1.0}
    assert env.reward("She sold 72 clips.", items[0])["score"] == 1.0  # a plain number counts too
    assert score(env, "\\boxed{71}", items[0]) == 0.0
    assert score(env, "\\boxed{2,500}", items[3]) == 1.0
    assert score(env, "I am not sure.", items[1]) == 0.0


def test_math_reward_accepts_equivalent_latex():
    env = make_env("math", data_path=str(DATA / "math_tiny.jsonl"))
    items = first(env, "eval", 10)
    assert [i["answer"] for i in items] == ["\\frac{1}{2}", "7", "4", "\\frac{\\sqrt{2}}{2}"]
    assert score(env, "It is \\boxed{0.5}", items[0]) == 1.0
    assert score(env, "\\boxed{1/2}", items[0]) == 1.0
    assert score(env, "\\boxed{\\frac{1}{3}}", items[0]) == 0.0
    assert score(env, "so x = \\boxed{4}", items[2]) == 1.0
    assert score(env, "\\boxed{\\frac{1}{\\sqrt{2}}}", items[3]) == 1.0


def test_dataset_env_missing_file_and_missing_columns(tmp_path):
    env = make_env("gsm8k", data_path=str(tmp_path / "nope.jsonl"))
    with pytest.raises(ConfigError, match="does not exist") as info:
        first(env)
    assert "nope.jsonl" in info.value.message
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "label": "1"}) + "\n")
    with pytest.raises(ConfigError) as info:
        first(make_env("gsm8k", data_path=str(bad)))
    assert "'question'" in info.value.message and "'answer'" in info.value.message
    assert "label" in info.value.hint
    with pytest.raises(ConfigError, match="'problem'"):
        first(make_env("math", data_path=str(bad)))


def test_dataset_env_reads_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "g.parquet"
    pq.write_table(pa.Table.from_pylist([{"question": "1+1?", "answer": "#### 2"}]), path)
    env = make_env("gsm8k", data_path=str(path))
    (item,) = first(env)
    assert item["answer"] == "2" and score(env, "\\boxed{2}", item) == 1.0


def test_tool_calling_reward_partial_credit():
    env = make_env("tool_calling")
    item = {"expected": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}}
    exact = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}</tool_call>'
    assert env.reward(exact, item) == {"score": 1.0, "correct": 1.0, "name": 1.0, "args_f1": 1.0}
    fenced = (
        '```json\n{"name": "get_weather", "arguments": "{\\"city\\": \\"paris\\", \\"unit\\": \\"celsius\\"}"}\n```'
    )
    assert score(env, fenced, item) == 1.0
    half = env.reward('{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}', item)
    assert half["correct"] == 0.0 and half["score"] == 0.75
    assert score(env, '{"name": "get_weather", "arguments": {}}', item) == 0.5
    assert score(env, '{"name": "set_timer", "arguments": {"city": "Paris", "unit": "celsius"}}', item) == 0.0
    assert score(env, "I would call the weather tool.", item) == 0.0


def test_tool_calling_items_offer_the_expected_tool():
    env = make_env("tool_calling", num_tools=3)
    for item in first(env, "eval", 10):
        names = [t["function"]["name"] for t in item["tools"]]
        assert item["expected"]["name"] in names and len(names) == 3
        messages = env.prompt(item)
        assert item["request"] == messages[-1]["content"]


def test_reasoning_gym_uses_its_verifier():
    env = make_env("reasoning_gym", task="leg_counting", eval_size=3)
    items = first(env, "eval", 10)
    assert len(items) == 3
    gold = items[0]["entry"]["answer"]
    assert env.reward(f"<answer>{gold}</answer>", items[0]) == {"score": 1.0, "correct": 1.0, "tagged": 1.0}
    assert score(env, "<answer>-1</answer>", items[0]) == 0.0


def test_reasoning_gym_unknown_task_names_close_matches():
    env = make_env("reasoning_gym", task="leg_count")
    with pytest.raises(ConfigError, match="unknown reasoning-gym task 'leg_count'") as info:
        first(env)
    assert "leg_counting" in info.value.hint


def test_math_reward_works_off_the_main_thread():
    import threading

    env = make_env("math", data_path=str(DATA / "math_tiny.jsonl"))
    item = first(env, "eval")[0]
    results = []
    thread = threading.Thread(target=lambda: results.append(score(env, "\\boxed{0.5}", item)))
    thread.start()
    thread.join()
    assert results == [1.0]
