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


def save_tiny_arith_model(folder, op: str = "+", seed: int = 0):
    """A 2-layer Llama with a real 290-token tokenizer (trained on `a OP b` chats) and chat template, saved like
    any HF model under `folder/tiny` (built in ~2 s; 256 positions)."""
    from atropos_cli.trainer.tiny_model import TinyModelSizes, init_model, save_init, train_tokenizer

    answer = {"+": lambda a, b: a + b, "-": lambda a, b: a - b}[op]
    texts = [
        f"<|user|>What is {a} {op} {b}?<|end|><|assistant|>{answer(a, b)}<|end|>" for a in range(20) for b in range(20)
    ]
    tokenizer = train_tokenizer(texts, vocab_size=290)
    sizes = TinyModelSizes(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)
    return save_init(init_model(tokenizer, sizes, seed=seed), tokenizer, folder / "tiny")
