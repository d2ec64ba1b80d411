"""Reward-function cases run the same way under atroposlib 0.4.0 (its venv) and ours: `run_cases()` gives,
per case, the registry's scores (or the error's type). Run as a script with the atroposlib package name as
argv[1] (`atroposlib` or `atropos_cli.compat.atroposlib`), it prints them as JSON."""

from __future__ import annotations

import importlib
import importlib.util  # atroposlib 0.4.0's registry uses importlib.util without importing it
import json
import logging
import sys
from typing import Any

THINK = "<think>First, add 2 and 3. Then check.</think>The answer is \\boxed{5}."
COMPLETIONS: list[Any] = [
    THINK,
    "\\boxed{5}",
    "#### 5",
    "<think>a</think><think>b</think>5",
    {"role": "assistant", "content": "<answer>6</answer>"},
    {"message": {"role": "assistant", "content": "<THINK>x</THINK> 4,000"}},
    [{"role": "user", "content": "q"}, {"role": "assistant", "content": "Step 1: add. Step 2: check. Step 3: done."}],
    "1. First we compute.\n2. Then we apply it.\n- a bullet\n* another\n"
    "3. Finally done, and we analyze it all again now.",
    "The cat sat. The cat sat on the mat today. The cat sat on the mat today. Then it left the house quickly.",
    "the same same same words words words again again again here here here and and more more more text text",
    "We compute the value carefully now. We compute the value carefully again. Then compute compute compute "
    "the final value value. Results are results results here and results again.",
    "1-Across: HELLO, 2-Down: WORLD",
    "1-Across: HELL0",
    {"role": "user", "content": "not an answer"},
    "",
]
BULLETS = {"bullet_points": 1.0}
STEPS_3 = {"type": "reasoning_steps", "weight": 3.0}
CASES: list[tuple[str, Any, dict[str, Any]]] = [
    ("accuracy", "accuracy", {"solution": "5"}),
    ("accuracy_gsm8k_gold", "accuracy", {"ground_truth": "so 2+3 = 5\n#### 5"}),
    ("accuracy_number_gold", {"type": "accuracy", "params": {"split_on_think_tag": False}}, {"solution": 4000}),
    ("accuracy_no_gold", "accuracy", {}),
    ("accuracy_reward_name", "accuracy_reward", {"solution": "\\boxed{5}"}),
    ("format", "format", {}),
    ("format_all_tags", {"type": "format", "weight": 2.0, "params": {"require_all_tags": True}}, {}),
    ("format_case", {"type": "format", "preferred_tags": ["THINK"], "case_sensitive": True}, {}),
    ("format_reward_name", "format_reward", {}),
    ("r1", "r1", {"solution": "5"}),
    ("r1_number_solution", "r1", {"solution": 5}),
    ("r1_exact", {"type": "r1", "params": {"exact_match": True}}, {"solution": "the answer is \\boxed{5}."}),
    ("reasoning_steps", "reasoning_steps", {}),
    ("reasoning_steps_weights", {"type": "reasoning_steps", "params": {"min_steps": 1, "pattern_weights": BULLETS}}, {}),  # noqa: E501
    ("repetition_penalty", "repetition_penalty", {}),
    ("repetition_penalty_strict", {"type": "repetition_penalty", "threshold": 0.0, "min_words": 3}, {}),
    ("crossword_format", "crossword_format", {}),
    ("cascading_r1_math", "cascading_r1_math", {"solution": "5"}),
    ("combined_sum", {"type": "combined", "rewards": ["format", STEPS_3], "normalization": "sum"}, {}),
    ("combined_minmax", {"type": "combined", "rewards": ["format", "repetition_penalty"], "normalization": "minmax"}, {}),  # noqa: E501
    ("combined_none", {"type": "combined", "rewards": ["crossword_format", "format"]}, {}),
    ("unknown", "no_such_reward", {}),
]  # fmt: skip


def run_cases(package: str) -> dict[str, Any]:
    registry = importlib.import_module(f"{package}.envs.reward_fns").registry
    results: dict[str, Any] = {}
    for label, spec, context in CASES:
        try:
            reward = registry.create(spec)
            results[label] = [round(score, 9) for score in reward(COMPLETIONS, **context)]
        except Exception as exc:
            results[label] = type(exc).__name__
    legacy = importlib.import_module(f"{package}.envs.reward_fns.r1_reward")
    results["legacy_r1_reward"] = legacy.r1_reward(COMPLETIONS, solution="5")
    results["legacy_format_reasoning"] = legacy.format_reasoning_reward(COMPLETIONS)
    return results


if __name__ == "__main__":
    logging.disable(logging.CRITICAL)
    print(json.dumps(run_cases(sys.argv[1])))
