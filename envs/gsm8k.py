"""GSM8K: grade-school word problems; the final answer is checked with math-verify.

Data: the hub dataset `openai/gsm8k` (config `main`; train split for training, test split for `evaluate`)
by default, or a local .jsonl/.json/.parquet file through `--env.data_path` (used for both splits, so an
eval runs on exactly that file). Rows need `question` and `answer`; a GSM8K answer ends with `#### N` and
only N is the gold (a plain answer with no `####` is used as is).

Reward: 1.0 when the completion's final answer (its last `\\boxed{}`, else its last number) equals the gold
under math-verify, else 0.0. Parts: `correct` (the score) and `boxed` (1 when the answer was boxed; a
format signal that does not count).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import SimpleEnv

from ._shared.answers import last_boxed, strip_think
from ._shared.data import check_hub_access, cycle_shuffled, load_split_records
from ._shared.mathcheck import answers_match

REQUIRED_COLUMNS = ("question", "answer")


class GSM8KConfig(EnvConfig):
    dataset_name: str = "openai/gsm8k"
    dataset_config: str | None = "main"
    eval_size: int = -1
    """How many eval items to use (-1: the whole eval split)."""


def gold_answer(answer: str) -> str:
    """The number after GSM8K's `####` marker (commas dropped), or the whole answer when there is none."""
    return answer.split("####")[-1].strip().replace(",", "")


class GSM8KEnv(SimpleEnv):
    name: ClassVar[str] = "gsm8k"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "single-turn math; hub openai/gsm8k or --env.data_path jsonl/parquet; reward 1 if math-verify matches"
    )
    env_config_cls = GSM8KConfig
    system_prompt: ClassVar[str | None] = (
        "Solve the problem step by step, then give the final answer as \\boxed{ANSWER}."
    )

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return GSM8KConfig(group_size=8, max_token_length=1024, total_steps=1000), []

    @classmethod
    def check_config(cls, config: EnvConfig) -> None:
        if not config.data_path:
            check_hub_access(config.dataset_name, REQUIRED_COLUMNS)  # type: ignore[attr-defined]

    def load_split(self, split: str) -> list[dict[str, Any]]:
        config: GSM8KConfig = self.config  # type: ignore[assignment]
        rows, _ = load_split_records(
            config.data_path, config.dataset_name, config.dataset_config, split, REQUIRED_COLUMNS
        )
        return rows

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        rows = self.load_split(split)
        if split == "train":
            for index, row in cycle_shuffled(list(enumerate(rows)), self.config.seed):
                yield self._item(row, row.get("id", index))
            return
        limit = self.config.eval_size if self.config.eval_size >= 0 else len(rows)  # type: ignore[attr-defined]
        for index, row in enumerate(rows[:limit]):
            yield self._item(row, row.get("id", index))

    def _item(self, row: dict[str, Any], index: Any) -> dict[str, Any]:
        return {"id": str(index), "question": row["question"], "answer": gold_answer(str(row["answer"]))}

    def prompt(self, item: dict[str, Any]) -> str:
        return item["question"]

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        correct = 1.0 if answers_match(completion, item["answer"]) else 0.0
        boxed = 1.0 if last_boxed(strip_think(completion)) is not None else 0.0
        return {"score": correct, "correct": correct, "boxed": boxed}
