"""atroposlib.envs.reward_fns.cosine_scaled_reward: `CosineScaledReward` ("cosine_scaled"): the cosine
similarity of a completion's and the solution's mean-pooled embeddings (`model_name`, default
sentence-transformers/all-MiniLM-L6-v2, any HF encoder or decoder), `1 - distance * scale_factor` clipped to
[min_reward, max_reward]; `default_reward` without a solution or when the model cannot load (logged). The
model is loaded once per name and shared by instances. Needs torch and transformers (creating the reward
without them fails, as in atroposlib)."""

from __future__ import annotations

import logging
from typing import Any, ClassVar

from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["CosineScaledReward", "cosine_scaled_reward"]

logger = logging.getLogger(__name__)


@registry.register
class CosineScaledReward(RewardFunction):
    _model: ClassVar[Any] = None
    _tokenizer: ClassVar[Any] = None
    _model_name: ClassVar[str] = "sentence-transformers/all-MiniLM-L6-v2"

    def __init__(
        self,
        model_name: str | None = None,
        scale_factor: float = 1.0,
        min_reward: float = -1.0,
        max_reward: float = 1.0,
        default_reward: float = 0.0,
        weight: float = 1.0,
        **kwargs: Any,
    ) -> None:
        import torch  # noqa: F401  (fails here without torch, as atroposlib's module import does)
        import transformers  # noqa: F401

        super().__init__(weight=weight, **kwargs)
        self.model_name = model_name or self._model_name
        self.scale_factor = scale_factor
        self.min_reward = min_reward
        self.max_reward = max_reward
        self.default_reward = default_reward
        self._ensure_model_loaded()

    def _ensure_model_loaded(self) -> None:
        cls = CosineScaledReward
        if self.model_name == cls._model_name and cls._model is not None:
            return
        from transformers import AutoModel, AutoTokenizer

        try:
            cls._tokenizer = AutoTokenizer.from_pretrained(self.model_name)
            cls._model = AutoModel.from_pretrained(self.model_name)
            cls._model_name = self.model_name
        except Exception as exc:
            logger.error("Error loading model for cosine similarity: %s", exc)
            cls._tokenizer = cls._model = None

    def _embedding(self, text: str) -> Any:
        import torch

        cls = CosineScaledReward
        if cls._model is None or cls._tokenizer is None:
            return None
        encoded = cls._tokenizer(text, padding=True, truncation=True, return_tensors="pt")
        with torch.no_grad():
            hidden = cls._model(**encoded)[0]
        mask = encoded["attention_mask"].unsqueeze(-1).expand(hidden.size()).float()
        pooled = (hidden * mask).sum(1) / torch.clamp(mask.sum(1), min=1e-9)
        return pooled.flatten().double()

    def compute(self, completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
        if not solution:
            logger.warning("No solution provided for cosine similarity calculation")
            return [self.default_reward] * len(completions)
        reference = solution if isinstance(solution, str) else self.get_content(solution)
        return [self._score(self.get_content(completion), reference) for completion in completions]

    def _score(self, content: str, reference: str) -> float:
        try:
            a, b = self._embedding(reference), self._embedding(content)
            if a is None or b is None:
                return self.default_reward
            distance = 1.0 - float(a.dot(b) / (a.norm() * b.norm()))
            return min(self.max_reward, max(self.min_reward, 1.0 - distance * self.scale_factor))
        except Exception as exc:
            logger.error("Error in cosine similarity calculation: %s", exc)
            return self.default_reward


def cosine_scaled_reward(completions: list[Any], solution: Any = None, **kwargs: Any) -> list[float]:
    return CosineScaledReward().compute(completions, solution=solution, **kwargs)
