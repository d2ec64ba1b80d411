"""Which path each part of a run takes for a model, in words: said before a run's first step (`atropos train`)
and listed per family (`atropos models`).

The facts come from the places that decide: `inference.engine.refusal` (the static engine or the loop sampler),
`attention.describe` (the attention variants a model's layers ask for) and the trainer's own choices
(`GRPOTrainer.paths`: packing, CUDA graphs, one process, replicas or FSDP).
"""

from __future__ import annotations

from typing import Any

__all__ = ["VISION_TRAINING", "attention_line", "rollout_path", "trainer_attention_path"]

# how a vision-language model trains (trainer/step/vision_rows.py says why)
VISION_TRAINING = "padded rows, each image row its own micro-batch (vision tower + mrope positions), eager body"


def attention_line(model: Any) -> str:
    """`attention: ...`: the model type and its attention variants."""
    from atropos_cli.attention import describe

    facts = describe(model)
    return f"attention: {facts.model_type}, {facts.kind}"


def rollout_path(model: Any, cuda: bool) -> str:
    """How the local backend samples this model: the static engine (and its decode attention) or the loop
    sampler, and why."""
    from atropos_cli.inference.engine import decode_attention_for, refusal
    from atropos_cli.vision import is_vision_config

    refused = refusal(model)
    if is_vision_config(model.config):
        return f"loop sampler: the static engine refuses this model ({refused}); a prompt's choices a batch"
    if refused is not None:
        return f"loop sampler: the static engine refuses this model ({refused}); on CUDA ~20-30x slower"
    if not cuda:
        return "loop sampler (CPU; the static engine, CUDA graphs and the compiled step run on CUDA)"
    kind = decode_attention_for(model, is_cuda=True)
    extra = " (soft-capped scores: the plain path)" if kind == "plain" else ""
    return f"static engine: {kind} decode attention{extra}, compiled step, CUDA graphs"


def trainer_attention_path(model: Any) -> str:
    """How training rows attend on CUDA for this model: packed through the varlen flash kernel, or padded rows
    with the model's own attention where the kernel lacks a variant (sinks, soft-capped scores)."""
    from atropos_cli.attention import describe
    from atropos_cli.vision import is_vision_config

    if is_vision_config(model.config):
        return VISION_TRAINING
    facts = describe(model)
    slow = [name for flag, name in ((facts.sinks, "sinks"), (facts.attn_softcap, "soft-capped scores")) if flag]
    if slow:
        return f"padded rows, the model's own attention ({', '.join(slow)}: not in the varlen flash kernel)"
    windows = " with its sliding window" if any(facts.windows) else ""
    return f"varlen flash attention for packed rows{windows}"
