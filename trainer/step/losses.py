"""The GRPO-family policy losses, as pure functions of per-token tensors (no model, no I/O).

Where it sits: `grpo.py` computes per-token log-probs of a micro-batch (`logprobs.py`), then calls
`policy_loss(...)` here with the micro-batch's advantages, masks and, where the rollouts carry them, inference
and reference log-probs. Formulas as the papers define them (notation: r = π_θ/π_old per token,
A = advantage, ε_low/ε_high = clip range, μ = the inference policy that sampled the tokens):

- **grpo**: PPO-clip per token, min(r·A, clip(r, 1-ε, 1+ε)·A); mean over a sequence's tokens, then over sequences.
- **dapo**: the same surrogate with clip-higher (ε_low 0.2, ε_high 0.28), summed over tokens and divided by the
  batch's total completion tokens ("token-mean"); groups with no reward spread are dropped (batching.py).
- **dr_grpo**: advantages without the std division (batching.py); sum over tokens / (sequences · L_max).
- **gspo**: one ratio per sequence, s = exp(mean_t log r); min(s·A, clip(s, 1-ε, 1+ε)·A), ε ≈ 3e-4/4e-4.
- **cispo**: sg[clip(r, 1-ε_low, 1+ε_high)] · A · log π_θ, token-mean (the clipped ratio only weights the
  gradient; no token's gradient is ever dropped).

Add-ons, for every preset: KL to a reference policy (k1 = log π_θ/π_ref, k3 = π_ref/π_θ - log(π_ref/π_θ) - 1)
times β; and the off-policy correction (`is_mode`) by ρ = π_old/μ per token from `inference_logprobs` (μ: the
weights that sampled the token, maybe several versions old; π_old: the trainer's own log-probs of the batch,
which is also the clip's centre, i.e. the proximal policy of decoupled PPO):
- **truncate** (TIS): weight min(ρ, C);
- **mask** (IcePop): weight ρ where C_min ≤ ρ ≤ C_max, else the token contributes nothing;
- **decoupled** (decoupled PPO, Hilton et al. 2021): weight ρ itself, untruncated (unbiased, unbounded);
- **stable** (in the spirit of the Tinker cookbook's async default, `stable_reinforce`): weight min(ρ, C) on the
  sequences whose sampler/trainer divergence KL̂ = mean_t (ρ_t − 1 − log ρ_t) is at most `stable_seq_kl`
  (others are dropped whole), plus `stable_kl` · (μ/π_θ − log(μ/π_θ) − 1) per token (the k3 term of the KL to
  a reference, with μ as the reference), which pulls π_θ back toward the sampler.
docs/training-async.md gives the formulas and their measured curves.

Normalisation across micro-batches: each call returns its micro-batch's share of the whole step's loss
(the divisor is the step's total sequence or token count), so summing the micro-batch losses — and their
gradients — gives exactly the full-batch loss. That is what makes gradient accumulation exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import torch

__all__ = [
    "LossConfig",
    "PRESETS",
    "LOSS_NAMES",
    "loss_config",
    "Normaliser",
    "policy_loss",
    "LossStats",
    "distill_loss",
]

Aggregation = Literal["seq_mean", "token_mean", "constant"]
Level = Literal["token", "sequence"]
Surrogate = Literal["ppo_clip", "cispo"]
ISMode = Literal["none", "truncate", "mask", "decoupled", "stable"]
KLKind = Literal["k1", "k3"]


@dataclass(frozen=True)
class LossConfig:
    """Every knob of the loss; a preset is one of these, and CLI flags override single fields."""

    name: str = "grpo"
    surrogate: Surrogate = "ppo_clip"
    level: Level = "token"
    aggregation: Aggregation = "seq_mean"
    clip_low: float = 0.2
    clip_high: float = 0.2
    scale_rewards: bool = True  # divide advantages by the group's std (GRPO) or not (Dr. GRPO)
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal (DAPO)
    kl_beta: float = 0.0
    kl_estimator: KLKind = "k3"
    is_mode: ISMode = "none"
    is_max: float = 2.0  # C_max of the train/inference IS weight
    is_min: float = 0.0  # C_min (masked mode only: ρ below it is masked)
    stable_seq_kl: float = 0.05  # stable mode: a sequence whose mean k3(ρ) is above this is dropped
    stable_kl: float = 0.01  # stable mode: weight of the k3 penalty toward the sampler (μ as the reference)
    max_completion_len: int = 1024  # L_max of Dr. GRPO's constant normaliser


PRESETS: dict[str, LossConfig] = {
    "grpo": LossConfig(name="grpo"),
    "dapo": LossConfig(name="dapo", aggregation="token_mean", clip_low=0.2, clip_high=0.28, dynamic_sampling=True),
    "dr_grpo": LossConfig(name="dr_grpo", aggregation="constant", scale_rewards=False),
    "gspo": LossConfig(name="gspo", level="sequence", clip_low=3e-4, clip_high=4e-4),
    "cispo": LossConfig(name="cispo", surrogate="cispo", aggregation="token_mean", clip_low=1.0, clip_high=4.0),
}
LOSS_NAMES = tuple(PRESETS)


def loss_config(name: str, **overrides: object) -> LossConfig:
    """A preset with some fields replaced (None values are ignored, so CLI defaults of None mean 'preset')."""
    if name not in PRESETS:
        raise KeyError(name)
    chosen = {k: v for k, v in overrides.items() if v is not None}
    return replace(PRESETS[name], **chosen)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Normaliser:
    """Counts over the WHOLE optimizer step (all micro-batches), so micro-batch losses add up exactly.

    Python ints, or 0-dim device tensors (a CUDA graph replays one recording for every step: its counts are
    inputs, graphs.py) that hold at least 1."""

    num_sequences: int | torch.Tensor
    num_tokens: int | torch.Tensor

    @property
    def token_divisor(self) -> int | torch.Tensor:
        """The token count to divide by: never 0."""
        return self.num_tokens if isinstance(self.num_tokens, torch.Tensor) else max(self.num_tokens, 1)


@dataclass
class LossStats:
    """Detached sums over a step's micro-batches, kept on the device: one host sync per step, not per token."""

    sums: dict[str, torch.Tensor | float] = field(default_factory=dict)

    def add(self, name: str, value: torch.Tensor | float) -> None:
        value = value.detach() if isinstance(value, torch.Tensor) else value
        self.sums[name] = self.sums.get(name, 0.0) + value

    def floats(self, **more: torch.Tensor) -> dict[str, float]:
        """The sums (and `more` device scalars) as floats, read in one device-to-host copy: one host sync."""
        values = {**self.sums, **more}
        tensors = {k: v for k, v in values.items() if isinstance(v, torch.Tensor)}
        read = torch.stack([t.float().reshape(()) for t in tensors.values()]).tolist() if tensors else []
        out = {k: float(v) for k, v in values.items() if not isinstance(v, torch.Tensor)}
        out.update(zip(tensors, read, strict=True))
        return out


def _clip_surrogate(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float) -> torch.Tensor:
    clipped = ratio.clamp(1.0 - low, 1.0 + high)
    return torch.minimum(ratio * adv, clipped * adv)


def _kl(logp: torch.Tensor, ref_logp: torch.Tensor, kind: KLKind) -> torch.Tensor:
    if kind == "k1":
        return logp - ref_logp
    log_ratio = ref_logp - logp  # log(π_ref/π_θ)
    return torch.exp(log_ratio) - log_ratio - 1.0


def _is_weight(old_logp: torch.Tensor, inf_logp: torch.Tensor, mask: torch.Tensor, cfg: LossConfig):
    """ρ = π_old/μ per token (or its geometric mean per sequence for sequence-level losses), corrected; and
    which tokens the correction rejected (truncated, masked or dropped with their sequence)."""
    log_rho = (old_logp - inf_logp) * mask
    token_log_rho = log_rho
    lengths = mask.sum(-1).clamp_min(1.0)
    if cfg.level == "sequence":
        log_rho = (log_rho.sum(-1) / lengths).unsqueeze(-1).expand_as(mask)
    rho = torch.exp(log_rho)
    if cfg.is_mode == "truncate":
        return rho.clamp(max=cfg.is_max), (rho > cfg.is_max).float()
    if cfg.is_mode == "decoupled":
        return rho, torch.zeros_like(rho)
    if cfg.is_mode == "stable":
        divergence = ((torch.exp(token_log_rho) - 1.0 - token_log_rho) * mask).sum(-1) / lengths
        keep = (divergence <= cfg.stable_seq_kl).float().unsqueeze(-1).expand_as(mask)
        return rho.clamp(max=cfg.is_max) * keep, 1.0 - keep
    keep = ((rho >= cfg.is_min) & (rho <= cfg.is_max)).float()
    return rho * keep, 1.0 - keep


def _aggregate(per_token: torch.Tensor, mask: torch.Tensor, cfg: LossConfig, norm: Normaliser) -> torch.Tensor:
    """Sum a [B, T] per-token term into this micro-batch's share of the step loss."""
    if cfg.aggregation == "seq_mean":
        lengths = mask.sum(-1).clamp_min(1.0)
        return ((per_token * mask).sum(-1) / lengths).sum() / norm.num_sequences
    if cfg.aggregation == "token_mean":
        return (per_token * mask).sum() / norm.token_divisor
    return (per_token * mask).sum() / (norm.num_sequences * cfg.max_completion_len)


def policy_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: LossConfig,
    norm: Normaliser,
    old_logp: torch.Tensor | None = None,
    inference_logp: torch.Tensor | None = None,
    ref_logp: torch.Tensor | None = None,
    stats: LossStats | None = None,
) -> torch.Tensor:
    """This micro-batch's share of the step loss. All tensors [B, T] fp32; `mask` is 1.0 on trained tokens.

    `old_logp` defaults to `logp.detach()` (one optimizer step per batch: r = 1 with the right gradient).
    `inference_logp` enables the IS correction (when `cfg.is_mode` is not 'none') and the mismatch metrics.
    """
    mask = mask.to(logp.dtype)
    old = logp.detach() if old_logp is None else old_logp
    log_ratio = (logp - old) * mask
    if cfg.level == "sequence":
        lengths = mask.sum(-1).clamp_min(1.0)
        seq_log_ratio = log_ratio.sum(-1) / lengths
        seq_adv = (advantages * mask).sum(-1) / lengths
        ratio_seq = torch.exp(seq_log_ratio)
        surrogate = _clip_surrogate(ratio_seq, seq_adv, cfg.clip_low, cfg.clip_high)
        per_token = surrogate.unsqueeze(-1).expand_as(mask)
        ratio = ratio_seq.unsqueeze(-1).expand_as(mask)
    else:
        ratio = torch.exp(log_ratio)
        if cfg.surrogate == "cispo":
            weight = ratio.detach().clamp(1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
            per_token = weight * advantages * logp
        else:
            per_token = _clip_surrogate(ratio, advantages, cfg.clip_low, cfg.clip_high)
    if cfg.is_mode != "none" and inference_logp is not None:
        weight, rejected = _is_weight(old, inference_logp, mask, cfg)
        per_token = per_token * weight.detach()
        if stats is not None:
            stats.add("is_rejected_tokens", (rejected * mask).sum())
    loss = -_aggregate(per_token, mask, cfg, norm)
    if cfg.is_mode == "stable" and cfg.stable_kl > 0.0 and inference_logp is not None:
        loss = loss + cfg.stable_kl * _aggregate(_kl(logp, inference_logp, "k3"), mask, cfg, norm)
    if cfg.kl_beta > 0.0 and ref_logp is not None:
        kl = _kl(logp, ref_logp, cfg.kl_estimator)
        loss = loss + cfg.kl_beta * _aggregate(kl, mask, cfg, norm)
        if stats is not None:
            stats.add("kl_sum", (kl.detach() * mask).sum())
    if stats is not None:
        _record(stats, ratio.detach(), advantages, mask, cfg, logp.detach(), inference_logp)
    return loss


def _record(stats, ratio, advantages, mask, cfg, logp, inference_logp) -> None:
    low, high = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high
    clipped = ((ratio > high) & (advantages > 0)) | ((ratio < low) & (advantages < 0))
    stats.add("tokens", mask.sum())
    stats.add("clipped_tokens", (clipped.float() * mask).sum())
    stats.add("ratio_sum", (ratio * mask).sum())
    if inference_logp is not None:
        gap = (logp - inference_logp) * mask
        stats.add("logprob_gap_sum", gap.sum())
        stats.add("logprob_gap_abs_sum", gap.abs().sum())


def distill_loss(logp: torch.Tensor, teacher_logp: torch.Tensor, mask: torch.Tensor, norm: Normaliser) -> torch.Tensor:
    """On-policy distillation: the reverse KL to the teacher, estimated on the sampled tokens.

    For a student π_θ that sampled y_t and a teacher π_T that scored it (its top-k prompt logprobs of the
    rollout, `distill_token_ids` / `distill_logprobs`), the per-token reverse KL estimate is
    k_t = log π_θ(y_t) − log π_T(y_t), and

        L_distill = Σ_t m_t · sg(k_t) · log π_θ(y_t) / N_tokens

    whose gradient Σ_t m_t · k_t · ∇log π_θ(y_t) / N is the score-function gradient of KL(π_θ ‖ π_T) per
    token (each token's own KL as its negative advantage, no credit to later tokens). `m_t` is 1 on trained
    positions where the teacher's top-k holds the sampled token (elsewhere the teacher gave no logprob);
    `N_tokens` is the step's trained-token count, so micro-batch shares sum to the step loss. `atropos train
    --distill-beta B` adds B · L_distill to the policy loss. The value itself is reported as mean k_t.
    """
    mask = mask.to(logp.dtype)
    reverse_kl = (logp.detach() - teacher_logp) * mask
    return (reverse_kl * logp).sum() / norm.token_divisor
