"""The Tinker API's built-in losses, per datum, summed over tokens (no normalisation, as Tinker's are).

Each takes the policy's log-probs of the target tokens `logp` [T] and the datum's `loss_fn_inputs` (numpy
arrays: `weights`, `logprobs` (the sampler's), `advantages`) and returns the datum's scalar loss. The clip
thresholds are ratios (`clip_low_threshold`, `clip_high_threshold` in `loss_fn_config`; 0.8 and 1.2 unless
set), `dro`'s penalty is `beta` (0.05 unless set).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from atropos_cli.tinker.errors import invalid, unsupported
from atropos_cli.tinker.wire import SDK_LOSSES, SERVED_LOSSES

# the loss_fn_inputs each loss reads (besides target_tokens)
NEEDS: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
    "gspo": ("logprobs", "advantages"),
}
DEFAULTS: dict[str, float] = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2, "beta": 0.05}


def check_loss(name: str, config: Mapping[str, float | str]) -> dict[str, float]:
    """The loss's numeric config (defaults filled in), or a 4xx naming what is wrong."""
    if name not in SERVED_LOSSES:
        if name in SDK_LOSSES:
            why = {
                "stable_reinforce": "it needs the sampler's stability records, which this server does not keep",
                "custom": "server-side custom losses are not served; the SDK runs forward_backward_custom "
                "client-side against this server",
            }[name]
            raise unsupported(
                f"loss_fn {name!r} is not supported: {why}", hint=f"use one of {', '.join(SERVED_LOSSES)}"
            )
        raise invalid(f"unknown loss_fn {name!r}", hint=f"use one of {', '.join(SERVED_LOSSES)}")
    out = dict(DEFAULTS)
    for key, value in config.items():
        if key not in DEFAULTS:
            raise invalid(f"loss_fn_config key {key!r} is not known", hint=f"keys: {', '.join(DEFAULTS)}")
        if not isinstance(value, (int, float)) or not np.isfinite(value):
            raise invalid(f"loss_fn_config {key!r} must be a finite number, got {value!r}")
        out[key] = float(value)
    if not 0 <= out["clip_low_threshold"] <= 1 <= out["clip_high_threshold"]:
        raise invalid("clip thresholds must satisfy 0 <= clip_low_threshold <= 1 <= clip_high_threshold")
    return out


def check_inputs(name: str, length: int, inputs: Mapping[str, np.ndarray], index: int) -> None:
    """Each input the loss reads is there, 1-D, as long as the datum's tokens, and finite."""
    for key in ("target_tokens", *NEEDS[name]):
        array = inputs.get(key)
        if array is None:
            raise invalid(f"datum {index}: loss {name!r} needs loss_fn_inputs[{key!r}]")
        if array.shape != (length,):
            raise invalid(
                f"datum {index}: loss_fn_inputs[{key!r}] has shape {list(array.shape)}; the input has {length} tokens",
                hint="one value per input token",
            )
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            raise invalid(f"datum {index}: loss_fn_inputs[{key!r}] has a NaN or infinite value")


def datum_loss(name: str, logp: Any, inputs: Mapping[str, Any], cfg: Mapping[str, float]) -> Any:
    """The scalar loss of one datum (torch); `inputs` are float32 tensors on logp's device."""
    return _LOSSES[name](logp, inputs, cfg)


def _ratio(logp: Any, inputs: Mapping[str, Any]) -> Any:
    import torch

    return torch.exp(logp - inputs["logprobs"])


def _cross_entropy(logp: Any, inputs: Mapping[str, Any], cfg: Mapping[str, float]) -> Any:
    return -(logp * inputs["weights"]).sum()


def _importance_sampling(logp: Any, inputs: Mapping[str, Any], cfg: Mapping[str, float]) -> Any:
    return -(_ratio(logp, inputs) * inputs["advantages"]).sum()


def _ppo(logp: Any, inputs: Mapping[str, Any], cfg: Mapping[str, float]) -> Any:
    import torch

    ratio, adv = _ratio(logp, inputs), inputs["advantages"]
    clipped = ratio.clamp(cfg["clip_low_threshold"], cfg["clip_high_threshold"])
    return -torch.minimum(ratio * adv, clipped * adv).sum()


def _cispo(logp: Any, inputs: Mapping[str, Any], cfg: Mapping[str, float]) -> Any:
    weight = _ratio(logp, inputs).clamp(cfg["clip_low_threshold"], cfg["clip_high_threshold"]).detach()
    return -(weight * logp * inputs["advantages"]).sum()


def _dro(logp: Any, inputs: Mapping[str, Any], cfg: Mapping[str, float]) -> Any:
    drift = logp - inputs["logprobs"]
    return -(logp * inputs["advantages"] - 0.5 * cfg["beta"] * drift * drift).sum()


def _gspo(logp: Any, inputs: Mapping[str, Any], cfg: Mapping[str, float]) -> Any:
    """GSPO: the sequence's geometric-mean ratio (its gradient flows through each token), clipped as PPO's."""
    import torch

    seq = torch.exp((logp - inputs["logprobs"]).mean())
    ratio = seq.detach() * torch.exp(logp - logp.detach())
    adv = inputs["advantages"]
    clipped = ratio.clamp(cfg["clip_low_threshold"], cfg["clip_high_threshold"])
    return -torch.minimum(ratio * adv, clipped * adv).sum()


_LOSSES: dict[str, Callable[[Any, Mapping[str, Any], Mapping[str, float]], Any]] = {
    "cross_entropy": _cross_entropy,
    "importance_sampling": _importance_sampling,
    "ppo": _ppo,
    "cispo": _cispo,
    "dro": _dro,
    "gspo": _gspo,
}
