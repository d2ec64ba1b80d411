"""Builds the pieces of a tiny causal LM from nothing: a byte-level BPE tokenizer with a chat template, and a
small Llama config with freshly initialised weights. Used by `examples/build_tiny_model.py` (the recipe of the
shipped `atropos-tiny-arith`); the weights are then trained by `atropos_cli.trainer.sft.run_sft`.

Flow: texts -> `train_tokenizer` (digits are single tokens, so numbers are spelled digit by digit; bytes as a
fallback, so any text encodes) -> `init_model(tokenizer, sizes)` -> `save_init(dir)` (config, weights,
tokenizer, generation config) -> SFT.

The chat template is one line per turn: `<|user|>What is 2 + 3?<|end|><|assistant|>5<|end|>`; `<|end|>` is
the EOS token, so a model that learned the template stops on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "CHAT_TEMPLATE",
    "SPECIAL_TOKENS",
    "TinyModelSizes",
    "train_tokenizer",
    "init_model",
    "save_init",
    "portable_tokenizer_config",
]

ROLES = ("system", "user", "assistant")
EOS, PAD = "<|end|>", "<|pad|>"
SPECIAL_TOKENS = [PAD, EOS, *(f"<|{role}|>" for role in ROLES)]

# Jinja, rendered by transformers' apply_chat_template. Every role renders as `<|role|>content<|end|>`, as
# real templates render whatever role an env sends (ChatML: `<|im_start|>role`): system/user/assistant headers
# are the model's special tokens, any other role (`tool`, `environment`, ...) is plain text the tokenizer
# spells byte by byte. Content may be a string, None (a tool-call-only assistant turn) or a list of parts (only
# the `text` parts render); an assistant's `tool_calls` render as hermes `<tool_call>{"name", "arguments"}
# </tool_call>` blocks after its content. An assistant turn's content and its <|end|> sit inside
# `{% generation %}` markers (they render nothing): `return_assistant_tokens_mask=True`, and so TRL's
# `SFTTrainer(assistant_only_loss=True)`, train on exactly those tokens. Rendering a chat's first k messages
# gives a prefix of rendering all of them (tested).
CHAT_TEMPLATE = (
    "{%- macro text(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable and content is not mapping -%}"
    "{%- for part in content -%}{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- macro calls(message) -%}"
    "{%- for call in message.get('tool_calls') or [] -%}"
    "{%- set function = call['function'] if call['function'] is defined else call -%}"
    "{%- set arguments = function['arguments'] -%}"
    "{{ '<tool_call>{\"name\": ' + (function['name'] | tojson) + ', \"arguments\": ' }}"
    "{{- arguments if arguments is string else (arguments | tojson) }}{{ '}</tool_call>' }}"
    "{%- endfor -%}"
    "{%- endmacro -%}"
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|assistant|>' }}{% generation %}{{ text(message['content']) + calls(message) + '<|end|>' }}"
    "{% endgeneration %}"
    "{% else %}"
    "{{ '<|' + message['role'] + '|>' + text(message['content']) + '<|end|>' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


class TinyModelSizes(BaseModel):
    """Shape of the tiny Llama. The defaults make a ~0.8M-parameter model (~3 MB in fp32)."""

    model_config = ConfigDict(extra="forbid")

    hidden_size: int = Field(128, ge=8)
    num_layers: int = Field(4, ge=1)
    num_heads: int = Field(4, ge=1)
    intermediate_size: int = Field(384, ge=8)
    max_position_embeddings: int = Field(256, ge=16)
    vocab_size: int = Field(384, ge=280)


def train_tokenizer(texts: Iterable[str], vocab_size: int = 384) -> Any:
    """A byte-level BPE over `texts` where every digit is its own token, wrapped as PreTrainedTokenizerFast."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    # Digits first (one token each: arithmetic is learned digit by digit), then GPT-2 style byte-level words.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=[t for t in SPECIAL_TOKENS if t not in (EOS, PAD)],
        padding_side="left",
        model_max_length=TinyModelSizes().max_position_embeddings,
    )
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def init_model(tokenizer: Any, sizes: TinyModelSizes, seed: int) -> Any:
    """A LlamaForCausalLM with random weights (seeded), sized by `sizes`, matching `tokenizer`'s vocab."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=sizes.hidden_size,
        intermediate_size=sizes.intermediate_size,
        num_hidden_layers=sizes.num_layers,
        num_attention_heads=sizes.num_heads,
        num_key_value_heads=sizes.num_heads,
        max_position_embeddings=sizes.max_position_embeddings,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def save_init(model: Any, tokenizer: Any, out_dir: str | Path) -> Path:
    """Save config + weights + tokenizer (+ a generation config that stops on EOS) to `out_dir`."""
    from transformers import GenerationConfig

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, do_sample=True, temperature=1.0
    )
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def portable_tokenizer_config(model_dir: str | Path) -> None:
    """Make tokenizer_config.json loadable beyond the transformers version that wrote it: the generic
    `PreTrainedTokenizerFast` class, the chat template inline (transformers 5 keeps it only in
    chat_template.jinja), and no machine-specific keys."""
    import json

    path = Path(model_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text())
    for key in ("is_local", "local_files_only"):
        config.pop(key, None)
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config["chat_template"] = CHAT_TEMPLATE
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
