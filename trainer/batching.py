"""From scored groups to the tensors of one optimizer step: advantages, overrides, shifts, micro-batches.

Where it sits: the step's `ScoredGroup`s (from rollout files, the trajectory API or the in-process loop) come
in; `prepare(...)` turns each rollout into a `Sample` (advantage per token, trained positions, sampling
temperature, inference log-probs), `micro_batches(...)` pads samples of similar length together under a token
budget, and `grpo.py` trains on them.

Rules (Atropos' example trainer, spec §6.3, where it has one):
- advantage = (score - group mean) / max(group std, 1e-8) (population std); without std scaling (Dr. GRPO)
  just score - mean; a group of one rollout gets 0; per-token `advantages` sent by the env win when present;
- `overrides[i].set_advantage_to_zero` zeroes rollout i; its temperature is `overrides[i].temperature` >
  `generation_params.temperature` > `group_overrides.temperature` > 1.0 (log-probs are taken at it);
- dynamic sampling (DAPO) drops groups whose scores are all equal: they carry no signal;
- causal shift: position t predicts token t+1, so inputs = tokens[:-1], targets = tokens[1:],
  trained where masks[1:] != -100, inference log-probs = inference_logprobs[1:].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from atropos_cli.types import ScoredGroup

__all__ = ["Sample", "Prepared", "MicroBatch", "group_advantages", "prepare", "micro_batches"]

MASKED = -100


@dataclass
class Sample:
    tokens: list[int]
    trained: list[bool]  # per position of tokens[1:]
    advantages: list[float]  # per position of tokens[1:]
    temperature: float
    inference_logprobs: list[float] | None  # per position of tokens[1:]

    @property
    def num_trained(self) -> int:
        return sum(self.trained)


@dataclass
class Prepared:
    """One step's samples plus what the console and metrics.jsonl show about the groups."""

    samples: list[Sample] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    groups: int = 0
    groups_with_signal: int = 0
    dropped_no_signal: int = 0
    truncated: int = 0


def group_advantages(scores: list[float], scale: bool) -> list[float]:
    n = len(scores)
    if n < 2:
        return [0.0] * n
    mean = sum(scores) / n
    centred = [s - mean for s in scores]
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / n)
    return [c / max(std, 1e-8) for c in centred]


def _temperature(group: ScoredGroup, i: int) -> float:
    for source in (
        (group.overrides or [{}] * group.size)[i],
        group.generation_params or {},
        group.group_overrides or {},
    ):
        value = source.get("temperature") if source else None
        if value is not None and float(value) > 0:
            return float(value)
    return 1.0


def _sample(group: ScoredGroup, i: int, advantage: float, max_len: int) -> tuple[Sample, bool]:
    tokens, masks = group.tokens[i], group.masks[i]
    truncated = len(tokens) > max_len
    tokens, masks = tokens[:max_len], masks[:max_len]
    if group.advantages is not None:
        per_token = [float(a) for a in group.advantages[i][1:max_len]]
    else:
        per_token = [advantage] * (len(tokens) - 1)
    override = (group.overrides or [{}] * group.size)[i] or {}
    if override.get("set_advantage_to_zero"):
        per_token = [0.0] * len(per_token)
    inf = group.inference_logprobs[i][1:max_len] if group.inference_logprobs is not None else None
    sample = Sample(
        tokens=list(tokens),
        trained=[m != MASKED for m in masks[1:]],
        advantages=per_token,
        temperature=_temperature(group, i),
        inference_logprobs=[float(x) for x in inf] if inf is not None else None,
    )
    return sample, truncated


def prepare(groups: list[ScoredGroup], scale_rewards: bool, dynamic_sampling: bool, max_len: int) -> Prepared:
    """Samples for one step. Groups without token ids raise ValueError naming the fix (require_tokens)."""
    out = Prepared()
    for group in groups:
        group.require_tokens()
        out.groups += 1
        out.scores.extend(group.scores)
        has_signal = len(set(group.scores)) > 1
        out.groups_with_signal += int(has_signal)
        if dynamic_sampling and not has_signal:
            out.dropped_no_signal += 1
            continue
        for i, adv in enumerate(group_advantages(group.scores, scale_rewards)):
            sample, truncated = _sample(group, i, adv, max_len)
            out.truncated += int(truncated)
            if sample.num_trained > 0:
                out.samples.append(sample)
    return out


@dataclass
class MicroBatch:
    input_ids: torch.Tensor  # [B, T] int64, right-padded with 0
    attention_mask: torch.Tensor  # [B, T] int64
    targets: torch.Tensor  # [B, T] int64 (0 where padded)
    loss_mask: torch.Tensor  # [B, T] float32, 1.0 on trained positions
    advantages: torch.Tensor  # [B, T] float32
    temperature: torch.Tensor  # [B] float32
    inference_logp: torch.Tensor | None  # [B, T] float32, or None if any sample lacks them
    padded: bool = True  # False when every row is full width: attention needs no mask then
    unit_temperature: bool = False  # every rollout sampled at temperature 1: skip the logits scaling

    def to(self, device: torch.device | str) -> MicroBatch:
        fields = vars(self).items()
        moved = {k: v.to(device, non_blocking=True) if isinstance(v, torch.Tensor) else v for k, v in fields}
        return MicroBatch(**moved)


def _collate(samples: list[Sample]) -> MicroBatch:
    width = max(len(s.tokens) - 1 for s in samples)
    b = len(samples)
    input_ids = torch.zeros(b, width, dtype=torch.long)
    attention = torch.zeros(b, width, dtype=torch.long)
    targets = torch.zeros(b, width, dtype=torch.long)
    loss_mask = torch.zeros(b, width)
    adv = torch.zeros(b, width)
    have_inf = all(s.inference_logprobs is not None for s in samples)
    inf = torch.zeros(b, width) if have_inf else None
    for row, s in enumerate(samples):
        n = len(s.tokens) - 1
        input_ids[row, :n] = torch.tensor(s.tokens[:-1])
        targets[row, :n] = torch.tensor(s.tokens[1:])
        attention[row, :n] = 1
        loss_mask[row, :n] = torch.tensor(s.trained, dtype=torch.float32)
        adv[row, :n] = torch.tensor(s.advantages, dtype=torch.float32)
        if inf is not None:
            inf[row, :n] = torch.tensor(s.inference_logprobs, dtype=torch.float32)
    temps = torch.tensor([s.temperature for s in samples], dtype=torch.float32)
    padded = any(len(s.tokens) - 1 < width for s in samples)
    unit = all(s.temperature == 1.0 for s in samples)
    return MicroBatch(input_ids, attention, targets, loss_mask, adv, temps, inf, padded, unit)


def micro_batches(samples: list[Sample], max_tokens: int) -> list[MicroBatch]:
    """Pad samples of similar length together; each micro-batch holds at most `max_tokens` padded tokens
    (a single longer sample still gets its own micro-batch)."""
    ordered = sorted(samples, key=lambda s: len(s.tokens))
    batches: list[MicroBatch] = []
    current: list[Sample] = []
    for s in ordered:
        width = len(s.tokens) - 1  # sorted ascending, so this is the widest so far
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(_collate(current))
            current = []
        current.append(s)
    if current:
        batches.append(_collate(current))
    return batches
