"""Reasoning Gym: any of reasoning-gym's ~100 procedural tasks as an env, scored by its own verifiers.
(Env name `reasoning_gym`; pick the task with `--env.task NAME`, e.g. leg_counting, basic_arithmetic,
word_sorting, sudoku.)

reasoning-gym (PyPI `reasoning-gym`, the `envs` extra) generates questions from a seed with no downloads.
The train split uses `--env.seed`, the eval split a different seed (`seed + 1_000_003`) and
`--env.eval_size` items. The model answers inside `<answer>...</answer>` (else its whole reply is the
answer); the task's `score_answer` gives the reward in [0, 1] (some tasks give partial credit). Parts:
`correct` (1 when the verifier gives 1.0) and `tagged` (format signal).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import SimpleEnv
from atropos_cli.errors import ConfigError

from ._shared.answers import answer_tag, strip_think

EVAL_SEED_OFFSET = 1_000_003


class ReasoningGymConfig(EnvConfig):
    task: str = "leg_counting"
    size: int = 10_000
    """Train items per epoch (the train split cycles)."""
    eval_size: int = 100


def _reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError:
        raise ConfigError(
            "the reasoning_gym env needs the `reasoning-gym` package", hint='pip install "atropos[envs]"'
        ) from None
    return reasoning_gym


def make_dataset(task: str, size: int, seed: int) -> Any:
    rg = _reasoning_gym()
    names = sorted(rg.factory.DATASETS)
    if task not in names:
        close = difflib.get_close_matches(task, names, n=3)
        maybe = f"did you mean {', '.join(map(repr, close))}? " if close else ""
        raise ConfigError(f"unknown reasoning-gym task {task!r}", hint=f"{maybe}{len(names)} tasks: {', '.join(names)}")
    return rg.create_dataset(task, size=size, seed=seed)


def extract_answer(completion: str) -> str:
    text = strip_think(completion)
    tagged = answer_tag(text)
    return (tagged if tagged is not None else text).strip()


class ReasoningGymEnv(SimpleEnv):
    name: ClassVar[str] = "reasoning_gym"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "single-turn reasoning; reasoning-gym procedural tasks (--env.task, offline); its verifier's score"
    )
    env_config_cls = ReasoningGymConfig
    system_prompt: ClassVar[str | None] = (
        "Think it through, then give only the final answer inside <answer></answer> tags."
    )

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return ReasoningGymConfig(group_size=8, max_token_length=1024), []

    def _dataset(self, split: str) -> Any:
        config: ReasoningGymConfig = self.config  # type: ignore[assignment]
        cache = self.__dict__.setdefault("_datasets", {})
        if split not in cache:
            if split == "train":
                cache[split] = make_dataset(config.task, config.size, config.seed)
            else:
                cache[split] = make_dataset(config.task, config.eval_size, config.seed + EVAL_SEED_OFFSET)
        return cache[split]

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        dataset = self._dataset(split)
        epoch = 0
        while True:
            for index in range(len(dataset)):
                yield {"id": f"{split}-{epoch}-{index}" if epoch else f"{split}-{index}", "split": split,
                       "entry": dataset[index]}  # fmt: skip
            if split != "train":
                return
            epoch += 1

    def prompt(self, item: dict[str, Any]) -> str:
        return item["entry"]["question"]

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        dataset = self._dataset(item["split"])
        score = float(dataset.score_answer(answer=extract_answer(completion), entry=item["entry"]))
        tagged = 1.0 if answer_tag(strip_think(completion)) is not None else 0.0
        return {"score": score, "correct": 1.0 if score >= 1.0 else 0.0, "tagged": tagged}
