"""Vision-language models (the Qwen2-VL family: Qwen2-VL, Qwen2.5-VL, Qwen3-VL): images in, pad tokens expanded,
mrope positions, for the local backend's rollouts and the trainer's rows alike.

Where it sits: `inference/local.py` loads a VL model with `VisionProcessor.load` and samples a chat whose messages
carry image parts (`message_images`) with the image's `VisionInputs` (`RowRequest.vision`: one batched decode takes
rows of many prompts, with and without images); the trainer (`trainer/step/vision_rows.py`) turns a group's
`images` into the same inputs and places their tokens in the env's rows. Both take positions from `positions` (the
model's own rope index), so the rollout's logprobs, the trainer's and an eager forward of the same tokens and image
agree.

How an image becomes model input: the image processor (its published defaults are the checkpoint's
`preprocessor_config.json`) resizes it to whole 28-pixel tiles and cuts it into patches (`pixel_values`, one row per
patch, and `image_grid_thw`, the patch grid); the chat template renders an image part as
`<|vision_start|><|image_pad|><|vision_end|>`, and the one pad token becomes grid / merge² pads (`expand`), which the
model fills with the vision tower's merged patch embeddings. The full transformers processor class is not used:
it requires a video processor (torchvision); the image processor and the tokenizer are all an image needs.
"""

from __future__ import annotations

import base64
import binascii
import io
from dataclasses import dataclass
from typing import Any

from atropos_cli.errors import AtroposError, InputError, ModelLoadError

__all__ = [
    "VisionInputs",
    "VisionProcessor",
    "decode_image",
    "is_vision_config",
    "message_images",
    "positions",
]

IMAGE_PART_TYPES = ("image_url", "image")


def is_vision_config(config: Any) -> bool:
    """Whether a transformers config is a vision-language model's (it has a vision tower's config)."""
    return getattr(config, "vision_config", None) is not None


def message_images(messages: list[dict[str, Any]]) -> list[Any]:
    """The image references of a chat's content parts, in order: an `image_url` part's URL, an `image` part's
    value (a data URL, base64 text, bytes or a PIL image)."""
    found: list[Any] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, dict) or part.get("type") not in IMAGE_PART_TYPES:
                continue
            if part["type"] == "image_url":
                url = part.get("image_url")
                found.append(url.get("url") if isinstance(url, dict) else url)
            else:
                found.append(part.get("image"))
    return found


def decode_image(ref: Any, error: type[AtroposError] = InputError) -> Any:
    """A PIL RGB image from a data URL (`data:image/png;base64,...`), bare base64 text, bytes or a PIL image."""
    from PIL import Image, UnidentifiedImageError

    if isinstance(ref, Image.Image):
        return ref.convert("RGB")
    shown = repr(ref)[:60]
    if isinstance(ref, str) and ref.startswith(("http://", "https://")):
        raise error(
            f"image {shown} is a URL; the model reads images sent inline",
            hint="send it as a data URL (data:image/png;base64,...), as Atropos' multimodal envs do",
        )
    try:
        raw = ref if isinstance(ref, bytes) else base64.b64decode(str(ref).split(",", 1)[-1], validate=True)
        return Image.open(io.BytesIO(raw)).convert("RGB")
    except (binascii.Error, ValueError, UnidentifiedImageError, OSError) as exc:
        raise error(
            f"cannot read image {shown}: {type(exc).__name__}",
            hint="send a PNG or JPEG as a data URL (data:image/png;base64,...) or as base64 text",
        ) from None


@dataclass
class VisionInputs:
    """One row's images as the model takes them: patches [patches, C*T*P*P] and their grids [images, 3]."""

    pixel_values: Any
    image_grid_thw: Any

    @property
    def images(self) -> int:
        return int(self.image_grid_thw.shape[0])

    @classmethod
    def batched(cls, rows: list[VisionInputs | None]) -> VisionInputs | None:
        """The images of a batch's rows as one model input: every row's patches and grids concatenated in row
        order (rows without images add none), as the model's forward and rope index read them; None: no images."""
        import torch

        present = [v for v in rows if v is not None]
        if not present:
            return None
        return cls(torch.cat([v.pixel_values for v in present]), torch.cat([v.image_grid_thw for v in present]))


@dataclass
class VisionProcessor:
    """A VL model's image side: its image processor and the token ids of its image markers."""

    image_processor: Any
    image_token_id: int
    start_id: int
    end_id: int
    merge: int

    @classmethod
    def load(cls, path: str, config: Any) -> VisionProcessor:
        """The image processor saved beside the model (`preprocessor_config.json`) and the config's token ids."""
        from transformers import AutoImageProcessor

        try:
            processor = AutoImageProcessor.from_pretrained(path)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(
                f"vision-language model {path!r} has no loadable image processor ({type(exc).__name__})",
                hint="save one beside the weights (image_processor.save_pretrained(DIR): preprocessor_config.json)",
            ) from None
        return cls.for_config(processor, config)

    @classmethod
    def for_config(cls, image_processor: Any, config: Any) -> VisionProcessor:
        merge = int(getattr(config.vision_config, "spatial_merge_size", 2))
        image, start, end = (config.image_token_id, config.vision_start_token_id, config.vision_end_token_id)
        return cls(image_processor, int(image), int(start), int(end), merge)

    def inputs(self, refs: list[Any], error: type[AtroposError] = InputError) -> VisionInputs:
        """The patches and grids of these images (data URLs, base64, bytes or PIL images), in order."""
        images = [decode_image(ref, error) for ref in refs]
        out = self.image_processor(images=images, return_tensors="pt")
        return VisionInputs(out["pixel_values"], out["image_grid_thw"])

    def counts(self, vision: VisionInputs) -> list[int]:
        """Pad tokens each image takes: its patch grid over merge² (the merger joins merge x merge patches)."""
        return [int(g.prod()) // (self.merge * self.merge) for g in vision.image_grid_thw]

    def block(self, count: int) -> list[int]:
        """One image's tokens: <|vision_start|>, `count` pads, <|vision_end|>."""
        return [self.start_id, *[self.image_token_id] * count, self.end_id]

    def expand(self, ids: list[int], vision: VisionInputs, error: type[AtroposError] = InputError) -> list[int]:
        """A rendered prompt's single pad token per image made into as many as the image takes."""
        counts = self.counts(vision)
        found = ids.count(self.image_token_id)
        if found != len(counts):
            raise error(
                f"the rendered prompt has {found} image placeholder(s) for {len(counts)} image(s)",
                hint="the model's chat template must render each image part as <|vision_start|><|image_pad|>"
                "<|vision_end|>",
            )
        out: list[int] = []
        pending = iter(counts)
        for token in ids:
            out.extend([token] * next(pending) if token == self.image_token_id else [token])
        return out


def positions(model: Any, input_ids: Any, vision: VisionInputs | None, attention_mask: Any = None) -> Any:
    """mrope position ids [3, rows, tokens] from the model's own rope index: text counts up on all three axes, an
    image's pads take (time, row, column) of their patch, text after it continues from the largest. Given
    explicitly, so no forward depends on the rope state a model keeps between calls."""
    import torch

    inner = model
    while not hasattr(inner, "get_rope_index"):
        inner = inner.model
    image = vision.image_grid_thw if vision is not None else None
    kinds = (input_ids == inner.config.image_token_id).int() if vision is not None else torch.zeros_like(input_ids)
    out, _ = inner.get_rope_index(
        input_ids, image_grid_thw=image, attention_mask=attention_mask, mm_token_type_ids=kinds
    )
    return out
