"""Attention exactly as a model's layer defines it: causal, within a sliding window, with attention sinks and
soft-capped scores.

Where it sits: transformers hands every attention function a layer's variant as keyword arguments
(`sliding_window`, `s_aux` for sinks, `softcap`, `scaling`) beside the mask it built. The fast kernels the
engine (`inference/engine.py`, `decode_attention.py`) and the trainer (`trainer/step/attention.py`) use each cover
part of that: SDPA and the memory-efficient kernel take a mask but no sinks or soft-cap; torch's varlen flash
kernel takes a window but no sinks. `LayerVariant.of` reads the variant off those keyword arguments, once per
call, so every path sees what the layer asked for; `masked_attention` is the exact reference those paths use where
no kernel covers a variant; `describe` is what a model needs, read off its modules, for the paths to say which
one they take.

The window follows transformers' masks: a query at position p sees keys at positions (p - window, p].
Sinks (gpt-oss) add one learned logit per query head to the softmax's denominator, with no value behind it.
Soft-capping (Gemma 2) maps each score s to cap * tanh(s / cap) before the mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["LayerVariant", "ModelAttention", "describe", "masked_attention", "sequence_attention", "window_allows"]


@dataclass(frozen=True)
class LayerVariant:
    """What one attention call asks for beyond plain causal attention."""

    window: int | None = None  # keys within (p - window, p] of a query at p; None: all earlier keys
    sinks: Any = None  # [query heads] learned logits (a tensor), or None
    softcap: float | None = None

    @staticmethod
    def of(kwargs: dict[str, Any]) -> LayerVariant:
        """The variant transformers passed to an attention function (its keyword arguments)."""
        window = kwargs.get("sliding_window")
        softcap = kwargs.get("softcap")
        return LayerVariant(
            window=int(window) if window else None,
            sinks=kwargs.get("s_aux"),
            softcap=float(softcap) if softcap else None,
        )

    @property
    def plain(self) -> bool:
        return self.window is None and self.sinks is None and self.softcap is None


def window_allows(q_pos: Any, k_pos: Any, window: int | None) -> Any:
    """Which keys each query may see: k_pos <= q_pos, and within the window. Broadcasts q_pos against k_pos."""
    allowed = k_pos <= q_pos
    if window is not None:
        allowed = allowed & (k_pos > q_pos - window)
    return allowed


def masked_attention(
    query: Any, key: Any, value: Any, allowed: Any, scaling: float, sinks: Any = None, softcap: float | None = None
) -> Any:
    """Softmax attention written out: query [B, Hq, Tq, D], key/value [B, Hk, Tk, D] (Hq a multiple of Hk),
    `allowed` a boolean mask broadcastable to [B, Hq, Tq, Tk]; scores in fp32, soft-capped, then masked, sinks
    in the denominator. Returns [B, Tq, Hq, D] in the query's dtype (transformers' attention output layout).
    A query row that may see no key gets zeros (not NaN)."""
    import torch

    hq, hk = query.shape[1], key.shape[1]
    if hq != hk:
        key, value = (x.repeat_interleave(hq // hk, dim=1) for x in (key, value))
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill(~allowed, float("-inf"))
    if sinks is not None:
        sink = sinks.float().reshape(1, hq, 1, 1).expand(scores.shape[0], hq, scores.shape[2], 1)
        scores = torch.cat([scores, sink], dim=-1)
    top = scores.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).min)  # finite for an all-masked row
    weights = torch.exp(scores - top)
    probs = weights / weights.sum(-1, keepdim=True).clamp_min(torch.finfo(torch.float32).tiny)
    if sinks is not None:
        probs = probs[..., :-1]
    out = torch.matmul(probs, value.float())
    return out.transpose(1, 2).to(query.dtype)


def sequence_attention(
    module: Any, query: Any, key: Any, value: Any, mask: Any, scaling: float | None = None, **kwargs: Any
) -> tuple[Any, None]:
    """A transformers attention function for a whole sequence (a prefill, an unpacked training or eval row):
    SDPA, with the layer's sliding window laid over the mask (a caller's own 4D mask, such as the engine's
    prefill mask, is the same for every layer), and the exact reference where the layer has sinks or
    soft-capped scores, which SDPA lacks. query [B, Hq, Tq, D] (the last Tq of Tk positions), key/value
    [B, Hk, Tk, D], mask boolean or additive [B, 1, Tq, Tk], or None (causal)."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    variant = LayerVariant.of(kwargs)
    if variant.plain:
        return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling, **kwargs)
    tq, tk = query.shape[2], key.shape[2]
    k_idx = torch.arange(tk, device=query.device)
    allowed = window_allows(k_idx[tk - tq :][:, None], k_idx[None, :], variant.window)[None, None]
    if mask is not None:  # transformers' boolean mask, or an additive one
        allowed = allowed & (mask if mask.dtype == torch.bool else mask == 0)
    if variant.sinks is None and variant.softcap is None:
        return sdpa_attention_forward(module, query, key, value, allowed, scaling=scaling, **kwargs)
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return masked_attention(query, key, value, allowed, scale, variant.sinks, variant.softcap), None


@dataclass(frozen=True)
class ModelAttention:
    """A decoder's attention, read off its config and modules: what the engine and the trainer must honour."""

    model_type: str
    windows: tuple[int | None, ...]  # per layer
    sinks: bool
    attn_softcap: float | None
    final_softcap: float | None
    qk_norm: bool
    partial_rotary: float | None
    nope_layers: int  # layers without rotary positions
    rope_type: str
    bidirectional: bool
    chunked: bool
    experts: int  # 0: dense

    @property
    def kind(self) -> str:
        """One line: the attention variants this model uses ("causal" when none)."""
        parts = []
        sliding = [w for w in self.windows if w is not None]
        if sliding:
            if len(sliding) == len(self.windows):
                parts.append(f"sliding window {sliding[0]}")
            else:
                parts.append(f"sliding window {sliding[0]} on {len(sliding)} of {len(self.windows)} layers")
        if self.sinks:
            parts.append("sinks")
        if self.attn_softcap:
            parts.append(f"score soft-cap {self.attn_softcap:g}")
        if self.final_softcap:
            parts.append(f"logit soft-cap {self.final_softcap:g}")
        if self.qk_norm:
            parts.append("qk-norm")
        if self.partial_rotary:
            parts.append(f"rotary on {self.partial_rotary:g} of each head")
        if self.nope_layers:
            parts.append(f"{self.nope_layers} NoPE layers")
        if self.rope_type not in ("default", ""):
            parts.append(f"{self.rope_type} rope")
        if self.experts:
            parts.append(f"{self.experts} experts")
        return "causal" + ("; " + ", ".join(parts) if parts else "")


def _layers(model: Any) -> list[Any]:
    inner = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    layers = getattr(inner, "layers", None)
    return list(layers) if layers is not None else []


def describe(model: Any) -> ModelAttention:
    """The attention facts of a transformers causal LM (its text part)."""
    cfg = model.config
    cfg = getattr(cfg, "text_config", None) or cfg
    layers = _layers(model)
    config_window = getattr(cfg, "sliding_window", None) if getattr(cfg, "layer_types", None) is None else None
    windows: list[int | None] = []
    sinks = qk_norm = False
    for layer in layers:
        attn = getattr(layer, "self_attn", None)
        window = getattr(attn, "sliding_window", config_window) if attn is not None else None
        windows.append(int(window) if window else None)
        sinks = sinks or getattr(attn, "sinks", None) is not None
        qk_norm = qk_norm or getattr(attn, "q_norm", None) is not None
    rope = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}
    if isinstance(rope, dict) and "rope_type" not in rope and all(isinstance(v, dict) for v in rope.values()):
        rope = next(iter(rope.values()), {})  # per-layer-type parameters (Gemma 3): the first kind's
    rope_type = str(rope.get("rope_type", rope.get("type", "default"))) if isinstance(rope, dict) else "default"
    partial = getattr(cfg, "partial_rotary_factor", None)
    if partial is None and isinstance(rope, dict):
        partial = rope.get("partial_rotary_factor")
    no_rope = getattr(cfg, "no_rope_layers", None) or []
    experts = getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None) or 0
    return ModelAttention(
        model_type=str(getattr(cfg, "model_type", type(model).__name__)),
        windows=tuple(windows),
        sinks=sinks,
        attn_softcap=getattr(cfg, "attn_logit_softcapping", None) or None,
        final_softcap=getattr(cfg, "final_logit_softcapping", None) or None,
        qk_norm=qk_norm,
        partial_rotary=float(partial) if partial and float(partial) < 1.0 else None,
        nope_layers=sum(1 for use in no_rope if not use),
        rope_type=rope_type,
        bidirectional=bool(getattr(cfg, "use_bidirectional_attention", False)),
        chunked=bool(getattr(cfg, "attention_chunk_size", None)),
        experts=int(experts),
    )
