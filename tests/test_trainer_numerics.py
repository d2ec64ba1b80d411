"""Numerics: chunked fp32 log-probs match the full-logits reference (values and gradients), advantages and
overrides follow the rules, and a small-lr step moves the fp32 master weights."""

from __future__ import annotations

import pytest
import torch

from atropos_cli.trainer.step.batching import group_advantages, micro_batches, prepare
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
from atropos_cli.trainer.step.logprobs import flat_token_logprobs, naive_token_logprobs
from atropos_cli.types import ScoredGroup
from tiny_models import tiny_causal_lm

VOCAB = 97


def tiny_llama(seed: int = 0):
    return tiny_causal_lm("llama", VOCAB, seed)


def group(scores, prompt_len=3, completion_len=4, seed=0, **extra) -> ScoredGroup:
    gen = torch.Generator().manual_seed(seed)
    tokens, masks = [], []
    for _ in scores:
        ids = torch.randint(1, VOCAB, (prompt_len + completion_len,), generator=gen).tolist()
        tokens.append(ids)
        masks.append([-100] * prompt_len + ids[prompt_len:])
    return ScoredGroup(tokens=tokens, masks=masks, scores=list(scores), **extra)


@pytest.mark.parametrize("softcap", [None, 2.0])
def test_chunked_logprobs_match_full_logits_values_and_gradients(softcap):
    """Also with a final-logit soft-cap (Gemma 2's cap * tanh(logits / cap)), whose slope backward applies."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 7, 16, dtype=torch.float64).float().requires_grad_(True)
    weight = torch.randn(VOCAB, 16).requires_grad_(True)
    targets = torch.randint(0, VOCAB, (3, 7))
    temps = torch.tensor([1.0, 0.7, 1.3])
    upstream = torch.randn(3, 7)

    inv_temps = (1.0 / temps)[:, None].expand(3, 7).reshape(-1)
    flat = flat_token_logprobs(
        hidden.reshape(-1, 16), weight, targets.reshape(-1), inv_temps, chunk_size=5, softcap=softcap
    )
    ours = flat.reshape(3, 7)  # 21 tokens: 5 chunks, the last one short
    (ours * upstream).sum().backward()
    g_h, g_w = hidden.grad.clone(), weight.grad.clone()
    hidden.grad, weight.grad = None, None
    ref = naive_token_logprobs(hidden, weight, targets, temps, softcap=softcap)
    (ref * upstream).sum().backward()
    if softcap is not None:  # the cap changed the values: the check is not the uncapped one again
        assert not torch.allclose(ref, naive_token_logprobs(hidden, weight, targets, temps), atol=1e-2)

    assert ours.dtype == torch.float32
    assert torch.allclose(ours, ref, atol=1e-5)
    assert torch.allclose(g_h, hidden.grad, atol=1e-5)
    assert torch.allclose(g_w, weight.grad, atol=1e-5)


def test_loss_gradient_through_the_model_matches_a_full_logits_fp32_reference():
    model = tiny_llama()
    trainer = GRPOTrainer(GRPOConfig(out="unused", chunk_size=8, lr=1e-5), model=model)
    prepared = prepare([group([1.0, 0.0, 0.5, 0.0])], scale_rewards=True, dynamic_sampling=False, max_len=64)
    (mb,) = micro_batches(prepared.samples, max_tokens=1024)
    logp = trainer._logprobs(model, mb)
    (logp * mb.advantages * mb.loss_mask).sum().backward()
    ours = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits.double()
    ref = torch.log_softmax(logits, -1).gather(-1, mb.targets[..., None]).squeeze(-1)
    (ref * mb.advantages * mb.loss_mask).sum().backward()
    for name, param in model.named_parameters():
        err = (ours[name] - param.grad).norm() / param.grad.norm().clamp_min(1e-12)
        assert err < 1e-4, f"{name}: relative gradient error {err:.2e}"


def test_small_lr_step_moves_fp32_master_weights():
    model = tiny_llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    trainer = GRPOTrainer(GRPOConfig(out="unused", lr=1e-6, grad_clip=1e9), model=model)
    metrics = trainer.step([group([1.0, 0.0, 1.0, 0.0]), group([0.0, 1.0, 0.0, 0.0], seed=1)])
    assert metrics["sequences"] == 8 and metrics["trained_tokens"] == 8 * 4
    changed = total = 0
    for name, param in model.named_parameters():
        if "norm" in name:
            continue
        changed += int((param.detach() != before[name]).sum())
        total += param.numel()
    # Every weight that got a gradient moves (embedding rows of unseen tokens get none).
    touched = sum(p.numel() for n, p in model.named_parameters() if "norm" not in n and "embed" not in n)
    assert changed >= touched
    # The same update applied to bf16 weights would be rounded away almost entirely: what fp32 masters avoid.
    w = before["model.layers.0.mlp.up_proj.weight"]
    assert ((w.bfloat16() + 1e-6).float() == w.bfloat16().float()).float().mean() > 0.9


def test_bf16_pure_keeps_an_fp32_master_that_small_steps_move():
    model = tiny_llama()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = GRPOConfig(out="unused", lr=1e-6, grad_clip=1e9, dtype="bf16-pure", micro_batch_tokens=16)
    trainer = GRPOTrainer(config, model=model)
    assert next(model.parameters()).dtype == torch.bfloat16
    trainer.step([group([1.0, 0.0, 1.0, 0.0]), group([0.0, 1.0, 0.0, 0.0], seed=1)])  # 4 micro-batches
    names = [n for n, _ in model.named_parameters()]
    master = dict(zip(names, trainer.precision.master, strict=True))
    up = "model.layers.0.mlp.up_proj.weight"
    assert (master[up] != before[up]).float().mean() > 0.99  # the fp32 master moved by ~1e-6 everywhere
    assert (model.get_parameter(up).float() != before[up].bfloat16().float()).float().mean() < 0.2  # bf16 barely
    assert torch.equal(model.get_parameter(up), master[up].bfloat16())


def test_group_advantages_zscore_and_dr_grpo():
    assert group_advantages([1.0, 0.0, 1.0, 0.0], scale=True) == pytest.approx([1.0, -1.0, 1.0, -1.0])
    assert group_advantages([3.0, 1.0], scale=False) == pytest.approx([1.0, -1.0])
    assert group_advantages([0.5], scale=True) == [0.0]
    assert group_advantages([2.0, 2.0, 2.0], scale=True) == [0.0, 0.0, 0.0]


def test_prepare_applies_overrides_shift_and_dynamic_sampling():
    g = group(
        [1.0, 0.0],
        overrides=[{"set_advantage_to_zero": True}, {"temperature": 0.5}],
        generation_params={"temperature": 0.9},
    )
    flat = group([1.0, 1.0], seed=2)
    prepared = prepare([g, flat], scale_rewards=True, dynamic_sampling=True, max_len=64)
    assert prepared.groups == 2 and prepared.dropped_no_signal == 1
    assert prepared.groups_with_signal == 1
    first, second = prepared.samples
    assert first.advantages == [0.0] * 6  # set_advantage_to_zero
    assert second.advantages == [-1.0] * 6
    assert first.temperature == 0.9 and second.temperature == 0.5  # override > generation_params
    # shift: position t predicts token t+1; the last 4 tokens (the completion) are trained
    assert first.trained == [False, False, True, True, True, True]
    kept = prepare([flat], scale_rewards=True, dynamic_sampling=False, max_len=64)
    assert len(kept.samples) == 2 and kept.samples[0].advantages == [0.0] * 6


def test_env_sent_per_token_advantages_win():
    g = group([1.0, 0.0], advantages=[[0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.0] * 7])
    sample = prepare([g], scale_rewards=True, dynamic_sampling=False, max_len=64).samples[0]
    assert sample.advantages == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.5, 0.6])


def test_micro_batches_respect_the_token_budget():
    groups = [group([1.0, 0.0], completion_len=n, seed=n) for n in (2, 5, 9, 12)]
    samples = prepare(groups, scale_rewards=True, dynamic_sampling=False, max_len=64).samples
    batches = micro_batches(samples, max_tokens=30)
    assert sum(b.input_ids.shape[0] for b in batches) == 8
    for b in batches:
        assert b.input_ids.numel() <= 30 or b.input_ids.shape[0] == 1
        assert int(b.loss_mask.sum()) == int(((b.loss_mask > 0) & (b.attention_mask > 0)).sum())


def test_fused_and_eager_chunk_gradients_agree():
    """The CUDA path compiles `_chunk_dlogits_fused`; it must compute what the eager in-place version does."""
    from atropos_cli.trainer.step.logprobs import _chunk_dlogits, _chunk_dlogits_fused

    torch.manual_seed(1)
    logits, targets = torch.randn(6, VOCAB) * 3, torch.randint(0, VOCAB, (6,))
    grad = torch.randn(6)
    for inv_temp in (None, torch.rand(6) + 0.5):
        scaled = logits if inv_temp is None else logits * inv_temp[:, None]
        lse = torch.logsumexp(scaled, dim=-1)
        eager = _chunk_dlogits(logits.clone(), targets, inv_temp, lse, grad, torch.float32)
        fused = _chunk_dlogits_fused(logits.clone(), targets, inv_temp, lse, grad, torch.float32)
        assert torch.allclose(eager, fused, atol=1e-6)


def test_dtype_auto_is_fp32_on_cpu_and_bf16_pure_on_cuda():
    from atropos_cli.trainer.step.grpo import resolve_dtype

    assert GRPOConfig().dtype == "auto"
    assert resolve_dtype("auto", "cpu") == "fp32" and resolve_dtype("auto", "cuda:1") == "bf16-pure"
    assert resolve_dtype("bf16", "cuda") == "bf16"
    trainer = GRPOTrainer(GRPOConfig(out="unused"), model=tiny_llama())
    assert trainer.precision.dtype == "fp32" and next(trainer.model.parameters()).dtype == torch.float32


def test_bf16_pure_bucketed_gradient_moves_equal_one_add_per_gradient(monkeypatch):
    """The bf16 gradients reach the fp32 accumulators in buckets (precision.BUCKET); over several micro-batches
    with a bucket that splits the parameters unevenly, every accumulator equals the one-add-each result."""
    import atropos_cli.trainer.step.precision as precision

    batch = [group([1.0, 0.0, 1.0, 0.0]), group([0.0, 1.0, 0.0, 0.0], seed=1)]
    grads = []
    for bucket in (1, 5):
        monkeypatch.setattr(precision, "BUCKET", bucket)
        config = GRPOConfig(out="unused", lr=1e-6, dtype="bf16-pure", micro_batch_tokens=16)
        trainer = GRPOTrainer(config, model=tiny_llama())
        trainer.precision.step = lambda clip: torch.zeros(())  # keep the accumulated gradients to compare
        trainer.step(batch)  # 4 micro-batches
        assert all(p.grad is None for p in trainer.precision.params)
        grads.append([m.grad.clone() for m in trainer.precision.master])
    assert len(grads[0]) > 5
    for one, bucketed in zip(*grads, strict=True):
        assert one.abs().sum() > 0
        torch.testing.assert_close(bucketed, one, rtol=0, atol=0)


def test_lm_head_chunks_never_end_in_a_single_row():
    """A 1-row chunk makes torch recompile the dynamic chunk kernels (size 1 is specialised): it joins the one
    before it; the chunks still cover every row once."""
    from atropos_cli.trainer.step.logprobs import _chunks

    assert _chunks(21, 5) == [(0, 5), (5, 10), (10, 15), (15, 21)]
    assert _chunks(20, 5)[-1] == (15, 20)
    assert _chunks(1, 5) == [(0, 1)]
    assert _chunks(0, 5) == []


def test_a_discarded_bf16_pure_precision_frees_its_model():
    """The gradient hooks must not reference the Precision: a cycle through a parameter's C++ hooks is one gc
    cannot collect, and every discarded trainer kept its model, master and optimizer state."""
    import gc
    import weakref

    from atropos_cli.trainer.step.precision import Precision

    model = tiny_llama()
    alive = weakref.ref(model)
    config = GRPOConfig(out="unused", lr=1e-6, dtype="bf16-pure", micro_batch_tokens=16)
    trainer = GRPOTrainer(config, model=model)
    assert isinstance(trainer.precision, Precision)
    trainer.step([group([1.0, 0.0, 1.0, 0.0])])  # the hooks fire
    del model, trainer
    gc.collect()
    assert alive() is None
