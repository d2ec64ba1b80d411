"""From scored groups to the tensors of one optimizer step: advantages, overrides, shifts, micro-batches.

Where it sits: the step's `ScoredGroup`s (from rollout files, the trajectory API or the in-process loop) come
in; `prepare(...)` turns each rollout into a `Sample` (advantage per token, trained positions, sampling
temperature, inference log-probs), `micro_batches(...)` pads samples of similar length together under a token
budget, and `grpo.py` trains on them.

Rules (those of Atropos' example trainer, where it has one):
- advantage = (score - group mean) / max(group std, 1e-8) (population std); without std scaling (Dr. GRPO)
  just score - mean; a group of one rollout gets 0; per-token `advantages` sent by the env win when present;
- `overrides[i].set_advantage_to_zero` zeroes rollout i; its temperature is `overrides[i].temperature` >
  `generation_params.temperature` > `group_overrides.temperature` > 1.0 (log-probs are taken at it);
- dynamic sampling (DAPO) drops groups whose scores are all equal: they carry no signal;
- causal shift: position t predicts token t+1, so inputs = tokens[:-1], targets = tokens[1:],
  trained where masks[1:] != -100, inference log-probs = inference_logprobs[1:].
"""

from __future__ import annotations

import array
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, overload

import torch

from atropos_cli.types import ScoredGroup

__all__ = [
    "Sample",
    "Prepared",
    "MicroBatch",
    "group_advantages",
    "prepare",
    "micro_batches",
    "image_micro_batches",
    "static_micro_batches",
    "static_rows",
    "static_micro_batch",
    "Deferred",
    "StaticShape",
    "bucket",
    "narrow_warmups",
]

MASKED = -100


@dataclass
class Sample:
    tokens: list[int]
    trained: list[bool]  # per position of tokens[1:]
    advantages: list[float]  # per position of tokens[1:]
    temperature: float
    inference_logprobs: list[float] | None  # per position of tokens[1:]
    # the teacher's logprob of each target token (per position of tokens[1:]), NaN where its top-k lacks it
    teacher_logprobs: list[float] | None = None
    group: int = 0  # index of its group in the step's batch (a many-GPU step gives each rank whole groups)
    vision: Any = None  # its images' pixel inputs (`atropos_cli.vision.VisionInputs`; vision_rows.py)

    @property
    def num_trained(self) -> int:
        return sum(self.trained)


@dataclass
class Prepared:
    """One step's samples plus what the console and metrics.jsonl show about the groups.

    `samples` are those of the kept groups (all of them unless `prepare` was given `keep`); the counts are over
    the whole batch: `sequences` samples with a trained token, `trained_tokens` of them (the loss normaliser)."""

    samples: list[Sample] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    groups: int = 0
    groups_with_signal: int = 0
    dropped_no_signal: int = 0
    truncated: int = 0
    sequences: int = 0
    trained_tokens: int = 0


def group_advantages(scores: list[float], scale: bool) -> list[float]:
    n = len(scores)
    if n < 2:
        return [0.0] * n
    mean = sum(scores) / n
    centred = [s - mean for s in scores]
    if not scale:
        return centred
    std = math.sqrt(sum(c * c for c in centred) / n)
    return [c / max(std, 1e-8) for c in centred]


def _temperature(group: ScoredGroup, i: int) -> float:
    for source in (
        (group.overrides or [{}] * group.size)[i],
        group.generation_params or {},
        group.group_overrides or {},
    ):
        value = source.get("temperature") if source else None
        if value is not None and float(value) > 0:
            return float(value)
    return 1.0


def _sample(group: ScoredGroup, i: int, advantage: float, max_len: int) -> Sample:
    tokens, masks = group.tokens[i][:max_len], group.masks[i][:max_len]
    if group.advantages is not None:
        per_token = [float(a) for a in group.advantages[i][1:max_len]]
    else:
        per_token = [advantage] * (len(tokens) - 1)
    override = (group.overrides or [{}] * group.size)[i] or {}
    if override.get("set_advantage_to_zero"):
        per_token = [0.0] * len(per_token)
    inf = group.inference_logprobs[i][1:max_len] if group.inference_logprobs is not None else None
    sample = Sample(
        tokens=list(tokens),
        trained=[m != MASKED for m in masks[1:]],
        advantages=per_token,
        temperature=_temperature(group, i),
        inference_logprobs=[float(x) for x in inf] if inf is not None else None,
    )
    if group.distill_token_ids is not None and group.distill_logprobs is not None:
        full = teacher_logprobs(group.tokens[i], group.distill_token_ids[i], group.distill_logprobs[i])
        sample.teacher_logprobs = full[: len(tokens) - 1]
    return sample


def teacher_logprobs(tokens: list[int], top_ids: list[list[int]], top_lps: list[list[float]]) -> list[float]:
    """The teacher's logprob of tokens[t] for t >= 1, from its top-k at position t; NaN when not in the top-k."""
    out = []
    for t in range(1, len(tokens)):
        ids = top_ids[t] if t < len(top_ids) else []
        lps = top_lps[t] if t < len(top_lps) else []
        out.append(float(lps[ids.index(tokens[t])]) if tokens[t] in ids else math.nan)
    return out


def prepare(
    groups: list[ScoredGroup],
    scale_rewards: bool,
    dynamic_sampling: bool,
    max_len: int,
    keep: Callable[[dict[int, int]], set[int]] | None = None,
    vision: dict[int, list[Any]] | None = None,
) -> Prepared:
    """Samples for one step. Groups without token ids raise ValueError naming the fix (require_tokens).

    `keep` (a many-rank step): given each trained group's load (its samples' tokens, by group index), the groups
    whose samples this rank builds; the others are only counted (a rank of 4 builds a quarter of the samples, the
    per-token lists being the costly part, while the counts and metrics stay those of the whole batch).
    `vision`: each image group's per-rollout pixel inputs, by group index (`vision_rows.VisionRows.expand`)."""
    out = Prepared()
    trained: list[int] = []  # indices of the groups that train
    loads: dict[int, int] = {}
    for index, group in enumerate(groups):
        group.require_tokens()
        out.groups += 1
        out.scores.extend(group.scores)
        has_signal = len(set(group.scores)) > 1
        out.groups_with_signal += int(has_signal)
        if dynamic_sampling and not has_signal:
            out.dropped_no_signal += 1
            continue
        trained.append(index)
        for tokens, masks in zip(group.tokens, group.masks, strict=True):
            n = min(len(tokens), max_len)
            out.truncated += int(len(tokens) > max_len)
            count = n - 1 - masks[1:n].count(MASKED) if n > 1 else 0
            if count > 0:
                out.sequences += 1
                out.trained_tokens += count
                loads[index] = loads.get(index, 0) + n
    mine = keep(loads) if keep is not None else set(loads)
    for index in trained:
        if index not in mine:
            continue
        group = groups[index]
        for i, adv in enumerate(group_advantages(group.scores, scale_rewards)):
            sample = _sample(group, i, adv, max_len)
            sample.group = index
            sample.vision = (vision or {}).get(index, [None] * group.size)[i]
            if sample.num_trained > 0:
                out.samples.append(sample)
    return out


@dataclass
class MicroBatch:
    """One forward/backward pass: the model's inputs in rows, and the trained positions in a loss layout.

    Model layout [R, L]: padded (one sample a row, right-padded) or packed (several samples end to end in one
    row, `position_ids` restarting at 0 for each, so attention stays within a sample). Loss layout [S, T]: one row
    per sample, the shape `losses.policy_loss` reduces over. `select` holds the flat [R*L] indices of the trained
    positions (only those go through the LM head: prompt positions never get logits) and `place` the flat [S*T]
    index each of their log-probs lands at.
    """

    input_ids: torch.Tensor  # [R, L] int64 (0 where padded)
    attention_mask: torch.Tensor  # [R, L] int64, 1 on real tokens
    targets: torch.Tensor  # [R, L] int64: the next token at each position (0 where padded)
    select: torch.Tensor  # [n] int64, flat indices into [R, L] of the trained positions
    place: torch.Tensor  # [n] int64, flat indices into [S, T] of the same positions
    loss_mask: torch.Tensor  # [S, T] float32, 1.0 on trained positions
    advantages: torch.Tensor  # [S, T] float32
    inv_temperature: torch.Tensor | None  # [n] float32, 1 / sampling temperature; None when all are 1
    inference_logp: torch.Tensor | None  # [S, T] float32, or None if any sample lacks them
    teacher_logp: torch.Tensor | None = None  # [S, T] float32 (0 where unknown), None if any sample lacks them
    teacher_mask: torch.Tensor | None = None  # [S, T] float32, 1.0 where the teacher scored the target token
    position_ids: torch.Tensor | None = None  # [R, L] int64, packed rows only
    padded: bool = True  # False when every row is full width: attention needs no mask then
    # static packing only: [max_docs + 1] int32 sample boundaries in the row (varlen attention), the last
    # entries repeated; and the longest a sample (or a filler piece) may be
    cu_seqlens: torch.Tensor | None = None
    max_doc_len: int = 0
    real_tokens: int = 0  # model tokens that are not filler
    # a VL model's image row (one sample, its own micro-batch): the patches and grids of its images
    pixel_values: torch.Tensor | None = None
    image_grid_thw: torch.Tensor | None = None

    @property
    def packed(self) -> bool:
        return self.position_ids is not None

    def to(self, device: torch.device | str) -> MicroBatch:
        """The micro-batch on `device`. To a GPU through pinned memory: a copy from pageable memory first waits
        for the GPU's queue to drain (CUDA's rule for pageable host-to-device copies), so each micro-batch's copy
        emptied the queue and its forward was launched onto an idle GPU (H100, profile_timeline.py: 132 ms of a
        520 ms mixed-length step idle in the forwards). From pinned memory the copy is queued like a kernel and
        the host launches the next forward while the GPU still runs the last backward."""
        pin = torch.device(device).type == "cuda"

        def move(v: torch.Tensor) -> torch.Tensor:
            if pin and v.device.type == "cpu":
                v = v.pin_memory()
            return v.to(device, non_blocking=True)

        fields = vars(self).items()
        moved: dict[str, Any] = {k: move(v) if isinstance(v, torch.Tensor) else v for k, v in fields}
        return MicroBatch(**moved)


def _tensor(values: list, code: str, dtype: torch.dtype) -> torch.Tensor:
    """A 1-D tensor from a Python list through the buffer protocol: ~10x faster than torch.tensor(list), which
    on a step of 64 mixed-length rollouts cost ~25 ms of host time before the GPU could start (the step's host
    side is its critical path; benchmarks/profile_timeline.py)."""
    if not values:
        return torch.empty(0, dtype=dtype)
    return torch.frombuffer(array.array(code, values), dtype=dtype)


@dataclass
class _Filling:
    """The tensors of one micro-batch while samples are laid into it: the model's layout ([rows, width]: ids,
    targets, attention, positions) and the per-sample loss layout ([samples, span]), joined by select/place."""

    width: int
    span: int
    input_ids: torch.Tensor
    targets: torch.Tensor
    attention: torch.Tensor
    positions: torch.Tensor
    loss_mask: torch.Tensor
    adv: torch.Tensor
    inf: torch.Tensor | None
    teacher: torch.Tensor | None
    select: list[torch.Tensor] = field(default_factory=list)
    place: list[torch.Tensor] = field(default_factory=list)
    temps: list[torch.Tensor] = field(default_factory=list)

    @classmethod
    def empty(cls, rows: int, samples: list[Sample], width: int, span: int, slots: int | None = None) -> _Filling:
        def zeros() -> torch.Tensor:
            return torch.zeros(rows, width, dtype=torch.long)

        b = slots or len(samples)
        have_inf = all(s.inference_logprobs is not None for s in samples)
        have_teacher = all(s.teacher_logprobs is not None for s in samples)
        return cls(
            width, span, zeros(), zeros(), zeros(), zeros(), torch.zeros(b, span), torch.zeros(b, span),
            torch.zeros(b, span) if have_inf else None,
            torch.full((b, span), math.nan) if have_teacher else None,
        )  # fmt: skip

    def put(self, s: Sample, row: int, offset: int, k: int) -> None:
        """Sample `s` (the k-th) at `offset` of model row `row`."""
        n = len(s.tokens) - 1
        cols = slice(offset, offset + n)
        tokens = _tensor(s.tokens, "q", torch.long)
        self.input_ids[row, cols] = tokens[:-1]
        self.targets[row, cols] = tokens[1:]
        self.attention[row, cols] = 1
        self.positions[row, cols] = torch.arange(n)
        trained = _tensor(s.trained, "b", torch.bool)
        self.loss_mask[k, :n] = trained.float()
        self.adv[k, :n] = _tensor(s.advantages, "f", torch.float32)
        if self.inf is not None:
            self.inf[k, :n] = _tensor(s.inference_logprobs, "f", torch.float32)  # type: ignore[arg-type]
        if self.teacher is not None:
            self.teacher[k, :n] = _tensor(s.teacher_logprobs, "f", torch.float32)  # type: ignore[arg-type]
        where = trained.nonzero().squeeze(1)
        self.select.append(row * self.width + offset + where)
        self.place.append(k * self.span + where)
        self.temps.append(torch.full((len(where),), 1.0 / s.temperature))


def _collate(rows: list[list[Sample]], width: int | None = None, layout: tuple[int, int] | None = None) -> MicroBatch:
    """Rows of samples (one sample a row = padded; several = packed) into one micro-batch; `width` fixes the
    row width (static packing; the caller fills the rest), `layout` the loss layout's (slots, span)."""
    samples = [s for row in rows for s in row]
    width = width or max(sum(len(s.tokens) - 1 for s in row) for row in rows)
    slots, span = layout or (len(samples), max(len(s.tokens) - 1 for s in samples))
    f = _Filling.empty(len(rows), samples, width, span, slots)
    k = 0
    for row_index, row in enumerate(rows):
        offset = 0
        for s in row:
            f.put(s, row_index, offset, k)
            offset += len(s.tokens) - 1
            k += 1
    unit = all(s.temperature == 1.0 for s in samples)
    packed = any(len(row) > 1 for row in rows)
    teacher = f.teacher
    return MicroBatch(
        input_ids=f.input_ids,
        attention_mask=f.attention,
        targets=f.targets,
        select=torch.cat(f.select),
        place=torch.cat(f.place),
        loss_mask=f.loss_mask,
        advantages=f.adv,
        inv_temperature=None if unit else torch.cat(f.temps),
        inference_logp=f.inf,
        teacher_logp=torch.nan_to_num(teacher, nan=0.0) if teacher is not None else None,
        teacher_mask=(~torch.isnan(teacher)).float() if teacher is not None else None,
        position_ids=f.positions if packed else None,
        padded=bool((f.attention == 0).any()),
        real_tokens=int(f.attention.sum()),
    )


def micro_batches(samples: list[Sample], max_tokens: int, pack: bool = False) -> list[MicroBatch]:
    """Split a step's samples into micro-batches of at most `max_tokens` model tokens each.

    Padded (default): samples sorted by length, similar lengths padded together. Packed: samples laid end to end
    in one row per micro-batch (first-fit decreasing), so no token is padding; the model must keep attention
    within each sample (`position_ids`; see grpo.py). A single sample longer than the budget gets its own batch.
    """
    if pack:
        return [_collate([row]) for row in _pack(samples, max_tokens)]
    ordered = sorted(samples, key=lambda s: len(s.tokens))
    batches: list[MicroBatch] = []
    current: list[Sample] = []
    for s in ordered:
        width = len(s.tokens) - 1  # sorted ascending, so this is the widest so far
        if current and (len(current) + 1) * width > max_tokens:
            batches.append(_collate([[x] for x in current]))
            current = []
        current.append(s)
    if current:
        batches.append(_collate([[x] for x in current]))
    return batches


def image_micro_batches(samples: list[Sample]) -> list[MicroBatch]:
    """Image samples, each its own one-row micro-batch with its images' pixel inputs (vision_rows.py says why)."""
    batches = []
    for s in samples:
        mb = _collate([[s]])
        mb.pixel_values, mb.image_grid_thw = s.vision.pixel_values, s.vision.image_grid_thw
        batches.append(mb)
    return batches


def _pack(samples: list[Sample], capacity: int, max_items: int | None = None) -> list[list[Sample]]:
    """First-fit decreasing bin packing by model tokens (len - 1), at most `max_items` samples a bin."""
    bins: list[list[Sample]] = []
    free: list[int] = []
    for s in sorted(samples, key=lambda s: len(s.tokens), reverse=True):
        n = len(s.tokens) - 1
        for i, room in enumerate(free):
            if n <= room and (max_items is None or len(bins[i]) < max_items):
                bins[i].append(s)
                free[i] -= n
                break
        else:
            bins.append([s])
            free.append(capacity - n)
    return bins


def bucket(n: int) -> int:
    """`n` rounded up to one of few sizes: a multiple of 128 up to 1024, then one of 4 sizes an octave (at most
    25% more; 8 sizes from 1024 to 4096). CUDA graphs are recorded per bucket (trainer/step/graphs.py): on the
    benchmark's mixed batches 4 an octave met 21 shapes in 40 steps (8 an octave: 29, still ~1 new a step), and
    only a step's last, narrow row pays the rounding (its full rows are all `micro_batch_tokens` wide)."""
    if n <= 1024:
        return max(128, -(-n // 128) * 128)
    step = 1 << (n.bit_length() - 3)  # n in [2^k, 2^(k+1)): steps of 2^k / 4
    return -(-n // step) * step


@dataclass(frozen=True)
class StaticShape:
    """The one shape every statically packed micro-batch has, so a compiled model never recompiles:
    one row of `width` tokens holding at most `max_docs` pieces (samples, then filler) of at most
    `max_doc_len` tokens each."""

    width: int
    max_doc_len: int
    max_docs: int
    exact: bool = False  # rows end at their last sample (no filler): the width is marked dynamic instead
    # CUDA graphs (graphs.py): rows end at a `bucket` width (filler up to it), the trained positions are padded to
    # a bucket count, and the loss layout is always [max_docs + 1, max_doc_len]: few shapes, each one recording
    bucketed: bool = False

    @classmethod
    def for_budget(cls, micro_batch_tokens: int, max_len: int, exact: bool = False, bucketed: bool = False):
        # a sample has at most max_len - 1 model tokens; pieces rounded up to attention's 128-token blocks
        max_doc_len = -(-(max_len - 1) // 128) * 128
        width = max(micro_batch_tokens, max_doc_len)
        # a row holds at most width/128 samples (+ filler pieces): each slot costs the attention kernel empty
        # thread blocks, so the cap stays small (measured: 261 slots made attention 3-4x slower)
        max_docs = width // 128 + -(-width // max_doc_len) + 1
        return cls(width, max_doc_len, max_docs, exact or bucketed, bucketed)

    def width_of(self, row: list[Sample]) -> int:
        """The model tokens of `row`'s micro-batch: its samples' (exact rows), their bucket, or the fixed width."""
        tokens = sum(len(s.tokens) - 1 for s in row)
        if self.bucketed:
            return min(bucket(tokens), self.width)
        return tokens if self.exact else self.width

    def trained_count(self, width: int, trained: int) -> int:
        """Bucketed: the trained positions a row of `width` is padded to. A narrow row (at most half the budget,
        a step's last) takes all its positions: one shape a width, so every narrow shape can be recorded before
        it comes (`narrow_widths`); its LM head's extra rows cost ~1% of a mixed step. A wide row takes the
        bucket of its trained count (its prompt positions would cost more)."""
        return width if width <= self.width // 2 else min(bucket(trained), width)

    def narrow_widths(self) -> list[int]:
        """Every `bucket` size a narrow row can have (at most half the budget), ascending."""
        sizes, size = [], bucket(1)
        while size <= self.width // 2:
            sizes.append(size)
            size = bucket(size + 1)
        return sizes

    @property
    def loss_layout(self) -> tuple[int, int] | None:
        """Bucketed: the fixed (slots, span) of the loss layout; its last slot holds no sample (padding lands
        there); None: as the samples come."""
        return (self.max_docs + 1, self.max_doc_len) if self.bucketed else None


def static_micro_batches(samples: list[Sample], shape: StaticShape) -> list[MicroBatch]:
    """Samples packed end to end into rows of exactly `shape.width` tokens (first-fit decreasing, at most
    `max_docs - filler pieces` samples a row); the rest of each row is filler (token 0, never trained, its own
    attention pieces). Every micro-batch has the same model-input shapes: [1, width] ids and positions and a
    [max_docs + 1] `cu_seqlens`, which keeps attention within each piece (trainer/step/attention.py)."""
    return list(Deferred(static_rows(samples, shape), shape))


def static_rows(samples: list[Sample], shape: StaticShape) -> list[list[Sample]]:
    """Which samples share each static row (`static_micro_batches`), without building any tensor."""
    filler_pieces = -(-shape.width // shape.max_doc_len)
    return _pack(samples, shape.width, shape.max_docs - filler_pieces)


def static_micro_batch(row: list[Sample], shape: StaticShape) -> MicroBatch:
    """One static row's micro-batch (`static_micro_batches`)."""
    lengths = [len(s.tokens) - 1 for s in row]
    width = shape.width_of(row)
    mb = _collate([row], width=width, layout=shape.loss_layout)
    free = width - sum(lengths)
    pieces = [shape.max_doc_len] * (free // shape.max_doc_len) + (
        [free % shape.max_doc_len] if free % shape.max_doc_len else []
    )
    if mb.position_ids is None:  # one sample in the row: positions count from 0 like a packed row's
        mb.position_ids = torch.arange(width)[None].clone()
    start = sum(lengths)
    for n in pieces:  # filler: positions restart per piece, like a sample's
        mb.position_ids[0, start : start + n] = torch.arange(n)
        start += n
    bounds = torch.tensor([0, *lengths, *pieces], dtype=torch.int32).cumsum(0, dtype=torch.int32)
    cu = torch.full((shape.max_docs + 1,), width, dtype=torch.int32)
    cu[: len(bounds)] = bounds
    mb.attention_mask.fill_(1)
    mb.cu_seqlens, mb.max_doc_len, mb.padded = cu, shape.max_doc_len, False
    if shape.bucketed:
        _pad_trained(mb, shape.trained_count(width, len(mb.select)), shape)
    return mb


def narrow_warmups(mb: MicroBatch, shape: StaticShape) -> list[MicroBatch]:
    """One micro-batch for each narrow width (`StaticShape.narrow_widths`), with `mb`'s optional fields, whose loss
    and gradient are exactly zero: samples of token 0, every advantage 0, no teacher log-prob. What graphs.py runs
    once and records before any such row comes (each has the shapes a real row of its width gets)."""
    unit = mb.inv_temperature is None
    out = []
    for width in shape.narrow_widths():
        piece = min(width, shape.max_doc_len)
        lengths = [piece] * (width // piece) + ([width % piece] if width % piece else [])
        row = [
            Sample(
                tokens=[0] * (n + 1),
                trained=[True] * n,
                advantages=[0.0] * n,
                temperature=1.0 if unit else 0.5,
                inference_logprobs=[0.0] * n if mb.inference_logp is not None else None,
                teacher_logprobs=[math.nan] * n if mb.teacher_logp is not None else None,
            )
            for n in lengths
        ]
        out.append(static_micro_batch(row, shape))
    return out


def _pad_trained(mb: MicroBatch, count: int, shape: StaticShape) -> None:
    """Pad the trained positions to `count`: the extra ones read position 0 and land in the loss layout's last
    slot, which no sample has (its mask is 0: they add nothing to the loss, its gradient or its stats)."""
    pad = count - len(mb.select)
    layout = shape.loss_layout
    assert layout is not None, "trained positions are padded in bucketed rows only"
    slots, span = layout
    mb.select = torch.cat([mb.select, torch.zeros(pad, dtype=torch.long)])
    mb.place = torch.cat([mb.place, torch.full((pad,), (slots - 1) * span, dtype=torch.long)])
    if mb.inv_temperature is not None:
        mb.inv_temperature = torch.cat([mb.inv_temperature, torch.ones(pad)])


class Deferred(Sequence[MicroBatch]):
    """A step's static micro-batches, each collated when it is first read (then dropped by the reader).

    The trainer reads micro-batch i just before its forward, so the GPU starts after one micro-batch's collation
    instead of all of them, and each later one is collated while the GPU still runs the work queued before it
    (H100 profile of a mixed-length step: 14-17 ms of collation with the GPU idle before the first launch)."""

    def __init__(self, rows: list[list[Sample]], shape: StaticShape) -> None:
        self.rows, self.shape = rows, shape

    def __len__(self) -> int:
        return len(self.rows)

    def widths(self) -> list[int]:
        """Each micro-batch's model tokens, without collating it."""
        return [self.shape.width_of(row) for row in self.rows]

    @overload
    def __getitem__(self, index: int) -> MicroBatch: ...
    @overload
    def __getitem__(self, index: slice) -> list[MicroBatch]: ...
    def __getitem__(self, index: int | slice) -> MicroBatch | list[MicroBatch]:
        if isinstance(index, slice):
            return [static_micro_batch(row, self.shape) for row in self.rows[index]]
        return static_micro_batch(self.rows[index], self.shape)
