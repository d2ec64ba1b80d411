"""The vision-language family atropos drives (Qwen2.5-VL), with its published shapes and a tiny test shape, built
with random weights from config values (no download), and a tiny model directory to train offline.

Where it sits: beside `families.py` (the text families); `atropos models` lists it with its paths, the VL tests
build the tiny shape (`save_tiny`: config, random weights, the shipped tokenizer with the VL special tokens and an
image-aware chat template, the Qwen2-VL image processor at its published defaults), and
`benchmarks/bench_vision.py` builds a published shape at full depth.

The tiny shape keeps the published structure: a vision tower of windowed and full-attention blocks ending in the
2 x 2 patch merger, mrope with three sections, image pad tokens between vision start and end markers; layers are
few and narrow.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["SHAPES", "TINY", "VL_FAMILY", "VL_TOKENS", "build", "config_for", "save_tiny", "tiny_tokenizer"]

VL_FAMILY = "qwen2_5_vl"
MODEL_TYPE = "qwen2_5_vl"
TRAITS = "vision tower (windowed + full blocks, 2x2 patch merger), mrope, image pad tokens"
# Qwen2-VL's special tokens for images (and video, so the published ids line up)
VL_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>"]

_VISION_3B_7B = dict(depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
                     spatial_merge_size=2, temporal_patch_size=2, window_size=112,
                     fullatt_block_indexes=[7, 15, 23, 31], tokens_per_second=2, hidden_act="silu")  # fmt: skip
_IDS = dict(vision_start_token_id=151652, vision_end_token_id=151653, image_token_id=151655, video_token_id=151656)


def _published(hidden: int, intermediate: int, layers: int, heads: int, kv_heads: int, vocab: int, tie: bool):
    """A released Qwen2.5-VL checkpoint's config values: its text stack and the shared vision tower."""
    text = dict(hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=kv_heads, vocab_size=vocab, tie_word_embeddings=tie, max_position_embeddings=128000,
                rms_norm_eps=1e-6,
                rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]})  # fmt: skip
    vision = {**_VISION_3B_7B, "out_hidden_size": hidden}
    return dict(text_config=text, vision_config=vision, tie_word_embeddings=tie, **_IDS)


SHAPES: dict[str, dict[str, Any]] = {
    "Qwen2.5-VL-3B": _published(2048, 11008, 36, 16, 2, 151936, True),
    "Qwen2.5-VL-7B": _published(3584, 18944, 28, 28, 4, 152064, False),
}  # fmt: skip

# 64-wide text layers (head_dim 16: mrope sections 2 + 3 + 3 = 8 frequencies), a 2-block vision tower (one windowed,
# one full) of width 32 ending in the merger into 64
TINY: dict[str, Any] = dict(
    text_config=dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, max_position_embeddings=192, tie_word_embeddings=True,
                     rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [2, 3, 3]}),
    vision_config=dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14,
                       spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[1],
                       tokens_per_second=2, out_hidden_size=64),
    tie_word_embeddings=True,
)  # fmt: skip


def config_for(shape: str | None = None, layers: int | None = None, tokenizer: Any = None) -> Any:
    """The transformers config of a published shape (or the tiny one: `shape=None`), optionally with fewer text
    layers; `tokenizer` sets the vocabulary and the image token ids (the tiny shape's come from it)."""
    import copy

    from transformers import AutoConfig

    values = copy.deepcopy(SHAPES[shape] if shape is not None else TINY)
    if layers is not None:
        values["text_config"]["num_hidden_layers"] = layers
    if tokenizer is not None:
        values["text_config"]["vocab_size"] = len(tokenizer)
        ids = tokenizer.convert_tokens_to_ids(["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"])
        names = ("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id")
        values.update(zip(names, ids, strict=True))
        for special in ("pad_token_id", "bos_token_id", "eos_token_id"):
            values["text_config"][special] = getattr(tokenizer, special)
    return AutoConfig.for_model(MODEL_TYPE, **values)


def build(config: Any, seed: int = 0, dtype: Any = None, device: Any = None) -> Any:
    """A VL model of this config with random weights (seeded), in eval mode."""
    import torch
    from transformers import AutoModelForImageTextToText

    torch.manual_seed(seed)
    kwargs: dict[str, Any] = {} if dtype is None else {"dtype": dtype}
    with torch.device(device or "cpu"):
        model = AutoModelForImageTextToText.from_config(config, **kwargs)
    return model.eval()


def vl_chat_template(template: str) -> str:
    """The shipped model's chat template rendering an image part as Qwen2-VL does: <|vision_start|><|image_pad|>
    <|vision_end|>, in the order the parts come."""
    text_part = "{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}"
    assert text_part in template, "the shipped chat template changed: update vl_chat_template"
    image_part = (
        "{%- if part['type'] == 'text' -%}{{ part['text'] }}"
        "{%- elif part['type'] in ('image', 'image_url') -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
        "{%- endif -%}"
    )
    return template.replace(text_part, image_part)


def tiny_tokenizer() -> Any:
    """The shipped model's tokenizer with the VL special tokens and an image-aware chat template."""
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("atropos-tiny-arith"))
    tokenizer.add_special_tokens({"additional_special_tokens": VL_TOKENS}, replace_extra_special_tokens=False)
    tokenizer.chat_template = vl_chat_template(tokenizer.chat_template)
    return tokenizer


def image_processor() -> Any:
    """Qwen2-VL's image processor at its published defaults (patch 14, merge 2, temporal patch 2, 56² to 28² x 1280
    pixels, CLIP mean and std): the PIL one, which needs no torchvision."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    return Qwen2VLImageProcessorPil()


def save_tiny(out_dir: str | Path, seed: int = 0, shape: str | None = None, layers: int | None = None) -> Path:
    """A model directory of random weights (the tiny shape, or a published one) that `atropos train --model DIR`
    and AutoModelForImageTextToText / AutoImageProcessor load offline."""
    out = Path(out_dir)
    tokenizer = tiny_tokenizer()
    model = build(config_for(shape, layers, tokenizer), seed)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    image_processor().save_pretrained(out)
    return out
