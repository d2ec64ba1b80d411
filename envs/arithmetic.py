"""Arithmetic: add, subtract or multiply small integers; reward 1 for the right number. Procedural, seeded, offline.

The default env of `atropos process` and the task the shipped model `atropos-tiny-arith` was trained on.
Items are generated from `(seed, split, index)`, so every run with the same seed sees the same questions, and
the eval split never overlaps the train split. Reward: 1.0 when the last integer in the completion equals the
answer, else 0.0. Reward parts shown in the viewer: `correct` (the score) and `bare_number` (1 when the
completion is just the number, a format signal that does not count towards the score).
"""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import QUICK_GROUPS, EnvConfig
from atropos_cli.env.base import SimpleEnv

from ._shared.items import procedural_items

OPERATORS = ("+", "-", "*")
_INT = re.compile(r"-?\d+")


class ArithmeticConfig(EnvConfig):
    max_operand: int = 30
    """Operands are drawn from 0..max_operand (multiplication uses 0..max(12, max_operand // 8)). The default
    (0..30 for + and -, 0..12 for *) is small enough that the shipped ~1M-parameter model learns it on CPU in
    minutes; raise it (`--env.max_operand 99`) for a harder task."""
    operators: str = "+-*"
    eval_size: int = 200


def make_problem(rng: random.Random, max_operand: int, operators: str) -> tuple[str, int]:
    op = rng.choice([o for o in operators if o in OPERATORS])
    if op == "*":
        small = max(12, max_operand // 8)
        a, b = rng.randint(0, small), rng.randint(0, small)
    else:
        a, b = rng.randint(0, max_operand), rng.randint(0, max_operand)
    answer = a + b if op == "+" else a - b if op == "-" else a * b
    return f"{a} {op} {b}", answer


def parse_answer(completion: str) -> int | None:
    found = _INT.findall(completion)
    return int(found[-1]) if found else None


class ArithmeticEnv(SimpleEnv):
    name: ClassVar[str] = "arithmetic"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "integer + - * questions; reward 1 for the right number (procedural, offline)"
    env_config_cls = ArithmeticConfig

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return ArithmeticConfig(group_size=8, max_token_length=16, total_steps=QUICK_GROUPS, temperature=1.0), []

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        config: ArithmeticConfig = self.config  # type: ignore[assignment]
        for item_id, key in procedural_items(config.seed, split, config.eval_size):
            question, answer = make_problem(random.Random(key), config.max_operand, config.operators)
            yield {"id": item_id, "question": question, "answer": answer}

    def prompt(self, item: dict[str, Any]) -> str:
        return f"What is {item['question']}?"

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        correct = 1.0 if parse_answer(completion) == item["answer"] else 0.0
        bare = 1.0 if completion.strip().lstrip("-").isdigit() else 0.0
        return {"score": correct, "correct": correct, "bare_number": bare}
