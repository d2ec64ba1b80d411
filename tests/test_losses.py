"""Each loss preset, the KL estimators and the IS corrections on small hand-computed tensors."""

from __future__ import annotations

import math

import pytest
import torch

from atropos_cli.trainer.step.losses import LossStats, Normaliser, loss_config, policy_loss

# Two rollouts: the first trains 2 tokens (advantage +1), the second 1 token (advantage -1); column 2 of the
# second row is padding.
MASK = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ADV = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
NORM = Normaliser(num_sequences=2, num_tokens=3)


def _logp(values=((-1.0, -2.0, -3.0), (-0.5, -0.7, -0.9))):
    return torch.tensor(values, requires_grad=True)


def test_grpo_on_policy_sequence_mean_gradient():
    logp = _logp()
    loss = policy_loss(logp, ADV, MASK, loss_config("grpo"), NORM)
    loss.backward()
    # ratio = 1: loss = -(1/2)[(1+1)/2 + (-1)/1] = 0; d/dlogp = -(1/B)(1/|o_i|)A_i on trained tokens
    assert loss.item() == pytest.approx(0.0)
    expected = torch.tensor([[-0.25, -0.25, 0.0], [0.5, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected)


def test_grpo_clip_zeroes_gradient_outside_the_trust_region():
    logp = _logp()
    # ratios: row 0 -> e^{0.4}=1.49 (clipped for A>0), e^{-0.1}=0.905 (inside); row 1 -> e^{-0.5}=0.61 (A<0: clipped)
    old = logp.detach() - torch.tensor([[0.4, -0.1, 0.0], [-0.5, 0.0, 0.0]])
    loss = policy_loss(logp, ADV, MASK, loss_config("grpo"), NORM, old_logp=old)
    loss.backward()
    r01 = math.exp(-0.1)
    expected_loss = -0.5 * ((1.2 * 1 + r01 * 1) / 2 + (0.8 * -1) / 1)
    assert loss.item() == pytest.approx(expected_loss, rel=1e-6)
    expected_grad = torch.tensor([[0.0, -0.25 * r01, 0.0], [0.0, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected_grad, atol=1e-7)


def test_dapo_clip_higher_and_token_mean():
    logp = _logp()
    old = logp.detach() - torch.tensor([[0.22, 0.0, 0.0], [0.0, 0.0, 0.0]])  # r = 1.246: inside 1.28, not 1.2
    cfg = loss_config("dapo")
    assert (cfg.clip_low, cfg.clip_high, cfg.aggregation, cfg.dynamic_sampling) == (0.2, 0.28, "token_mean", True)
    loss = policy_loss(logp, ADV, MASK, cfg, NORM, old_logp=old)
    loss.backward()
    r = math.exp(0.22)
    assert loss.item() == pytest.approx(-(r + 1 - 1) / 3, rel=1e-6)
    assert torch.allclose(logp.grad, torch.tensor([[-r / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))
    # the same ratio under plain GRPO is clipped: no gradient on that token
    logp2 = _logp()
    policy_loss(logp2, ADV, MASK, loss_config("grpo"), NORM, old_logp=old).backward()
    assert logp2.grad[0, 0].item() == 0.0


def test_dr_grpo_constant_normaliser():
    logp = _logp()
    cfg = loss_config("dr_grpo", max_completion_len=4)
    assert cfg.scale_rewards is False
    loss = policy_loss(logp, ADV, MASK, cfg, NORM)
    loss.backward()
    # -(1/(B*L_max)) Σ A = -(1+1-1)/8
    assert loss.item() == pytest.approx(-1 / 8)
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 8, -1 / 8, 0.0], [1 / 8, 0.0, 0.0]]))


def test_gspo_sequence_ratio():
    logp = _logp()
    old = logp.detach() - torch.tensor([[2e-4, 4e-4, 9.0], [1e-3, 0.0, 0.0]])  # padding value ignored
    loss = policy_loss(logp, ADV, MASK, loss_config("gspo"), NORM, old_logp=old)
    loss.backward()
    s0 = math.exp(3e-4)  # exp(mean(2e-4, 4e-4)): inside [1-3e-4, 1+4e-4]
    s1 = math.exp(1e-3)  # A<0 and s above the band: min(s·A, clip·A) = s·A, unclipped
    assert loss.item() == pytest.approx(-0.5 * (s0 * 1 + s1 * -1), abs=1e-7)
    # d s_i / d logp_{i,t} = s_i / |o_i|
    expected = torch.tensor([[-0.5 * s0 / 2, -0.5 * s0 / 2, 0.0], [0.5 * s1, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, rtol=1e-5)


def test_cispo_clipped_weight_never_drops_gradient():
    logp = _logp()
    old = logp.detach() - torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.0, 0.0]])  # r = e^2 = 7.39 -> weight 5
    cfg = loss_config("cispo")
    loss = policy_loss(logp, ADV, MASK, cfg, NORM, old_logp=old)
    loss.backward()
    # loss = -(1/N)Σ sg(clip(r))·A·logp ; grad = -(1/N)·clip(r)·A
    assert loss.item() == pytest.approx(-(5.0 * -1.0 + 1.0 * -2.0 + 1.0 * -1.0 * -0.5) / 3, rel=1e-6)
    assert torch.allclose(logp.grad, torch.tensor([[-5 / 3, -1 / 3, 0.0], [1 / 3, 0.0, 0.0]]))


@pytest.mark.parametrize(
    ("kind", "expected"),
    [("k1", lambda d: d), ("k3", lambda d: math.exp(-d) + d - 1)],  # d = logp - ref_logp
)
def test_kl_estimators(kind, expected):
    logp = _logp()
    ref = logp.detach() - torch.tensor([[0.5, -0.3, 0.0], [0.2, 0.0, 0.0]])
    zero_adv = torch.zeros_like(ADV)
    cfg = loss_config("grpo", kl_beta=0.1, kl_estimator=kind)
    loss = policy_loss(logp, zero_adv, MASK, cfg, NORM, ref_logp=ref)
    want = 0.1 * 0.5 * ((expected(0.5) + expected(-0.3)) / 2 + expected(0.2))
    assert loss.item() == pytest.approx(want, rel=1e-5)


def test_truncated_importance_sampling_weights_tokens():
    logp = _logp()
    # ρ = π_old/μ = exp(logp - inf): 3.0 (truncated to 2), 0.5, 1.0
    inf = logp.detach() - torch.log(torch.tensor([[3.0, 0.5, 1.0], [1.0, 1.0, 1.0]]))
    cfg = loss_config("dapo", is_mode="truncate", is_max=2.0)
    loss = policy_loss(logp, ADV, MASK, cfg, NORM, inference_logp=inf)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2 / 3, -0.5 / 3, 0.0], [1 / 3, 0.0, 0.0]]), rtol=1e-5)
    assert loss.item() == pytest.approx(-(2.0 + 0.5 - 1.0) / 3, rel=1e-5)


def test_masked_importance_sampling_drops_outliers():
    logp = _logp()
    inf = logp.detach() - torch.log(torch.tensor([[3.0, 0.5, 1.0], [0.1, 1.0, 1.0]]))
    cfg = loss_config("dapo", is_mode="mask", is_min=0.2, is_max=2.0)
    policy_loss(logp, ADV, MASK, cfg, NORM, inference_logp=inf).backward()
    # 3.0 and 0.1 lie outside [0.2, 2]: those tokens contribute nothing; 0.5 weights its token by 0.5
    assert torch.allclose(logp.grad, torch.tensor([[0.0, -0.5 / 3, 0.0], [0.0, 0.0, 0.0]]), rtol=1e-5)


def test_decoupled_ppo_weights_tokens_by_the_untruncated_ratio():
    logp = _logp()
    inf = logp.detach() - torch.log(torch.tensor([[3.0, 0.5, 1.0], [0.1, 1.0, 1.0]]))
    loss = policy_loss(logp, ADV, MASK, loss_config("dapo", is_mode="decoupled"), NORM, inference_logp=inf)
    loss.backward()
    # weights ρ = 3.0, 0.5 (advantage +1), 0.1 (advantage -1), token-mean over 3 tokens, r = 1
    assert torch.allclose(logp.grad, torch.tensor([[-1.0, -0.5 / 3, 0.0], [0.1 / 3, 0.0, 0.0]]), rtol=1e-5)
    assert loss.item() == pytest.approx(-(3.0 + 0.5 - 0.1) / 3, rel=1e-5)


def test_stable_drops_sequences_far_from_the_sampler_and_pulls_toward_it():
    logp = _logp()
    rho = torch.tensor([[3.0, 0.5, 1.0], [1.05, 1.0, 1.0]])
    inf = logp.detach() - torch.log(rho)
    cfg = loss_config("dapo", is_mode="stable", is_max=2.0)  # stable_seq_kl 0.05, stable_kl 0.01
    stats = LossStats()
    loss = policy_loss(logp, ADV, MASK, cfg, NORM, inference_logp=inf, stats=stats)
    loss.backward()
    # row 0's divergence mean(ρ - 1 - ln ρ) = ((2 - ln 3) + (-0.5 + ln 2)) / 2 = 0.547 > 0.05: dropped whole;
    # row 1's = 0.05 - ln 1.05 = 0.0012: kept, weight min(1.05, 2) = 1.05, advantage -1
    # the pull: 0.01 * (1/ρ + ln ρ - 1) per token, token-mean; its gradient 0.01 * (1 - 1/ρ) / 3
    pull = [1 / r + math.log(r) - 1 for r in (3.0, 0.5, 1.05)]
    assert loss.item() == pytest.approx(1.05 / 3 + 0.01 * sum(pull) / 3, rel=1e-5)
    grad = [[0.01 * (1 - 1 / 3.0) / 3, 0.01 * (1 - 1 / 0.5) / 3, 0.0], [1.05 / 3 + 0.01 * (1 - 1 / 1.05) / 3, 0.0, 0.0]]
    assert torch.allclose(logp.grad, torch.tensor(grad), rtol=1e-5)
    assert stats.floats()["is_rejected_tokens"] == 2.0  # row 0's two tokens


@pytest.mark.parametrize("name", ["grpo", "dapo", "dr_grpo", "gspo", "cispo"])
def test_micro_batch_losses_add_up_to_the_full_batch(name):
    torch.manual_seed(0)
    base = torch.randn(4, 5)
    mask = (torch.rand(4, 5) > 0.3).float()
    mask[:, 0] = 1.0
    adv = torch.randn(4, 1).expand(4, 5).contiguous()
    old = base - 0.1 * torch.randn(4, 5)
    norm = Normaliser(num_sequences=4, num_tokens=int(mask.sum()))
    cfg = loss_config(name)
    full_logp = base.clone().requires_grad_(True)
    full = policy_loss(full_logp, adv, mask, cfg, norm, old_logp=old)
    full.backward()
    parts_logp = base.clone().requires_grad_(True)
    total = sum(
        policy_loss(parts_logp[s], adv[s], mask[s], cfg, norm, old_logp=old[s]) for s in (slice(0, 1), slice(1, 4))
    )
    total.backward()
    assert total.item() == pytest.approx(full.item(), rel=1e-5, abs=1e-7)
    assert torch.allclose(parts_logp.grad, full_logp.grad, atol=1e-6)


def test_unknown_preset_is_a_key_error():
    with pytest.raises(KeyError):
        loss_config("ppo2")


def test_distill_loss_value_and_gradient_on_hand_computed_tensors() -> None:
    """Two sequences, three positions. Student log-probs s, teacher log-probs t, mask m (the last token of the
    second sequence has no teacher logprob). k = s - t on covered tokens:
      row 0: (-1.0+2.0, -0.5+0.5, -2.0+1.0) = (1.0, 0.0, -1.0)
      row 1: (-0.2+1.2, -1.5+1.0, masked)   = (1.0, -0.5, 0)
    loss = sum(m * k * s) / N with N = 5 trained tokens
         = (1.0*-1.0 + 0 + -1.0*-2.0 + 1.0*-0.2 + -0.5*-1.5) / 5 = (-1 + 2 - 0.2 + 0.75) / 5 = 0.31
    d loss / d s = m * k / N (k is held constant): (0.2, 0, -0.2; 0.2, -0.1, 0)."""
    from atropos_cli.trainer.step.losses import Normaliser, distill_loss

    student = torch.tensor([[-1.0, -0.5, -2.0], [-0.2, -1.5, -0.7]], requires_grad=True)
    teacher = torch.tensor([[-2.0, -0.5, -1.0], [-1.2, -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    loss = distill_loss(student, teacher, mask, Normaliser(num_sequences=2, num_tokens=5))
    assert loss.item() == pytest.approx(0.31)
    loss.backward()
    expected = torch.tensor([[0.2, 0.0, -0.2], [0.2, -0.1, 0.0]])
    assert torch.allclose(student.grad, expected)


def test_teacher_logprobs_of_the_sampled_tokens() -> None:
    from atropos_cli.trainer.step.batching import teacher_logprobs

    tokens = [5, 7, 9, 4]
    top_ids = [[], [7, 8], [1, 2], [4, 9]]  # position 0 has none (vLLM's prompt_logprobs start at None)
    top_lps = [[], [-0.1, -2.0], [-0.3, -0.4], [-0.5, -0.9]]
    got = teacher_logprobs(tokens, top_ids, top_lps)
    assert got[0] == -0.1 and math.isnan(got[1]) and got[2] == -0.5
