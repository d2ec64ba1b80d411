"""MoE routers in the GRPO step (trainer/step/router.py): the load-balancing loss as the config asks for it, and
the load-balance metrics, on the tiny MoE families of atropos_cli/families.py."""

from __future__ import annotations

import random

import pytest
import torch
from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func

from atropos_cli.families import build
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
from atropos_cli.trainer.step.router import Router, router_for
from atropos_cli.types import ScoredGroup

VOCAB = 96


def test_aux_loss_is_transformers_own_with_and_without_padding() -> None:
    gen = torch.Generator().manual_seed(0)
    layers = tuple(torch.randn(2 * 7, 8, generator=gen) for _ in range(3))  # 2 rows of 7 tokens, 8 experts
    mask = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    router = Router(experts=8, top_k=2, coef=0.01)
    for m in (mask, torch.ones_like(mask)):
        aux, high, low = router.stats(layers, m)
        expected = load_balancing_loss_func(layers, 8, 2, m if m is mask else None)
        assert abs(aux.item() - float(expected)) < 1e-5
        assert high.item() >= 1.0 >= low.item() >= 0.0


def test_balanced_routing_reads_one_and_a_dead_expert_reads_zero() -> None:
    router = Router(experts=4, top_k=1, coef=0.0)
    balanced = torch.eye(4).repeat(2, 1) * 10  # 8 tokens, two to each expert
    aux, high, low = router.stats((balanced,), torch.ones(8))
    assert high.item() == pytest.approx(1.0) and low.item() == pytest.approx(1.0)
    assert aux.item() == pytest.approx(1.0, abs=1e-3)  # E * sum(1/E * ~1/E)
    skewed = torch.zeros(8, 4)
    skewed[:, 0] = 10  # every token to expert 0
    aux, high, low = router.stats((skewed,), torch.ones(8))
    assert high.item() == pytest.approx(4.0) and low.item() == 0.0 and aux.item() > 3.9


@pytest.mark.parametrize("name", ["qwen3_moe", "olmoe", "gpt_oss"])
def test_router_reads_each_moe_config(name: str) -> None:
    config = build(name, VOCAB, tiny=True).config
    router = router_for(config)
    assert router is not None and router.experts > router.top_k >= 1
    assert router.coef == 0.0  # the published configs leave output_router_logits off
    config.output_router_logits = True
    assert router_for(config).coef == config.router_aux_loss_coef > 0
    assert router_for(build("qwen3", VOCAB, tiny=True).config) is None


def _groups() -> list[ScoredGroup]:
    rng = random.Random(0)
    seqs = [[rng.randrange(3, VOCAB) for _ in range(n)] for n in (20, 14, 17, 11)]
    return [
        ScoredGroup(
            tokens=seqs,
            masks=[[-100] * 5 + s[5:] for s in seqs],
            scores=[1.0, 0.0, 0.5, 0.0],
            generation_params={"temperature": 1.0},
        )
    ]


def _step(aux_on: bool, coef: float = 0.5) -> tuple[dict, dict[str, torch.Tensor]]:
    torch.manual_seed(0)
    model = build("qwen3_moe", VOCAB, tiny=True)
    model.config.output_router_logits = aux_on
    model.config.router_aux_loss_coef = coef
    trainer = GRPOTrainer(GRPOConfig(out="unused", chunk_size=16, lr=1e-2, micro_batch_tokens=48), model=model)
    metrics = trainer.step(_groups())
    gates = {n: p.detach().clone() for n, p in model.named_parameters() if "gate.weight" in n}
    return metrics, gates


def test_a_step_reports_load_balance_and_adds_the_aux_loss_only_when_the_config_asks() -> None:
    off, gates_off = _step(aux_on=False)
    on, gates_on = _step(aux_on=True)
    for metrics in (off, on):
        assert metrics["moe_aux_loss"] > 0.5  # 2 (top-2) when balanced
        assert metrics["moe_load_max"] >= 1.0 >= metrics["moe_load_min"] >= 0.0
    assert on["moe_aux_loss"] == pytest.approx(off["moe_aux_loss"], rel=1e-5)  # the same forward
    assert on["loss"] == pytest.approx(off["loss"] + 0.5 * off["moe_aux_loss"], rel=1e-4)
    assert len(gates_on) >= 2  # the routers' weights, one per layer
    moved = max((gates_on[n] - gates_off[n]).abs().max().item() for n in gates_on)
    assert moved > 0  # the aux loss reached the routers


def test_a_dense_model_reports_no_router_metrics() -> None:
    model = build("qwen3", VOCAB, tiny=True)
    metrics = GRPOTrainer(GRPOConfig(out="unused", chunk_size=16), model=model).step(_groups())
    assert "moe_aux_loss" not in metrics and metrics["trained_tokens"] > 0
