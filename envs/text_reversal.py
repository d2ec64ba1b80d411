"""Text reversal: write a phrase backwards, character by character. Procedural, seeded, offline.

Atropos' `text_reversal` env in small. Items are 1..max_words words from a fixed list, drawn with an RNG
keyed by `(seed, split, index)`. The answer is read from `<answer>...</answer>` when present, else the whole
completion (stripped). Reward: 1.0 for the exact reversal, else 0.0. Reward parts: `correct` (the score)
and `similarity` (difflib ratio to the reversal, 0..1; shown in the viewer, not counted in the score, so a
near miss stays a miss for pass@k).
"""

from __future__ import annotations

import difflib
import random
from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import SimpleEnv

from ._shared.answers import answer_tag, strip_think
from ._shared.items import procedural_items
from ._shared.words import WORDS


class TextReversalConfig(EnvConfig):
    eval_size: int = 100
    max_words: int = 3


def extract_reversal(completion: str) -> str:
    text = strip_think(completion)
    tagged = answer_tag(text)
    return (tagged if tagged is not None else text).strip()


class TextReversalEnv(SimpleEnv):
    name: ClassVar[str] = "text_reversal"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "single-turn string task; procedural words (offline); reward 1 for the exact reversed text"
    )
    env_config_cls = TextReversalConfig
    system_prompt: ClassVar[str | None] = (
        "Reverse the text exactly, character by character. Put only the result inside <answer></answer> tags."
    )

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return TextReversalConfig(group_size=8, max_token_length=128), []

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        config: TextReversalConfig = self.config  # type: ignore[assignment]
        for item_id, key in procedural_items(config.seed, split, config.eval_size):
            rng = random.Random(key)
            text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max(1, config.max_words))))
            yield {"id": item_id, "text": text, "answer": text[::-1]}

    def prompt(self, item: dict[str, Any]) -> str:
        return f"Reverse this text: {item['text']}"

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        given = extract_reversal(completion)
        correct = 1.0 if given == item["answer"] else 0.0
        similarity = difflib.SequenceMatcher(None, given, item["answer"]).ratio()
        return {"score": correct, "correct": correct, "similarity": round(similarity, 4)}
