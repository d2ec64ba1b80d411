"""`gym:ID`: Gymnasium text envs (examples/gym_text_games.py, written in Gymnasium's own style and registered
with gymnasium.register) run by `atropos process|evaluate|train` with the shipped model on CPU, in the gym
adapter's own venv (ATROPOS_GYM_PYTHON: gymnasium 1.x + atropos, built by .ci/run). The commands run as
parallel subprocesses in one module fixture; the tests read what they wrote."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from adapter_cases import assert_refused_before_the_model_loads, commands_fixture, groups, read_jsonl

ARITH = "gym:gym_text_games:TextGames/Arithmetic-v0"
GUESS = "gym:gym_text_games:TextGames/GuessNumber-v0"
SHORT = ["--env.max_token_length", "8"]


def commands(tmp: Path) -> dict[str, list[str]]:
    return {
        "process_arith": ["process", ARITH, "--out", str(tmp / "arith"), "--num-groups", "3", "--group-size", "4",
                          *SHORT],
        "process_guess": ["process", GUESS, "--out", str(tmp / "guess"), "--num-groups", "2", "--group-size", "3",
                          "--env.max_turns", "3",
                          *SHORT],
        "evaluate": ["evaluate", ARITH, "--out", str(tmp / "eval"), "--env.eval_episodes", "6", *SHORT],
        "train": ["train", ARITH, "--steps", "2", "--groups-per-step", "2", "--out", str(tmp / "train"),
                  "--env.group_size", "4", *SHORT],
        "cartpole": ["process", "gym:CartPole-v1", "--out", str(tmp / "cartpole")],
        "typo": ["process", "gym:gym_text_games:TextGames/Guessnumber-v0", "--out", str(tmp / "typo")],
        "kwargs": ["process", ARITH, "--out", str(tmp / "kwargs"), "--env.make_kwargs", '{"no_such_arg": 1}'],
    }  # fmt: skip


ran = commands_fixture("gym", commands)


def test_process_writes_scored_groups_with_tokens_and_episode_returns(ran):
    tmp, done = ran
    assert done["process_arith"].returncode == 0, done["process_arith"].stderr
    arith = groups(tmp / "arith")
    assert len(arith) == 3 and all(len(g["scores"]) == 4 for g in arith)
    assert all(s in (0.0, 1.0) for g in arith for s in g["scores"])
    assert any(s == 1.0 for g in arith for s in g["scores"]), "the shipped arithmetic model answers some right"
    for group in arith:
        assert len(group["tokens"]) == 4 and not group["meta"]["tokens_missing"]
        assert group["messages"][0][0]["content"].startswith("What is ")
    assert done["process_guess"].returncode == 0, done["process_guess"].stderr
    guess = groups(tmp / "guess")
    assert len(guess) == 2 and all(len(g["scores"]) == 3 for g in guess)  # --num-groups 2 --group-size 3
    for group in guess:
        for score, rollout in zip(group["scores"], group["meta"]["rollouts"], strict=True):
            assert score == pytest.approx(sum(rollout["step_rewards"]))
            assert rollout["reward_parts"]["turns"] == len(rollout["step_rewards"])


def test_evaluate_scores_the_eval_split(ran):
    tmp, done = ran
    assert done["evaluate"].returncode == 0, done["evaluate"].stderr
    samples = read_jsonl(tmp / "eval" / "samples.jsonl")
    assert len(samples) == 6 and {s["item_id"] for s in samples} == {f"eval-{i}" for i in range(6)}
    metrics = json.loads((tmp / "eval" / "metrics.json").read_text())["results"]["all"]
    correct = sum(s["correct"] for s in samples)  # one sample per item: pass@1 is the fraction right
    assert metrics["num_samples"] == 6 and metrics["pass@1"] == pytest.approx(correct / 6, abs=1e-6)  # 6 decimals


def test_train_runs_grpo_steps_on_a_gym_env(ran):
    tmp, done = ran
    assert done["train"].returncode == 0, done["train"].stderr
    steps = read_jsonl(tmp / "train" / "metrics.jsonl")
    assert len([s for s in steps if "loss" in s]) == 2
    from safetensors import safe_open

    with safe_open(str(tmp / "train" / "checkpoints" / "step-2" / "model.safetensors"), "np") as weights:
        assert len(list(weights.keys())) > 0  # the step's weights, readable (not just a folder)


@pytest.mark.parametrize(
    ("name", "message", "hint"),
    [
        ("cartpole", "gym:CartPole-v1 has Box observations, not text", "gymnasium.spaces.Text"),
        ("typo", "doesn't exist in namespace TextGames", "did you mean 'TextGames/GuessNumber-v0'?"),
        ("kwargs", "gymnasium.make failed: TypeError", "--env.make_kwargs"),
    ],
)
def test_bad_specs_are_one_line_errors_before_the_model_loads(ran, name, message, hint):
    tmp, done = ran
    assert_refused_before_the_model_loads(done[name], tmp / name, message, hint)
