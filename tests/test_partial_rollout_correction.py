"""A partial rollout (tokens of two policy versions: a weight push landed while it was generated) is corrected
token by token against the weights that sampled each token: its recorded logprob μ_t (docs/training-async.md,
"In-flight updates and partial rollouts"). The trainer is at version 1; tokens 0-2 of the first rollout were
sampled by version 0, the rest of it and the whole second rollout by version 1."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest
import torch

from atropos_cli.families import build
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
from atropos_cli.types import GroupMeta, RolloutMeta, ScoredGroup

VOCAB, PROMPT, COMPLETION = 96, 5, 6
SWAP = 3  # the first rollout's completion tokens before version 1 landed


def _logprobs(model: torch.nn.Module, tokens: list[int]) -> list[float]:
    """Per position of `tokens` (position 0: none), the model's log-probability of that token at temperature 1."""
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0, :-1].float()
    picked = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:]).unsqueeze(-1)).squeeze(-1)
    return [1.0, *picked.tolist()]


def _trainer_and_group() -> tuple[GRPOTrainer, ScoredGroup]:
    torch.manual_seed(0)
    v0 = build("llama", VOCAB, tiny=True)
    v1 = copy.deepcopy(v0)
    with torch.no_grad():  # the next version: the weights one optimizer step moved (here, by noise)
        for p in v1.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    rng = random.Random(0)
    tokens = [[rng.randrange(3, VOCAB) for _ in range(PROMPT + COMPLETION)] for _ in range(2)]
    old, new = (_logprobs(m, tokens[0]) for m in (v0, v1))
    mu = [[*old[: PROMPT + SWAP], *new[PROMPT + SWAP :]], _logprobs(v1, tokens[1])]
    versions = [[0] * SWAP + [1] * (COMPLETION - SWAP), [1] * COMPLETION]
    group = ScoredGroup(
        tokens=tokens,
        masks=[[-100] * PROMPT + t[PROMPT:] for t in tokens],
        scores=[1.0, 0.0],
        inference_logprobs=mu,
        generation_params={"temperature": 1.0},
        meta=GroupMeta(policy_version=0, rollouts=[RolloutMeta(policy_versions=v) for v in versions]),
    )
    # the trainer holds version 1; its steps barely move it (lr 1e-9), so both modes below see the same π_old
    return GRPOTrainer(GRPOConfig(out="unused", chunk_size=16, lr=1e-9), model=v1), group


def test_each_token_of_a_two_version_rollout_is_weighed_by_its_own_sampler():
    trainer, group = _trainer_and_group()
    # mask with a tight band around ρ = 1: only the tokens version 0 sampled are off-policy for the trainer
    trainer.loss_cfg = replace(trainer.loss_cfg, is_mode="mask", is_min=1 - 1e-3, is_max=1 + 1e-3)
    masked = trainer.step([group])
    assert masked["trained_tokens"] == 2 * COMPLETION
    assert masked["is_rejected_fraction"] == pytest.approx(SWAP / (2 * COMPLETION))
    # stable: the divergence is per sequence, so the partial rollout goes as one and the other one stays
    trainer.loss_cfg = replace(trainer.loss_cfg, is_mode="stable", stable_seq_kl=1e-6)
    stable = trainer.step([group])
    assert stable["is_rejected_fraction"] == pytest.approx(COMPLETION / (2 * COMPLETION))
    # the plain loss ignores μ: nothing rejected
    trainer.loss_cfg = replace(trainer.loss_cfg, is_mode="none")
    assert "is_rejected_fraction" not in trainer.step([group])
