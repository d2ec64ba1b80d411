"""`gym:ID`: Gymnasium text envs (examples/gym_text_games.py, written in Gymnasium's own style and registered
with gymnasium.register) run by `atropos process|evaluate|train` with the shipped model on CPU, in the gym
adapter's own venv (ATROPOS_GYM_PYTHON: gymnasium 1.x + atropos, built by .ci/run). The commands run as
parallel subprocesses in one module fixture; the tests read what they wrote."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from adapter_cases import CASES, python_of, run_env
from atropos_cli.env.registry import resolve_env
from atropos_cli.errors import EnvLoadError

GYM = next(c for c in CASES if c.id == "gym")
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


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> tuple[Path, dict[str, subprocess.CompletedProcess]]:
    python = python_of(GYM)
    tmp = tmp_path_factory.mktemp("gym")

    def run(args: list[str]) -> subprocess.CompletedProcess:
        cmd = [python, "-m", "atropos_cli", *args]
        return subprocess.run(cmd, capture_output=True, text=True, env=run_env(GYM), timeout=600)

    todo = commands(tmp)
    with ThreadPoolExecutor(4) as pool:
        done = dict(zip(todo, pool.map(run, todo.values()), strict=True))
    return tmp, done


def groups(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "groups.jsonl").read_text().splitlines()]


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
    for group in groups(tmp / "guess"):
        for score, rollout in zip(group["scores"], group["meta"]["rollouts"], strict=True):
            assert score == pytest.approx(sum(rollout["step_rewards"]))
            assert rollout["reward_parts"]["turns"] == len(rollout["step_rewards"])


def test_evaluate_scores_the_eval_split(ran):
    tmp, done = ran
    assert done["evaluate"].returncode == 0, done["evaluate"].stderr
    samples = [json.loads(line) for line in (tmp / "eval" / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == 6 and {s["item_id"] for s in samples} == {f"eval-{i}" for i in range(6)}
    assert (tmp / "eval" / "metrics.json").is_file()


def test_train_runs_grpo_steps_on_a_gym_env(ran):
    tmp, done = ran
    assert done["train"].returncode == 0, done["train"].stderr
    steps = [json.loads(line) for line in (tmp / "train" / "metrics.jsonl").read_text().splitlines()]
    assert len([s for s in steps if "loss" in s]) == 2
    assert (tmp / "train" / "checkpoints" / "step-2").is_dir()


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
    result = done[name]
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and hint in result.stderr
    assert "Traceback" not in result.stderr and "local backend" not in result.stdout + result.stderr
    assert not (tmp / name / "groups.jsonl").exists()


@pytest.mark.skipif(importlib.util.find_spec("gymnasium") is not None, reason="gymnasium is installed here")
def test_without_gymnasium_the_spec_says_how_to_install_it():
    with pytest.raises(EnvLoadError, match="needs the gymnasium package") as info:
        resolve_env("gym:TextGames/Arithmetic-v0")
    assert "pip install 'gymnasium>=1,<2'" in (info.value.hint or "")
