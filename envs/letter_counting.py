"""Letter counting: how many times does a letter occur in a word? Procedural, seeded, offline.

Atropos' `letter_counting` env in small: the "how many r's in strawberry" task. Items come from a fixed
word list and a seeded RNG keyed by `(seed, split, index)`; the eval split is a fixed-size set of its own.
Half of the questions ask for a letter the word contains, the other half for any letter (answers of 0
happen). Reward: 1.0 when the answer (inside `<answer>...</answer>`, else the last number) equals the
count. Reward parts: `correct` (the score) and `tagged` (1 when the answer was inside `<answer>` tags;
format signal only).
"""

from __future__ import annotations

import random
import string
from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import SimpleEnv

from ._shared.answers import answer_tag, last_number, strip_think
from ._shared.items import procedural_items
from ._shared.words import WORDS


class LetterCountingConfig(EnvConfig):
    eval_size: int = 100
    max_words: int = 1
    """Questions about a phrase of 1..max_words words (longer phrases are harder)."""


def make_question(rng: random.Random, max_words: int) -> tuple[str, str, int]:
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, max(1, max_words))))
    letters = sorted(set(text) - {" "})
    letter = rng.choice(letters) if rng.random() < 0.5 else rng.choice(string.ascii_lowercase)
    return text, letter, text.count(letter)


def parse_count(completion: str) -> int | None:
    text = strip_think(completion)
    candidate = answer_tag(text)
    number = last_number(candidate if candidate is not None else text)
    try:
        return int(float(number)) if number is not None else None
    except ValueError:
        return None


class LetterCountingEnv(SimpleEnv):
    name: ClassVar[str] = "letter_counting"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "single-turn counting; procedural words (offline); reward 1 for the exact letter count"
    env_config_cls = LetterCountingConfig
    system_prompt: ClassVar[str | None] = (
        "Count carefully. Give the final number inside <answer></answer> tags, e.g. <answer>3</answer>."
    )

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return LetterCountingConfig(group_size=8, max_token_length=256), []

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        config: LetterCountingConfig = self.config  # type: ignore[assignment]
        for item_id, key in procedural_items(config.seed, split, config.eval_size):
            text, letter, answer = make_question(random.Random(key), config.max_words)
            yield {"id": item_id, "text": text, "letter": letter, "answer": answer}

    def prompt(self, item: dict[str, Any]) -> str:
        return f"How many times does the letter '{item['letter']}' appear in \"{item['text']}\"?"

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        correct = 1.0 if parse_count(completion) == item["answer"] else 0.0
        tagged = 1.0 if answer_tag(strip_think(completion)) is not None else 0.0
        return {"score": correct, "correct": correct, "tagged": tagged}
