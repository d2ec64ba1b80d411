"""atroposlib.envs.reward_fns.repetition_penalty_reward: `RepetitionPenaltyReward` ("repetition_penalty"),
a penalty in [-1, 0] for repetitive text, by atroposlib 0.4.0's rules:

- fewer than `min_words` words or `min_sentences` sentences: `short_text_penalty` (-0.1);
- a repeated sentence of over 3 words: `paragraph_repetition_base_penalty` - 0.4 * (repeats / sentences);
- else a weighted sum of rates (per word): repeated content words (over 3 letters, not stopwords, seen over
  twice), repeated 3-5-grams (weighted n/3), immediate word repeats, repeated 3-word sentence openings (per
  sentence); at or under `threshold` 0.0, above it -(score - threshold) / (1 - threshold), at most -0.1.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from typing import Any

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["RepetitionPenaltyReward", "repetition_penalty_reward"]

logger = logging.getLogger(__name__)

STOPWORDS = frozenset(
    [
        "this",
        "that",
        "with",
        "from",
        "what",
        "when",
        "where",
        "which",
        "who",
        "whom",
        "whose",
        "will",
        "shall",
        "should",
        "would",
        "could",
        "have",
        "has",
        "had",
        "been",
        "being",
        "than",
        "then",
        "there",
        "these",
        "those",
        "their",
    ]
)


def _repeats(counts: Counter[str]) -> int:
    return sum(count - 1 for count in counts.values() if count > 1)


@registry.register
class RepetitionPenaltyReward(RewardFunction):
    def __init__(
        self,
        threshold: float = 0.05,
        min_words: int = 10,
        min_sentences: int = 2,
        short_text_penalty: float = -0.1,
        paragraph_repetition_base_penalty: float = -0.6,
        component_weights: dict[str, float] | None = None,
        stopwords: set[str] | None = None,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(weight=weight, **kwargs)
        self.threshold = threshold
        self.min_words = min_words
        self.min_sentences = min_sentences
        self.short_text_penalty = short_text_penalty
        self.paragraph_repetition_base_penalty = paragraph_repetition_base_penalty
        self.component_weights = {
            "word_repetition": 0.3,
            "phrase_repetition": 0.4,
            "consecutive_repetition": 0.6,
            "beginning_repetition": 0.5,
        }
        self.component_weights.update(component_weights or {})
        self.stopwords = stopwords or set(STOPWORDS)

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        scores = []
        for completion in completions:
            try:
                scores.append(self._penalty(self.get_content(completion)))
            except Exception as exc:
                logger.error("Error in repetition penalty: %s", exc)
                scores.append(-0.2)
        return scores

    def _penalty(self, content: str) -> float:
        words = re.findall(r"\b\w+\b", content.lower())
        sentences = [s.strip() for s in re.split(r"[.!?]", content) if s.strip()]
        if len(words) < self.min_words or len(sentences) < self.min_sentences:
            return self.short_text_penalty
        repeated_sentences = sum(c - 1 for s, c in Counter(sentences).items() if c > 1 and len(s.split()) > 3)
        if repeated_sentences > 0:
            return self.paragraph_repetition_base_penalty - min(1.0, repeated_sentences / len(sentences)) * 0.4
        score = self._rates(words, sentences)
        if score <= self.threshold:
            return 0.0
        return min(-min(1.0, (score - self.threshold) / (1 - self.threshold)), -0.1)

    def _rates(self, words: list[str], sentences: list[str]) -> float:
        counts = Counter(words)
        content_words = {w for w in counts if len(w) > 3 and w not in self.stopwords}
        word_rate = sum(c - 1 for w, c in counts.items() if c > 2 and w in content_words) / len(words)
        phrases = 0.0
        if len(words) >= 5:
            for n in range(3, 6):
                grams = Counter(" ".join(words[i : i + n]) for i in range(len(words) - n + 1))
                phrases += _repeats(grams) * (n / 3)
        consecutive = sum(1 for i in range(1, len(words)) if words[i] == words[i - 1] and len(words[i]) > 2)
        openings = Counter(" ".join(s.split()[:3]) for s in sentences if len(s.split()) >= 3)
        weights = self.component_weights
        return (
            word_rate * weights.get("word_repetition", 0.3)
            + phrases / len(words) * weights.get("phrase_repetition", 0.4)
            + consecutive / len(words) * weights.get("consecutive_repetition", 0.6)
            + _repeats(openings) / len(sentences) * weights.get("beginning_repetition", 0.5)
        )


def repetition_penalty_reward(completions: list[Any], threshold: float = 0.05, **kwargs: Any) -> list[float]:
    return RepetitionPenaltyReward(threshold=threshold).compute(completions, **kwargs)
