"""A group's images in the trainer: each image rollout's tokens with the image's tokens placed in them, and the
pixel inputs the policy's forward takes with that row.

Where it sits: `GRPOTrainer.step` calls `VisionRows.expand` on the step's groups before `batching.prepare`; the
samples it builds carry their `VisionInputs`, each such sample is its own micro-batch (`image_micro_batches`), and
`GRPOTrainer._logprobs` passes the pixels and the mrope positions (`atropos_cli.vision.positions`) to the body.

The rule for where an image goes: Atropos' multimodal envs send the image in the request (text, then image, in the
last user message) but tokenize the chat for the trainer without it (`tokenize_for_trainer` of the text alone);
their group's `images` holds the base64 PNG of each rollout. The image's tokens are put where the model's chat
template renders an image part that follows the text: before the end-of-turn token that closes the last turn
ahead of the first trained token, one block per image, in order. Tokens that already hold image pads (a row
tokenized with its image) are taken as they are. Inserted positions are never trained.

Each image row is one micro-batch of its own (no padding, no packing): the vision tower's patches and the mrope
positions of one row are exact, and no image's tokens can read another row's.
"""

from __future__ import annotations

from typing import Any

from atropos_cli.errors import InputError
from atropos_cli.types import ScoredGroup
from atropos_cli.vision import VisionInputs, VisionProcessor

__all__ = ["VisionRows", "image_refs", "refuse_images"]

MASKED = -100


def image_refs(group: ScoredGroup) -> list[list[Any]]:
    """Each rollout's images: `images` is one entry per rollout (None, one image, or a list of them), or one
    image (or list) for the whole group."""
    images = group.images
    if images is None:
        return [[] for _ in range(group.size)]
    per = images if isinstance(images, list) and len(images) == group.size else [images] * group.size
    return [[] if x is None else list(x) if isinstance(x, list) else [x] for x in per]


def refuse_images(groups: list[ScoredGroup], model: str) -> None:
    """A text-only model given image rollouts: one error, before anything trains on them without their images."""
    rows = sum(bool(refs) for g in groups for refs in image_refs(g))
    if rows:
        raise InputError(
            f"model {model!r} reads text only; the batch has {rows} rollout(s) with images",
            hint="train a vision-language model on a multimodal env (atropos models lists the family)",
        )


class VisionRows:
    """A VL policy's image side in the trainer: its processor and where its chat template puts an image."""

    def __init__(self, processor: VisionProcessor, tokenizer: Any) -> None:
        self.processor = processor
        self.turn_end = _turn_end(tokenizer, processor)

    def saved_with(self, tokenizer: Any) -> Any:
        """`tokenizer` whose `save_pretrained(DIR)` also writes the image processor (a checkpoint's)."""
        return _SavedWithImages(tokenizer, self.processor.image_processor)

    def expand(self, groups: list[ScoredGroup]) -> tuple[list[ScoredGroup], dict[int, list[VisionInputs | None]]]:
        """The groups with each image rollout's tokens, masks and per-token lists widened by its images' tokens,
        and each group's per-rollout inputs (by group index; groups without images are absent)."""
        out, vision = [], {}
        for index, group in enumerate(groups):
            refs = image_refs(group)
            if not any(refs):
                out.append(group)
                continue
            inputs = [self.processor.inputs(r) if r else None for r in refs]
            widened = [self._place(group, i, v) for i, v in enumerate(inputs)]
            out.append(group.model_copy(update=_columns(group, widened)))
            vision[index] = inputs
        return out, vision

    def _place(self, group: ScoredGroup, i: int, vision: VisionInputs | None) -> tuple[int, list[int]] | None:
        """(where the image tokens go, the tokens) for rollout i; None: nothing to insert."""
        if vision is None:
            return None
        tokens, counts = group.tokens[i], self.processor.counts(vision)
        pad = self.processor.image_token_id
        if pad in tokens:  # tokenized with its images already
            have = tokens.count(pad)
            if have != sum(counts):
                raise InputError(
                    f"rollout {i} has {have} image pad tokens for images that take {sum(counts)}",
                    hint="tokenize the row with the model's processor, or send it without image tokens",
                )
            return None
        first = next((t for t, m in enumerate(group.masks[i]) if m != MASKED), len(tokens))
        ends = [t for t in range(first) if tokens[t] == self.turn_end]
        if not ends:
            raise InputError(
                f"rollout {i} has images but no end of a turn before its first trained token",
                hint="send the prompt rendered with the model's chat template (tokenize_for_trainer does)",
            )
        block = [t for n in counts for t in self.processor.block(n)]
        return ends[-1], block


class _SavedWithImages:
    def __init__(self, tokenizer: Any, image_processor: Any) -> None:
        self.tokenizer, self.image_processor = tokenizer, image_processor

    def save_pretrained(self, path: Any) -> None:
        self.tokenizer.save_pretrained(path)
        self.image_processor.save_pretrained(path)


def _columns(group: ScoredGroup, widened: list[tuple[int, list[int]] | None]) -> dict[str, Any]:
    """The per-token columns of a group with each rollout's block inserted (masked; placeholder values)."""

    def insert(rows: list[list[Any]] | None, filler: Any) -> list[list[Any]] | None:
        if rows is None:
            return None
        return [
            row if w is None else row[: w[0]] + [filler] * len(w[1]) + row[w[0] :]
            for row, w in zip(rows, widened, strict=True)
        ]

    tokens = [
        row if w is None else row[: w[0]] + w[1] + row[w[0] :] for row, w in zip(group.tokens, widened, strict=True)
    ]
    update: dict[str, Any] = {"tokens": tokens, "masks": insert(group.masks, MASKED)}
    for name, filler in (("advantages", 0.0), ("inference_logprobs", 1.0), ("ref_logprobs", 0.0)):
        update[name] = insert(getattr(group, name), filler)
    for name in ("distill_token_ids", "distill_logprobs"):
        update[name] = insert(getattr(group, name), [])
    return update


def _turn_end(tokenizer: Any, processor: VisionProcessor) -> int:
    """The token that follows an image part placed after a user turn's text in the chat template (the end of
    that turn)."""
    chat = [{"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "image"}]}]
    try:
        ids = list(tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False))
    except Exception as exc:  # noqa: BLE001 (a template that takes no parts: any error is the same answer)
        raise InputError(
            f"the model's chat template cannot render an image part ({type(exc).__name__})",
            hint="use the model's own tokenizer (its chat template renders images)",
        ) from None
    if processor.end_id not in ids or ids.index(processor.end_id) + 1 >= len(ids):
        raise InputError(
            "the model's chat template does not render an image part as <|vision_start|>...<|vision_end|>",
            hint="use the model's own tokenizer (its chat template renders images)",
        )
    return int(ids[ids.index(processor.end_id) + 1])
