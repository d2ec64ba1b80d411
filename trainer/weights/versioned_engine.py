"""The rollout engine of an engine rank: the local backend with weight swap points and a policy version per token.

Where it sits: on a `--inference-gpus` rank (`async_loop.py`) the env workers sample from a `VersionedBackend`
(a `LocalBackend`), whose `swap` hook (`WeightReceiver.apply`) copies the newest pushed weights in:
- on CPU (the batched `sample_rows` loop) before every model forward, i.e. between two decode steps: a push
  that lands mid-sequence takes effect at the next token, and the sequence continues under the new weights
  (its KV cache so far was computed by the old ones, as in PipelineRL's in-flight updates). Every forward of a
  batch produces token j of every row, so the version of token j is the version of forward j;
- on CUDA (the static engine, whose decode steps replay a captured graph) before each batch and between two
  launches of decode steps (`StaticEngine.run(swap=...)`: every `sync_every` tokens): running rows keep their
  KV cache and continue under the new weights, and the engine tags each token with the version of the launch
  that produced it.
Each sampled completion's versions are logged under its token ids; `tag_versions` then writes them into the
groups the env built from those completions: `meta.rollouts[i].policy_versions` (one per trained token, in
order) and `meta.policy_version` (the oldest version in the group, which bounds its staleness).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from atropos_cli.inference.local import LocalBackend
from atropos_cli.types import GroupMeta, RolloutMeta, ScoredGroup

__all__ = ["VersionedBackend", "tag_versions", "trained_spans"]


class VersionedBackend(LocalBackend):
    """A LocalBackend whose weights can be swapped between decode steps, recording the version per token."""

    def __init__(self, config: Any, **kwargs: Any) -> None:
        super().__init__(config, **kwargs)
        self.swap: Callable[[Any], int] = lambda model: 0
        self._forwards: list[int] | None = None
        self.log: dict[tuple[int, ...], list[list[int]]] = {}  # completion token ids -> versions, per sample
        self.per_token = self._state.model.device.type != "cuda"
        if self.per_token:
            self._state.model.register_forward_pre_hook(self._before_forward)

    def _before_forward(self, module: Any, args: Any) -> None:
        if self._forwards is not None:
            self._forwards.append(self.swap(module))

    def _sample(self, rows: list[Any]) -> list[Any]:
        version = self.swap(self._state.model)
        self._forwards = [] if self.per_token else None
        try:
            results = super()._sample(rows)
        finally:
            forwards, self._forwards = self._forwards, None
        for result in results:
            n = len(result.token_ids)
            if result.versions is not None:  # the static engine's own tags (its swap points)
                versions = result.versions
            else:  # the CPU loop: token j came from forward j
                versions = forwards[:n] if forwards is not None and len(forwards) >= n else [version] * n
            self.log.setdefault(tuple(result.token_ids), []).append(versions)
        return results

    def _swap_point(self, model: Any) -> Any:
        return lambda: self.swap(model)


def trained_spans(mask: list[int]) -> list[tuple[int, int]]:
    """[start, end) runs of trained positions (mask != -100): one per model turn of a rollout."""
    spans, start = [], None
    for i, m in enumerate(mask):
        if m != -100 and start is None:
            start = i
        elif m == -100 and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def _lookup(log: dict[tuple[int, ...], list[list[int]]], tokens: list[int]) -> list[int] | None:
    """The versions of the logged completion these trained tokens came from (exactly, or it cut at a stop
    token the env dropped / an EOS the env added)."""
    key = tuple(tokens)
    found = log.get(key)
    if found:
        return found.pop(0)
    for other, entries in log.items():
        if entries and (other[: len(key)] == key or key[: len(other)] == other):
            versions = entries.pop(0)
            return (versions + [versions[-1]] * len(key))[: len(key)] if versions else None
    return None


def tag_versions(groups: list[ScoredGroup], log: dict[tuple[int, ...], list[list[int]]], fallback: int) -> int:
    """Write per-token and per-group policy versions into `groups`' meta; returns how many trained tokens were
    not found in the engine's log (those get `fallback`, the version at the batch's start: a lower bound)."""
    unmatched = 0
    for group in groups:
        meta = group.meta or GroupMeta()
        rollouts = meta.rollouts or [RolloutMeta() for _ in range(group.size)]
        oldest: int | None = None
        for i, (tokens, mask) in enumerate(zip(group.tokens, group.masks, strict=True)):
            versions: list[int] = []
            for start, end in trained_spans(mask):
                found = _lookup(log, tokens[start:end])
                if found is None:
                    unmatched += end - start
                    found = [fallback] * (end - start)
                versions += found
            rollouts[i].policy_versions = versions
            if versions:
                oldest = min(versions) if oldest is None else min(oldest, min(versions))
        meta.rollouts = rollouts
        meta.policy_version = oldest if oldest is not None else fallback
        group.meta = meta
    return unmatched
