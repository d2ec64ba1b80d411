"""A real byte-level tokenizer whose token id is the byte's value (no merges, no special tokens), saved as a
Hugging Face tokenizer directory, with a ChatML-like chat template that renders tools and tool calls.

The fake inference server (`atropos_cli.testing.fake_server`) answers token-id prompts by decoding one byte per
id and returns one id per byte of its answer: with this tokenizer both directions are exact, so a test can
script answers from the real prompt text and knows the ids the server sampled."""

from __future__ import annotations

from pathlib import Path

CHAT_TEMPLATE = (
    "{%- if tools %}<|system|>tools: {{ tools | tojson }}<|end|>\n{% endif %}"
    "{%- for m in messages %}<|{{ m['role'] }}|>{{ m['content'] or '' }}"
    "{%- for c in m.get('tool_calls') or [] %}<tool_call>"
    '{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments }}}</tool_call>'
    "{%- endfor %}<|end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|assistant|>{% endif %}"
)


def byte_chars() -> list[str]:
    """The printable stand-in of each byte 0..255 (the byte-level alphabet, in byte order)."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = [], 0
    for byte in range(256):
        if byte in kept:
            chars.append(chr(byte))
        else:
            chars.append(chr(256 + extra))
            extra += 1
    return chars


def save_byte_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {char: byte for byte, char in enumerate(byte_chars())}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=CHAT_TEMPLATE)
    fast.save_pretrained(directory)
    return directory
