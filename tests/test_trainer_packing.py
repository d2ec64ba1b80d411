"""Packed micro-batches (samples end to end in one row, no padding) train exactly like padded ones, and only
trained positions reach the LM head."""

from __future__ import annotations

import pytest
import torch

from atropos_cli.trainer.batching import micro_batches, prepare
from atropos_cli.trainer.grpo import GRPOConfig, GRPOTrainer, use_packing
from atropos_cli.trainer.losses import Normaliser, policy_loss
from atropos_cli.types import ScoredGroup
from tiny_models import tiny_causal_lm

VOCAB = 89


def tiny_qwen(seed: int = 0):
    return tiny_causal_lm("qwen", VOCAB, seed)


def ragged_groups() -> list[ScoredGroup]:
    """Groups whose rollouts differ in prompt and completion length, sampled at different temperatures."""
    gen = torch.Generator().manual_seed(3)
    groups = []
    for g, temperature in enumerate((1.0, 0.7, 1.3)):
        tokens, masks = [], []
        for i in range(4):
            prompt, completion = 2 + (g + i) % 4, 3 + (5 * i + g) % 9
            ids = torch.randint(1, VOCAB, (prompt + completion,), generator=gen).tolist()
            tokens.append(ids)
            masks.append([-100] * prompt + ids[prompt:])
        groups.append(
            ScoredGroup(
                tokens=tokens,
                masks=masks,
                scores=[1.0, 0.0, 0.5, 0.0],
                generation_params={"temperature": temperature},
                inference_logprobs=[[-1.0] * len(t) for t in tokens],
            )
        )
    return groups


def test_packing_fills_rows_without_padding_within_the_budget():
    samples = prepare(ragged_groups(), scale_rewards=True, dynamic_sampling=False, max_len=64).samples
    batches = micro_batches(samples, max_tokens=40, pack=True)
    assert sum(b.loss_mask.shape[0] for b in batches) == len(samples) == 12
    assert sum(int(b.attention_mask.sum()) for b in batches) == sum(len(s.tokens) - 1 for s in samples)
    for b in batches:
        assert b.input_ids.shape[0] == 1 and b.input_ids.shape[1] <= 40
        assert not b.padded and int(b.attention_mask.sum()) == b.input_ids.numel()
        assert b.packed == (b.loss_mask.shape[0] > 1)
        # positions restart at 0 for each sample in the row
        if b.packed:
            assert int((b.position_ids == 0).sum()) == b.loss_mask.shape[0]
        # each trained position is read from the model layout and lands in the loss layout, once
        assert len(b.select) == len(b.place) == int(b.loss_mask.sum())
        assert b.loss_mask.reshape(-1)[b.place].eq(1).all()
    # fewer model tokens than padding the same samples
    padded = micro_batches(samples, max_tokens=40)
    assert sum(b.input_ids.numel() for b in batches) < sum(b.input_ids.numel() for b in padded)


def _gradients(model, trainer, samples, pack: bool) -> dict[str, torch.Tensor]:
    model.zero_grad()
    norm = Normaliser(len(samples), sum(s.num_trained for s in samples))
    for mb in micro_batches(samples, max_tokens=40, pack=pack):
        logp = trainer._logprobs(model, mb)
        assert logp.shape == mb.loss_mask.shape
        assert logp[mb.loss_mask == 0].eq(0).all()  # untrained positions never got logits
        loss = policy_loss(logp, mb.advantages, mb.loss_mask, trainer.loss_cfg, norm, inference_logp=mb.inference_logp)
        loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss", ["grpo", "gspo", "dr_grpo"])
def test_packed_and_padded_micro_batches_give_the_same_gradient(loss: str):
    model = tiny_qwen()
    trainer = GRPOTrainer(GRPOConfig(out="unused", loss=loss, is_mode="truncate", chunk_size=7), model=model)
    samples = prepare(ragged_groups(), scale_rewards=True, dynamic_sampling=False, max_len=64).samples
    padded = _gradients(model, trainer, samples, pack=False)
    packed = _gradients(model, trainer, samples, pack=True)
    assert padded.keys() == packed.keys()
    for name, grad in padded.items():
        err = (packed[name] - grad).norm() / grad.norm().clamp_min(1e-12)
        assert err < 1e-4, f"{name}: packed vs padded gradient differs by {err:.2e}"


def test_a_packed_step_trains_like_a_padded_one():
    groups = ragged_groups()
    results = []
    for pack in (False, True):
        model = tiny_qwen()
        trainer = GRPOTrainer(GRPOConfig(out="unused", pack=pack, micro_batch_tokens=40, lr=1e-3), model=model)
        metrics = trainer.step(groups)
        results.append((metrics, {n: p.detach().clone() for n, p in model.named_parameters()}))
    (m_pad, w_pad), (m_pack, w_pack) = results
    assert m_pack["trained_tokens"] == m_pad["trained_tokens"]
    assert m_pack["padded_tokens"] < m_pad["padded_tokens"]  # no padding went through the model
    assert m_pack["loss"] == pytest.approx(m_pad["loss"], abs=1e-6)
    for name, weight in w_pad.items():
        assert torch.allclose(w_pack[name], weight, atol=1e-6), name


def test_packing_is_off_by_default_and_on_when_asked():
    assert GRPOConfig().pack is False
    assert use_packing(tiny_qwen(), True, "cpu") is True
    assert use_packing(tiny_qwen(), False, "cuda") is False
