"""Tiny randomly initialised causal LMs for trainer tests (built from a config: no download)."""

from __future__ import annotations


def tiny_causal_lm(family: str, vocab_size: int, seed: int = 0):
    """A 2-layer, 32-wide `family` model ("llama": untied head, 4 KV heads; "qwen": tied head, GQA with 2 KV
    heads, SDPA attention)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    common = {
        "vocab_size": vocab_size,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
    }
    if family == "llama":
        config = LlamaConfig(**common, num_key_value_heads=4, max_position_embeddings=64, tie_word_embeddings=False)
        return LlamaForCausalLM(config)
    config = Qwen2Config(**common, num_key_value_heads=2, max_position_embeddings=128, attn_implementation="sdpa")
    return Qwen2ForCausalLM(config)
