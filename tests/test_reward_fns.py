"""atroposlib.envs.reward_fns under our layer: the registry's names and loading rule, every reward function
the corpus uses scored on the same completions as atroposlib 0.4.0 (side by side in its venv when
ATROPOSLIB_PYTHON is set; hand-checked values otherwise), cosine_scaled with the shipped model as its
encoder, and an Atropos-style env that builds its reward from the registry run by `atropos process`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.resources import resolve_model_path
from differential import venv_python
from reward_fn_cases import COMPLETIONS, run_cases

PYTHON = os.environ.get("ATROPOSLIB_PYTHON", "")
TOKENIZER = resolve_model_path("atropos-tiny-arith")
DATA = Path(__file__).parent / "data" / "compat_names"
OURS = "atropos_cli.compat.atroposlib"


@pytest.fixture(scope="module")
def ours() -> dict:
    return run_cases(OURS)


def test_scores_by_hand(ours: dict) -> None:
    n = len(COMPLETIONS)
    assert ours["accuracy"][:4] == [1.0, 1.0, 1.0, 0.0] and ours["accuracy_gsm8k_gold"][:3] == [1.0, 1.0, 1.0]
    assert ours["accuracy_no_gold"] == [0.0] * n
    assert ours["format"][:6] == [1.0, 0.0, 0.0, 1.0, 1.0, 1.0]
    assert ours["format_case"][5] == 1.0 and ours["format_case"][0] == 0.0
    # "r1" is AccuracyXReward (atroposlib's loading rule): the solution anywhere in the response; two <think>
    # blocks leave the whole text as the response
    assert ours["r1"][:5] == [1.0, 1.0, 1.0, 1.0, 0.0]
    assert ours["r1_number_solution"] == [1.0] * n  # a number solution reads as "": found everywhere
    assert ours["legacy_r1_reward"][0] == 1.5 and ours["legacy_format_reasoning"][0] == 0.5
    assert ours["reasoning_steps"][6:8] == [0.5, 1.0]
    assert ours["combined_sum"][0] == pytest.approx((1.0 + 0.2) / 4)  # format 1 + reasoning_steps 0.2, weights 1+3
    assert ours["crossword_format"][11:13] == [1.0, 1.0]
    assert ours["cascading_r1_math"][:3] == [1.5, 1.0, 1.0]  # the format bonus only with a right answer
    assert ours["repetition_penalty"][1] == -0.1 and ours["repetition_penalty"][8] < -0.6
    assert -1.0 <= ours["repetition_penalty"][10] <= -0.1
    assert min(ours["combined_minmax"]) == 0.0 and max(ours["combined_minmax"]) == 1.0
    assert ours["unknown"] == "ImportError"


@pytest.mark.atroposlib
def test_every_reward_scores_like_atroposlib(ours: dict) -> None:
    venv_python("ATROPOSLIB_PYTHON", "atroposlib")
    script = Path(__file__).parent / "reward_fn_cases.py"
    done = subprocess.run([PYTHON, str(script), "atroposlib"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    reference = json.loads(done.stdout.splitlines()[-1])
    assert set(reference) == set(ours)
    assert {k: v for k, v in ours.items() if v != reference[k]} == {}, reference


def test_registry_names_and_loading_rule() -> None:
    from atropos_cli.compat.atroposlib.envs.reward_fns import CombinedReward, RewardFunction, registry

    assert (
        isinstance(registry.create("r1"), RewardFunction) and type(registry.create("r1")).__name__ == "AccuracyXReward"
    )
    assert type(registry.create("r1_reward")).__name__ == "AccuracyXReward"
    assert {"formatreasoning", "accuracyx", "combined"} <= set(registry.list_registered())
    combined = registry.create({"type": "combined", "rewards": ["format", "crossword_format"]})
    assert isinstance(combined, CombinedReward) and combined.name == "combined(formatreward,crosswordformatreward)"

    @registry.register(name="length")
    class LengthReward(RewardFunction):
        def compute(self, completions, **kwargs):
            return [float(len(self.get_content(c))) for c in completions]

    assert registry.create("length", weight=0.5)(["abcd", "ab"]) == [2.0, 1.0]
    with pytest.raises(TypeError):
        registry.register(int)
    logged = []

    class Logger:
        def log(self, metrics):
            logged.append(metrics)

    reward = registry.create("format")
    reward.set_wandb_logger(Logger())
    reward(["<think>x</think>", "no"])
    assert logged == [{"reward/formatreward/mean_raw": 0.5, "reward/formatreward/mean_weighted": 0.5,
                       "reward/formatreward/min": 0.0, "reward/formatreward/max": 1.0}]  # fmt: skip


def test_a_missing_package_names_what_to_install(tmp_path: Path) -> None:
    """Without math-verify, loading "accuracy" is one ImportError naming the package (atroposlib: at load)."""
    code = (
        "import sys; sys.modules['math_verify'] = None\n"
        "from atropos_cli.compat.atroposlib.envs.reward_fns import registry\n"
        "try:\n    registry.create('accuracy')\nexcept ImportError as e:\n    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "Failed to load reward function accuracy" in done.stdout and "pip install math-verify" in done.stdout


def test_cosine_scaled_with_the_shipped_model_as_encoder() -> None:
    from atropos_cli.compat.atroposlib.envs.reward_fns import registry

    reward = registry.create("cosine_scaled", model_name=str(TOKENIZER), min_reward=-1.0)
    same, other = reward(["What is 2 + 3?", "zzzz 999 ###"], solution="What is 2 + 3?")
    assert same == pytest.approx(1.0) and other < same
    assert reward(["x"], solution=None) == [0.0]
    broken = registry.create("cosine_scaled", model_name=str(DATA / "no_such_model"), default_reward=0.25)
    assert broken(["x"], solution="y") == [0.25]


def test_an_env_scoring_with_the_registry_runs_under_atropos_process(fake_server, tmp_path: Path) -> None:
    def rule(prompt: str, k: int) -> str:
        return ["<think>2 + 3</think>\\boxed{5}", "\\boxed{6}", "<think>hm</think>#### 5", "no idea"][k % 4]

    server = fake_server(rule)
    args = ["process", str(DATA / "reward_registry_env.py"), "--openai.base_url", server.base_url]
    args += ["--env.tokenizer_name", str(TOKENIZER), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (tmp_path / "run" / "groups.jsonl").read_text().splitlines()]
    # CombinedReward sums the raw scores (accuracy 1 + format 1) and "sum" divides by the weights (1 + 0.5)
    assert [sorted(g["scores"]) for g in groups] == [[0.0, 0.0, 2 / 1.5, 2 / 1.5]] * 2


def test_the_registry_answers_after_an_env_imported_its_module_by_path() -> None:
    """`import atroposlib.envs.reward_fns.registry` (an env file's spelling, through the compat alias) rebinds
    the package's `registry` to the module; the registry's calls still work through it."""
    import importlib

    from atropos_cli.compat.atroposlib.envs import reward_fns
    from atropos_cli.compat.atroposlib.envs.reward_fns import RewardFunction

    module = importlib.import_module("atropos_cli.compat.atroposlib.envs.reward_fns.registry")
    for holder in (module, module.registry, reward_fns.registry):
        assert isinstance(holder.create("format"), RewardFunction)
        assert "format" in holder.list_registered()
