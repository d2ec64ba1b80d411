"""Packed micro-batches (samples end to end in one row, no padding) train exactly like padded ones, and only
trained positions reach the LM head."""

from __future__ import annotations

import functools

import pytest
import torch

from atropos_cli.trainer.step.batching import micro_batches, prepare
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer, packing_mode
from atropos_cli.trainer.step.losses import Normaliser, policy_loss
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
        if name.endswith("k_proj.bias"):
            # its gradient is exactly zero in math (a key bias shifts every score of a query alike): what is left
            # is rounding noise, whose sign AdamW's first step turns into +-lr either way
            continue
        assert torch.allclose(w_pack[name], weight, atol=1e-6), name


def test_packing_is_off_by_default_on_cpu_and_on_when_asked():
    assert GRPOConfig().pack is None  # auto: static packing on CUDA, padded on CPU
    assert packing_mode(tiny_qwen(), None, "cpu") == "off"
    assert packing_mode(tiny_qwen(), True, "cpu") == "rows"
    assert packing_mode(tiny_qwen(), False, "cuda") == "off"
    # fp32 on CUDA: the flash kernel computes in bf16/fp16 only, so packed rows take the dense varlen path
    assert packing_mode(tiny_qwen(), None, "cuda", "fp32") == "rows"


def test_static_packing_gives_every_micro_batch_one_shape_and_the_padded_gradient():
    """The CUDA default: rows of exactly `width` tokens, filler after the samples, pieces in `cu_seqlens`."""
    from atropos_cli.trainer.step.attention import use_varlen
    from atropos_cli.trainer.step.batching import StaticShape, static_micro_batches

    model = tiny_qwen()
    trainer = GRPOTrainer(GRPOConfig(out="unused", chunk_size=7), model=model)
    samples = prepare(ragged_groups(), scale_rewards=True, dynamic_sampling=False, max_len=64).samples
    padded = _gradients(model, trainer, samples, pack=False)
    shape = StaticShape(width=40, max_doc_len=16, max_docs=8)
    batches = static_micro_batches(samples, shape)
    assert {tuple(b.input_ids.shape) for b in batches} == {(1, 40)}
    assert {tuple(b.cu_seqlens.shape) for b in batches} == {(9,)}
    assert sum(b.loss_mask.shape[0] for b in batches) == len(samples)
    assert sum(b.real_tokens for b in batches) == sum(len(s.tokens) - 1 for s in samples)
    for b in batches:
        cu = b.cu_seqlens.tolist()
        assert cu[0] == 0 and cu[-1] == 40 and cu == sorted(cu)
        assert max(x - y for x, y in zip(cu[1:], cu, strict=False)) <= 16  # filler pieces too
        assert int((b.position_ids == 0).sum()) == sum(1 for x, y in zip(cu[1:], cu, strict=False) if x > y)
    use_varlen(model)
    model.zero_grad()
    norm = Normaliser(len(samples), sum(s.num_trained for s in samples))
    for mb in batches:
        logp = trainer._logprobs(model, mb)
        policy_loss(
            logp, mb.advantages, mb.loss_mask, trainer.loss_cfg, norm, inference_logp=mb.inference_logp
        ).backward()
    for name, grad in padded.items():
        err = (model.get_parameter(name).grad - grad).norm() / grad.norm().clamp_min(1e-12)
        assert err < 1e-4, f"{name}: static-packed vs padded gradient differs by {err:.2e}"


def test_static_shape_caps_samples_per_row():
    from atropos_cli.trainer.step.batching import StaticShape, static_micro_batches

    samples = prepare(ragged_groups(), scale_rewards=True, dynamic_sampling=False, max_len=64).samples
    shape = StaticShape(width=64, max_doc_len=64, max_docs=3)  # one piece kept for the filler: 2 samples a row
    batches = static_micro_batches(samples, shape)
    assert all(b.loss_mask.shape[0] <= 2 for b in batches) and len(batches) == 6
    assert StaticShape.for_budget(8192, 2048) == StaticShape(width=8192, max_doc_len=2048, max_docs=69)
    assert StaticShape.for_budget(1024, 4096).width == 4096  # a row holds the longest sample


def test_static_packed_steps_compile_once_whatever_the_lengths():
    """No recompiles after the first step: every static micro-batch reaches the compiled body with one shape."""
    from atropos_cli.trainer.step.attention import use_varlen

    graphs = []

    def count(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    model = tiny_qwen()
    trainer = GRPOTrainer(GRPOConfig(out="unused", micro_batch_tokens=48, max_len=32, lr=1e-3), model=model)
    use_varlen(model)
    trainer.pack = "static"
    torch._dynamo.reset()
    model.model.compile(backend=count)
    for seed in range(3):  # different lengths every step
        groups = ragged_groups()
        gen = torch.Generator().manual_seed(seed)
        for g in groups:
            cut = [int(torch.randint(4, len(t) + 1, (1,), generator=gen)) for t in g.tokens]
            g.tokens = [t[:c] for t, c in zip(g.tokens, cut, strict=True)]
            g.masks = [m[:c] for m, c in zip(g.masks, cut, strict=True)]
            g.inference_logprobs = [x[:c] for x, c in zip(g.inference_logprobs, cut, strict=True)]
        assert not trainer.step(groups).get("skipped")
    assert len(graphs) == 1


def test_compiled_layers_never_guard_on_the_row_width(monkeypatch):
    """Each compiled layer gets inductor's non-strict mix-order mode: by default its size checks become guards on
    the width (rows >= 4096, rows x hidden >= 5M), and a narrow last micro-batch recompiled every layer inside
    the timed steps on an H100 (1.5B: 3.21 s a step; 0.80 s without the guards)."""
    import torch._inductor.config as inductor_config

    from atropos_cli.trainer.step.attention import compile_body

    assert hasattr(inductor_config.triton, "mix_order_reduction_non_strict_mode")  # this torch has the switch
    calls = []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kwargs: calls.append((self, kwargs)))
    model = tiny_qwen()
    compile_body(model, model.model, regional=True)
    assert [module for module, _ in calls] == list(model.model.layers)
    assert all(kw["options"] == {"triton.mix_order_reduction_non_strict_mode": True} for _, kw in calls)


def test_static_micro_batches_are_collated_as_the_step_reaches_them(monkeypatch):
    """Each static micro-batch is collated just before its forward (the GPU starts after one collation, not all
    of them), exactly once, and the step trains on the same tensors as eager collation gives."""
    import atropos_cli.trainer.step.batching as batching
    from atropos_cli.trainer.step.attention import use_varlen

    model = tiny_qwen()
    trainer = GRPOTrainer(GRPOConfig(out="unused", micro_batch_tokens=48, max_len=32, lr=1e-3), model=model)
    use_varlen(model)
    trainer.pack = "static"
    samples = prepare(ragged_groups(), scale_rewards=True, dynamic_sampling=False, max_len=32).samples
    deferred = trainer._micro_batches(samples)
    eager = batching.static_micro_batches(samples, trainer.static_shape)
    assert isinstance(deferred, batching.Deferred) and len(deferred) == len(eager) > 1
    assert deferred.widths() == [mb.input_ids.shape[1] for mb in eager]
    for lazy, built in zip(deferred, eager, strict=True):
        for name, value in vars(built).items():
            other = getattr(lazy, name)
            assert torch.equal(other, value) if isinstance(value, torch.Tensor) else other == value, name

    events = []
    collate, forward = batching.static_micro_batch, trainer._logprobs
    monkeypatch.setattr(batching, "static_micro_batch", lambda *a: events.append("collate") or collate(*a))
    monkeypatch.setattr(trainer, "_logprobs", lambda *a: events.append("forward") or forward(*a))
    trainer.policy = functools.partial(trainer._logprobs, model)
    assert not trainer.step(ragged_groups()).get("skipped")
    assert events == ["collate", "forward"] * len(eager)
