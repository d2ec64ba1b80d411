"""Rejection sampling: SFT rows and DPO pairs from scored groups, with a count of every rollout left out and why.

Sits between the readers (rollout files, or a live trajectory API) and `formats.dataset`:

    iter_groups(...) / iter_api_groups(...) ──► select_sft / select_dpo ──► SftRow / DpoRow ──► formats.dataset

The selection rules follow Atropos' `atropos-sft-gen` / `atropos-dpo-gen` (restated in `select_sft`, `select_dpo`
and `_score_filter`), made deterministic and streaming (one group at a time; dedupe keeps only a set of 64-bit
hashes). Every rollout read is accounted for exactly once: it becomes a row (SFT) or a pair's chosen side (DPO),
or (DPO) a rejected answer only, or it is counted under one `DropReason`, so
`rollouts_read == rows_written + rejected_only + sum(dropped)` always holds and a user can see where the data went.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from atropos_cli.datagen.options import DpoOptions, SelectOptions, SftOptions
from atropos_cli.datagen.samples import Provenance, Sample, Sourced, decode_sample, provenance_of, split_messages
from atropos_cli.errors import RecordError
from atropos_cli.types import Message

__all__ = [
    "DropReason",
    "SelectOptions",
    "SftOptions",
    "DpoOptions",
    "SftRow",
    "DpoRow",
    "DatagenStats",
    "select_sft",
    "select_dpo",
    "row_key",
]


class DropReason(str, Enum):
    """Why a rollout did not become a row; the value is what the summary table shows."""

    NON_POSITIVE = "score <= 0"
    BELOW_MIN_SCORE = "below --min-score"
    MARGIN = "margin too small"
    TOP_N = "over the per-group limit"
    DUPLICATE = "duplicate"
    TOO_LONG = "too long"
    UNPARSEABLE = "unparseable"
    LIMIT = "over --num-seqs-to-save"


@dataclass
class DatagenStats:
    """What a run read, wrote and left out (the summary table and the dataset card are built from this).

    A plain dataclass, not pydantic: its counters are bumped once per rollout on the hot path.
    """

    groups_read: int = 0
    rollouts_read: int = 0
    rows_written: int = 0
    bad_records: int = 0
    rejected_only: int = 0
    """DPO: rollouts in a pair only as its rejected answer (not counted as dropped)."""
    _drops: dict[DropReason, int] = field(default_factory=dict)

    def drop(self, reason: DropReason) -> None:
        self._drops[reason] = self._drops.get(reason, 0) + 1

    @property
    def dropped(self) -> dict[str, int]:
        """Rollouts left out, by the reason's text (`score <= 0`, `duplicate`, ...)."""
        return {reason.value: count for reason, count in self._drops.items()}

    def breakdown(self, kind: str) -> list[tuple[str, int]]:
        """(label, rollouts) for the summary table and the dataset card: where the rollouts not in a row went.

        For DPO a rollout has two possible roles; it is counted once: as chosen (a pair), as rejected only,
        or under the reason it was in no pair (its reason as a would-be chosen answer).
        """
        rows = [("used only as rejected", self.rejected_only)] if kind == "dpo" else []
        prefix = "in no pair" if kind == "dpo" else "dropped"
        drops = sorted(self.dropped.items(), key=lambda kv: -kv[1])
        return rows + [(f"{prefix}: {reason}", count) for reason, count in drops]


@dataclass(slots=True)
class SftRow:
    sample: Sample
    score: float
    provenance: Provenance


@dataclass(slots=True)
class DpoRow:
    prompt: list[Message]
    chosen: Sample
    rejected: Sample
    score: float
    rejected_score: float
    provenance: Provenance


@dataclass
class _GroupView:
    """Per-group lazy parsing: a rollout is turned into text only if the cheap score filters let it through."""

    item: Sourced
    tokenizer: Any
    options: SelectOptions
    _samples: dict[int, Sample | DropReason] = field(default_factory=dict)

    def sample(self, i: int) -> Sample | DropReason:
        """The rollout's text, or the reason it cannot be used (unparseable / too long)."""
        if i not in self._samples:
            self._samples[i] = self._parse(i)
        return self._samples[i]

    def _parse(self, i: int) -> Sample | DropReason:
        group = self.item.group
        limit = self.options.max_token_len
        if limit is not None and group.has_tokens and len(group.tokens[i]) > limit:
            return DropReason.TOO_LONG
        try:
            sample = self._text(i)
        except ValueError:
            return DropReason.UNPARSEABLE
        if sample is None:
            return DropReason.UNPARSEABLE
        if self.options.max_chars is not None:
            chars = sum(len(m["content"]) for m in sample.prompt) + sum(len(m["content"]) for m in sample.completion)
            if chars > self.options.max_chars:
                return DropReason.TOO_LONG
        return sample

    def _text(self, i: int) -> Sample | None:
        """Messages first; else token ids decoded with the tokenizer. Also falls back to the tokens when the chat
        has no completion turn (Atropos' process-mode files keep one flat message per rollout)."""
        group = self.item.group
        if group.messages is not None:
            try:
                return Sample(*split_messages(group.messages[i]))
            except ValueError:
                if not (group.has_tokens and self.tokenizer is not None):
                    raise
        if not group.has_tokens:
            return None
        if self.tokenizer is None:
            raise RecordError(
                f"group {self.item.source}:{self.item.index} has token ids but no messages, "
                "so its text cannot be recovered without a tokenizer",
                hint="pass --tokenizer with the model's directory (or a shipped model such as "
                "atropos-tiny-arith), or regenerate the rollouts so they carry messages",
            )
        return decode_sample(group, i, self.tokenizer)


def _score_filter(score: float, low: float, options: SelectOptions) -> DropReason | None:
    """Atropos' per-rollout score rules: positive only (unless allowed), then the margin over the group minimum."""
    if not options.allow_negative_scores and score <= 0:
        return DropReason.NON_POSITIVE
    if options.min_score is not None and score < options.min_score:
        return DropReason.BELOW_MIN_SCORE
    if options.minimum_score_diff_max_min > 0 and not score - low > options.minimum_score_diff_max_min:
        return DropReason.MARGIN
    return None


def row_key(*parts: list[Message]) -> int:
    # Python's hash of a tuple of strings: 64 bits, stable within one run, which is all dedupe needs.
    return hash(tuple((m["role"], m["content"]) for part in parts for m in part) + (len(parts[0]),))


def select_sft(
    groups: Iterable[Sourced],
    options: SftOptions,
    stats: DatagenStats,
    *,
    tokenizer: Any = None,
    seen: set[int] | None = None,
) -> Iterator[SftRow]:
    """Yield SFT rows: per group, the best `save_top_n_per_group` rollouts that pass every filter.

    Ties keep the rollouts' original order (a stable sort), so output is deterministic.
    """
    seen = set() if seen is None else seen  # pre-filled with an appended dataset's rows
    limit = options.num_seqs_to_save
    for item in groups:
        group = item.group
        stats.groups_read += 1
        stats.rollouts_read += group.size
        view = _GroupView(item, tokenizer, options)
        provenance = provenance_of(item)
        low = min(group.scores)
        kept = 0
        for i in sorted(range(group.size), key=lambda j: -group.scores[j]):
            score = group.scores[i]
            reason = _score_filter(score, low, options)
            if reason is None and kept >= options.save_top_n_per_group:
                reason = DropReason.TOP_N
            if reason is None and limit is not None and stats.rows_written >= limit:
                reason = DropReason.LIMIT
            if reason is None:
                sample = view.sample(i)
                if isinstance(sample, DropReason):
                    reason = sample
                elif options.dedupe:
                    key = row_key(sample.prompt, sample.completion)
                    if key in seen:
                        reason = DropReason.DUPLICATE
                    else:
                        seen.add(key)
            if reason is not None:
                stats.drop(reason)
                continue
            kept += 1
            stats.rows_written += 1
            yield SftRow(sample, score, provenance)  # type: ignore[arg-type]
        if limit is not None and stats.rows_written >= limit:
            return  # before pulling the next group: with --api-url that would wait for more data


def _group_rng(seed: int, group_id: str) -> random.Random:
    # One generator per group, seeded by (seed, group id): a group's pairs do not depend on the groups read
    # before it, so filtering or reordering inputs never changes which negative a group gets.
    return random.Random(f"{seed}:{group_id}")


def select_dpo(
    groups: Iterable[Sourced],
    options: DpoOptions,
    stats: DatagenStats,
    *,
    tokenizer: Any = None,
    seen: set[int] | None = None,
) -> Iterator[DpoRow]:
    """Yield DPO pairs: Atropos' `atropos-dpo-gen` rule, made deterministic by `seed`.

    Per group: positives are the rollouts by descending score (score > 0 unless negative scores are allowed);
    the negative pool is the `save_n_pairs_per_group` lowest-scoring rollouts; each of the first n positives
    draws (seeded) one pool rollout scoring strictly below `its score - minimum_score_diff_max_min`, which then
    leaves the pool. Stats count each rollout once: chosen (`rows_written`), rejected only (`rejected_only`), or
    dropped under its reason as a would-be chosen answer.
    """
    seen = set() if seen is None else seen  # pre-filled with an appended dataset's rows
    limit = options.num_seqs_to_save
    for item in groups:
        stats.groups_read += 1
        stats.rollouts_read += item.group.size
        yield from _group_pairs(item, options, stats, tokenizer, seen)
        if limit is not None and stats.rows_written >= limit:
            return  # before pulling the next group: with --api-url that would wait for more data


def _group_pairs(
    item: Sourced, options: DpoOptions, stats: DatagenStats, tokenizer: Any, seen: set[int]
) -> Iterator[DpoRow]:
    group = item.group
    view = _GroupView(item, tokenizer, options)
    provenance = provenance_of(item)
    rng = _group_rng(options.seed, provenance.group_id)
    order = sorted(range(group.size), key=lambda j: -group.scores[j])
    pool = sorted(range(group.size), key=lambda j: group.scores[j])[: options.save_n_pairs_per_group]
    attempts = 0
    limit = options.num_seqs_to_save
    not_chosen: dict[int, DropReason] = {}
    rejected: set[int] = set()
    for i in order:
        score = group.scores[i]
        reason: DropReason | None = None
        if not options.allow_negative_scores and score <= 0:
            reason = DropReason.NON_POSITIVE
        elif options.min_score is not None and score < options.min_score:
            reason = DropReason.BELOW_MIN_SCORE
        elif attempts >= options.save_n_pairs_per_group:
            reason = DropReason.TOP_N
        elif limit is not None and stats.rows_written >= limit:
            reason = DropReason.LIMIT
        if reason is not None:
            not_chosen[i] = reason
            continue
        attempts += 1
        row_or_reason = _pair_for(i, view, pool, rng, options, seen)
        if isinstance(row_or_reason, DropReason):
            not_chosen[i] = row_or_reason
            continue
        chosen, j, rejected_sample = row_or_reason
        rejected.add(j)
        stats.rows_written += 1
        yield DpoRow(chosen.prompt, chosen, rejected_sample, score, group.scores[j], provenance)
    for i, reason in not_chosen.items():  # each rollout counted once: a rejected answer is not "dropped"
        if i in rejected:
            stats.rejected_only += 1
        else:
            stats.drop(reason)


def _pair_for(
    i: int, view: _GroupView, pool: list[int], rng: random.Random, options: DpoOptions, seen: set[int]
) -> tuple[Sample, int, Sample] | DropReason:
    scores = view.item.group.scores
    chosen = view.sample(i)
    if isinstance(chosen, DropReason):
        return chosen
    threshold = scores[i] - options.minimum_score_diff_max_min
    candidates = [j for j in pool if j != i and scores[j] < threshold and isinstance(view.sample(j), Sample)]
    if not candidates:
        return DropReason.MARGIN
    j = rng.choice(candidates)
    pool.remove(j)
    rejected = view.sample(j)
    assert isinstance(rejected, Sample)
    if options.dedupe:
        key = row_key(chosen.prompt, chosen.completion, rejected.completion)
        if key in seen:
            return DropReason.DUPLICATE
        seen.add(key)
    return chosen, j, rejected
