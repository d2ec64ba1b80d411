"""The model families atropos drives, each with its published shapes and a tiny test shape, built with random
weights from config values (no download).

Where it sits: `atropos models` lists these with the path each part takes (`paths.py`); the exactness tests
(`tests/test_model_families.py`) build every family's tiny shape and check the engine's and the trainer's
logprobs against transformers' eager forward; `benchmarks/bench_generation.py --family` and
`bench_trainer.py --family` build the published shapes at full depth.

A tiny shape keeps what makes its family different (windows shorter than the test sequences, interleaved layer
kinds, sinks, soft-caps, qk-norm, partial rotary, NoPE layers, llama3 rope scaling, experts), on 64-wide layers.
The published shapes are the config values of the released checkpoints (hidden size, layers, heads, windows,
experts, rope), so a benchmark row has the real model's cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FAMILIES", "Family", "build", "config_for", "family_of", "shape_names"]

_LLAMA3_ROPE = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192}  # fmt: skip


@dataclass(frozen=True)
class Family:
    """One family: its transformers model type, what sets it apart, its published shapes and its tiny one."""

    name: str
    model_type: str
    traits: str
    shapes: dict[str, dict[str, Any]]  # published shape name -> config values
    tiny: dict[str, Any] = field(default_factory=dict)  # config values of the test shape


_TINY = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 16, "num_hidden_layers": 4, "max_position_embeddings": 512}  # fmt: skip

FAMILIES: dict[str, Family] = {
    f.name: f
    for f in [
        Family(
            "qwen2",
            "qwen2",
            "the reference shape",
            {
                "Qwen2.5-0.5B": dict(
                    hidden_size=896,
                    intermediate_size=4864,
                    num_hidden_layers=24,
                    num_attention_heads=14,
                    num_key_value_heads=2,
                    vocab_size=151936,
                    tie_word_embeddings=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
            },
            {**_TINY, "tie_word_embeddings": True},
        ),
        Family(
            "qwen3",
            "qwen3",
            "qk-norm",
            {
                name: dict(
                    hidden_size=h,
                    intermediate_size=i,
                    num_hidden_layers=n,
                    num_attention_heads=q,
                    num_key_value_heads=8,
                    head_dim=128,
                    vocab_size=151936,
                    tie_word_embeddings=tie,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
                for name, h, i, n, q, tie in [
                    ("Qwen3-0.6B", 1024, 3072, 28, 16, True),
                    ("Qwen3-1.7B", 2048, 6144, 28, 16, True),
                    ("Qwen3-4B", 2560, 9728, 36, 32, True),
                    ("Qwen3-8B", 4096, 12288, 36, 32, False),
                ]
            },
            {**_TINY, "tie_word_embeddings": True},
        ),
        Family(
            "llama",
            "llama",
            "llama3 rope scaling",
            {
                name: dict(
                    hidden_size=h,
                    intermediate_size=i,
                    num_hidden_layers=n,
                    num_attention_heads=q,
                    num_key_value_heads=8,
                    head_dim=h // q,
                    vocab_size=128256,
                    tie_word_embeddings=tie,
                    rope_parameters={**_LLAMA3_ROPE, "rope_theta": 500000.0, "factor": factor},
                )
                for name, h, i, n, q, tie, factor in [
                    ("Llama-3.2-1B", 2048, 8192, 16, 32, True, 32.0),
                    ("Llama-3.2-3B", 3072, 8192, 28, 24, True, 32.0),
                    ("Llama-3.1-8B", 4096, 14336, 32, 32, False, 8.0),
                ]
            },
            # a short original context, so the scaled frequencies reach the test's positions
            {
                **_TINY,
                "rope_parameters": {
                    **_LLAMA3_ROPE,
                    "rope_theta": 500000.0,
                    "factor": 8.0,
                    "original_max_position_embeddings": 32,
                },
            },
        ),
        Family(
            "mistral",
            "mistral",
            "a uniform sliding window",
            {
                "Mistral-7B-v0.1": dict(
                    hidden_size=4096,
                    intermediate_size=14336,
                    num_hidden_layers=32,
                    num_attention_heads=32,
                    num_key_value_heads=8,
                    vocab_size=32000,
                    sliding_window=4096,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                )
            },
            {**_TINY, "sliding_window": 8},
        ),
        Family(
            "phi3",
            "phi3",
            "partial rotary (and a sliding window where the config sets one)",
            {
                "Phi-4-mini": dict(
                    hidden_size=3072,
                    intermediate_size=8192,
                    num_hidden_layers=32,
                    num_attention_heads=24,
                    num_key_value_heads=8,
                    vocab_size=200064,
                    tie_word_embeddings=True,
                    sliding_window=262144,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.75},
                )
            },
            {
                **{k: v for k, v in _TINY.items() if k != "head_dim"},
                "sliding_window": 8,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
            },
        ),
        Family(
            "smollm3",
            "smollm3",
            "NoPE layers (every 4th)",
            {
                "SmolLM3-3B": dict(
                    hidden_size=2048,
                    intermediate_size=11008,
                    num_hidden_layers=36,
                    num_attention_heads=16,
                    num_key_value_heads=4,
                    vocab_size=128256,
                    tie_word_embeddings=True,
                    no_rope_layer_interval=4,
                    rope_parameters={"rope_type": "default", "rope_theta": 5e6},
                )
            },
            {**{k: v for k, v in _TINY.items() if k != "head_dim"}, "no_rope_layer_interval": 2},
        ),
        Family(
            "gemma2",
            "gemma2",
            "interleaved windows, soft-capped scores and logits, scaled embeddings",
            {
                "Gemma-2-2B": dict(
                    hidden_size=2304,
                    intermediate_size=9216,
                    num_hidden_layers=26,
                    num_attention_heads=8,
                    num_key_value_heads=4,
                    head_dim=256,
                    vocab_size=256000,
                    sliding_window=4096,
                    query_pre_attn_scalar=256,
                    attn_logit_softcapping=50.0,
                    final_logit_softcapping=30.0,
                )
            },
            {
                **_TINY,
                "sliding_window": 8,
                "query_pre_attn_scalar": 16,
                "attn_logit_softcapping": 5.0,
                "final_logit_softcapping": 3.0,
            },
        ),
        Family(
            "gemma3",
            "gemma3_text",
            "5 local : 1 global layers, qk-norm, scaled embeddings",
            {
                "Gemma-3-1B": dict(
                    hidden_size=1152,
                    intermediate_size=6912,
                    num_hidden_layers=26,
                    num_attention_heads=4,
                    num_key_value_heads=1,
                    head_dim=256,
                    vocab_size=262144,
                    sliding_window=512,
                    query_pre_attn_scalar=256,
                    rope_parameters={
                        "full_attention": {"rope_type": "default", "rope_theta": 1e6},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    },
                ),
                "Gemma-3-4B": dict(
                    hidden_size=2560,
                    intermediate_size=10240,
                    num_hidden_layers=34,
                    num_attention_heads=8,
                    num_key_value_heads=4,
                    head_dim=256,
                    vocab_size=262208,
                    sliding_window=1024,
                    query_pre_attn_scalar=256,
                    rope_parameters={
                        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                    },
                ),
            },
            {
                **_TINY,
                "sliding_window": 8,
                "query_pre_attn_scalar": 16,
                "layer_types": ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"],
            },
        ),
        Family(
            "qwen3_moe",
            "qwen3_moe",
            "128 experts, 8 active",
            {
                "Qwen3-30B-A3B": dict(
                    hidden_size=2048,
                    intermediate_size=6144,
                    moe_intermediate_size=768,
                    num_hidden_layers=48,
                    num_attention_heads=32,
                    num_key_value_heads=4,
                    head_dim=128,
                    num_experts=128,
                    num_experts_per_tok=8,
                    vocab_size=151936,
                    norm_topk_prob=True,
                    rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                )
            },
            {**_TINY, "moe_intermediate_size": 32, "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": True},
        ),
        Family(
            "olmoe",
            "olmoe",
            "64 experts, 8 active, qk-norm",
            {
                "OLMoE-1B-7B": dict(
                    hidden_size=2048,
                    intermediate_size=1024,
                    num_hidden_layers=16,
                    num_attention_heads=16,
                    num_key_value_heads=16,
                    num_experts=64,
                    num_experts_per_tok=8,
                    vocab_size=50304,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
                )
            },
            {
                **{k: v for k, v in _TINY.items() if k != "head_dim"},
                "intermediate_size": 32,
                "num_experts": 8,
                "num_experts_per_tok": 2,
            },
        ),
        Family(
            "gpt_oss",
            "gpt_oss",
            "alternating windows, attention sinks, 32 experts",
            {
                "gpt-oss-20b": dict(
                    hidden_size=2880,
                    intermediate_size=2880,
                    num_hidden_layers=24,
                    num_attention_heads=64,
                    num_key_value_heads=8,
                    head_dim=64,
                    num_local_experts=32,
                    num_experts_per_tok=4,
                    vocab_size=201088,
                    sliding_window=128,
                )
            },
            {
                **_TINY,
                "intermediate_size": 32,
                "num_local_experts": 4,
                "num_experts_per_tok": 2,
                "sliding_window": 8,
                "rope_parameters": {
                    "rope_type": "yarn",
                    "factor": 32.0,
                    "beta_fast": 32.0,
                    "beta_slow": 1.0,
                    "rope_theta": 150000.0,
                    "original_max_position_embeddings": 16,
                },
            },
        ),
    ]
}


def shape_names() -> dict[str, str]:
    """Every published shape's name -> its family's name."""
    return {shape: f.name for f in FAMILIES.values() for shape in f.shapes}


def family_of(name: str) -> tuple[Family, str | None]:
    """A family (by family name) or a published shape (by its name): (family, shape name or None)."""
    from atropos_cli.errors import ConfigError

    if name in FAMILIES:
        return FAMILIES[name], None
    shapes = shape_names()
    if name in shapes:
        return FAMILIES[shapes[name]], name
    raise ConfigError(
        f"unknown model family or shape {name!r}",
        hint="one of: " + ", ".join([*FAMILIES, *shapes]),
    )


def config_for(name: str, vocab_size: int | None = None, layers: int | None = None, tiny: bool = False) -> Any:
    """The transformers config of a family's tiny shape (`tiny`, or a family name alone) or a published shape,
    optionally with another vocabulary (a tokenizer's) or fewer layers (interleaved layer kinds keep their
    pattern)."""
    from transformers import AutoConfig

    family, shape = family_of(name)
    values = dict(family.tiny if tiny or shape is None else family.shapes[shape])
    if vocab_size is not None:
        values["vocab_size"] = vocab_size
    values.setdefault("vocab_size", 512)
    for special in ("pad_token_id", "bos_token_id", "eos_token_id"):  # the tokenizer's, not the family's ids
        values.setdefault(special, None)
    if layers is not None:
        values["num_hidden_layers"] = layers
        if "layer_types" in values:
            pattern = values["layer_types"]
            values["layer_types"] = [pattern[i % len(pattern)] for i in range(layers)]
    return AutoConfig.for_model(family.model_type, **values)


def build(
    name: str,
    vocab_size: int | None = None,
    layers: int | None = None,
    tiny: bool = False,
    seed: int = 0,
    attn_implementation: str | None = None,
    dtype: Any = None,
    device: Any = None,
) -> Any:
    """A causal LM of this family or shape with random weights (seeded), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    config = config_for(name, vocab_size, layers, tiny)
    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if dtype is not None:
        kwargs["dtype"] = dtype
    if device is not None:
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, **kwargs)
    else:
        model = AutoModelForCausalLM.from_config(config, **kwargs)
    return model.eval()
