"""MATH: competition problems with LaTeX answers, checked with math-verify. (Env name `math`; the module is
`math_env` so it does not shadow the standard library.)

Data: the hub dataset `DigitalLearningGmbH/MATH-lighteval` (train / test) by default, or a local
.jsonl/.json/.parquet file via `--env.data_path` (used for both splits). Rows need `problem` and either
`answer` (the final answer) or `solution` (a worked solution whose last `\\boxed{}` is the answer).

Reward: 1.0 when the completion's last `\\boxed{}` (else its last number) equals the gold under math-verify
(so `\\frac{1}{2}`, `0.5` and `1/2` all match), else 0.0. Parts: `correct` (the score), `boxed` (format).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import SimpleEnv
from atropos_cli.errors import ConfigError

from ._shared.answers import last_boxed, strip_think
from ._shared.data import check_columns, check_hub_access, cycle_shuffled, load_split_records
from ._shared.mathcheck import answers_match


class MathConfig(EnvConfig):
    dataset_name: str = "DigitalLearningGmbH/MATH-lighteval"
    dataset_config: str | None = None
    eval_size: int = -1
    """How many eval items to use (-1: the whole eval split)."""


def gold_from_row(row: dict[str, Any], source: str) -> str:
    if row.get("answer") not in (None, ""):
        return str(row["answer"])
    boxed = last_boxed(str(row.get("solution", "")))
    if boxed is None:
        raise ConfigError(
            f"{source}: a row has no 'answer' and its 'solution' has no \\boxed{{}} answer",
            hint="give each row an 'answer' column, or a 'solution' ending in \\boxed{ANSWER}",
        )
    return boxed


class MathEnv(SimpleEnv):
    name: ClassVar[str] = "math"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "single-turn math (LaTeX); hub MATH-lighteval or --env.data_path; reward 1 if math-verify matches"
    )
    env_config_cls = MathConfig
    system_prompt: ClassVar[str | None] = (
        "Solve the problem. Reason step by step, then put the final answer in \\boxed{}."
    )

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return MathConfig(group_size=8, max_token_length=2048, total_steps=1000), []

    @classmethod
    def check_config(cls, config: EnvConfig) -> None:
        if not config.data_path:
            check_hub_access(config.dataset_name, ("problem", "answer or solution"))  # type: ignore[attr-defined]

    def load_split(self, split: str) -> tuple[list[dict[str, Any]], str]:
        config: MathConfig = self.config  # type: ignore[assignment]
        rows, source = load_split_records(
            config.data_path, config.dataset_name, config.dataset_config, split, ("problem",)
        )
        if "answer" not in rows[0] and "solution" not in rows[0]:
            check_columns(rows, ("problem", "answer or solution"), source)
        return rows, source

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        rows, source = self.load_split(split)
        if split == "train":
            pairs: Iterator[tuple[int, dict[str, Any]]] = cycle_shuffled(list(enumerate(rows)), self.config.seed)
        else:
            limit = self.config.eval_size if self.config.eval_size >= 0 else len(rows)  # type: ignore[attr-defined]
            pairs = iter(list(enumerate(rows))[:limit])
        for index, row in pairs:
            yield {"id": str(row.get("id", index)), "problem": row["problem"], "answer": gold_from_row(row, source)}

    def prompt(self, item: dict[str, Any]) -> str:
        return item["problem"]

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        correct = 1.0 if answers_match(completion, item["answer"]) else 0.0
        boxed = 1.0 if last_boxed(strip_think(completion)) is not None else 0.0
        return {"score": correct, "correct": correct, "boxed": boxed}
