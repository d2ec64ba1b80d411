"""atroposlib.envs.reward_fns.chandas_meter_reward: `ChandasMeterReward` ("chandas_meter"): how well a
Sanskrit verse (IAST, transliterated to SLP1) fits `meter` (default tristubh) by the `chandas` package's
classifier: its score when it names the meter, 1 - score otherwise, clipped to [0, 1]. Without `chandas`
installed (or when it fails) every completion scores 0.0, as in atroposlib; a warning says so once."""

from __future__ import annotations

import logging
import re
from typing import Any

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["ChandasMeterReward", "iast_to_slp1"]

logger = logging.getLogger(__name__)

_DIGRAPHS = {
    "kh": "K", "gh": "G", "ch": "C", "jh": "J", "ṭh": "W", "ḍh": "Q", "th": "T", "dh": "D", "ph": "P",
    "bh": "B", "ai": "E", "au": "O", "ā": "A", "ī": "I", "ū": "U", "ṛ": "f", "ṝ": "F", "ḷ": "x", "ḹ": "X",
    "ṅ": "N", "ñ": "Y", "ṭ": "w", "ḍ": "q", "ṇ": "R", "ś": "S", "ṣ": "z", "ṃ": "M", "ṁ": "M", "ḥ": "H",
}  # fmt: skip
_DIGRAPH_RE = re.compile("|".join(re.escape(d) for d in _DIGRAPHS))


def iast_to_slp1(text: str) -> str:
    """IAST -> SLP1 (the digraphs and diacritics above; other characters as they are)."""
    return _DIGRAPH_RE.sub(lambda m: _DIGRAPHS[m.group(0)], text)


def _classifier() -> Any:
    try:
        from chandas import Classifier
    except ImportError:
        logger.warning("chandas is not installed: chandas_meter scores 0.0 (pip install chandas)")
        return None
    try:
        from importlib.resources import files

        data = files("chandas") / "data" / "data.json"
        return Classifier.from_json_file(str(data)) if data.is_file() else Classifier.from_default_location()
    except Exception as exc:
        logger.error("Failed to load chandas Classifier: %s", exc)
        return None


@registry.register
class ChandasMeterReward(RewardFunction):
    def __init__(self, meter: str = "tristubh", weight: float = 1.0, **kwargs: Any) -> None:
        super().__init__(weight=weight, **kwargs)
        self.meter = meter
        self.classifier = _classifier()

    def _score_text(self, text: str) -> float:
        if not self.classifier:
            return 0.0
        try:
            result = self.classifier.classify(iast_to_slp1(text))
            if not result:
                return 0.0
            predicted = getattr(result, "name", str(result)).lower()
            wanted = self.meter.lower()
            score = getattr(result, "score", 1.0 if predicted == wanted else 0.0)
            if predicted != wanted:
                score = 1.0 - score if score <= 1.0 else 0.0
            return max(0.0, min(1.0, float(score)))
        except Exception as exc:
            logger.error("Error scoring text with chandas: %s", exc)
            return 0.0

    def compute(self, completions: list[Any], **kwargs: Any) -> list[float]:
        return [self._score_text(self.get_content(completion)) for completion in completions]
