"""atroposlib's record dicts and enum: `ScoredDataGroup`, `ScoredDataItem` (typed dicts env code builds empty
and fills key by key; they become our `ScoredGroup` when they reach the runner, which validates them),
`EvalHandlingEnum`."""

from __future__ import annotations

from enum import Enum
from typing import Any

from typing_extensions import TypedDict

from atropos_cli.compat.atroposlib.type_definitions import Message

__all__ = ["ScoredDataGroup", "ScoredDataItem", "EvalHandlingEnum"]


class ScoredDataGroup(TypedDict, total=False):
    tokens: list[list[int]]
    masks: list[list[int]]
    scores: list[float]
    advantages: list[list[float]] | None
    ref_logprobs: list[list[float]] | None
    messages: list[list[Message]] | None
    generation_params: dict[str, Any] | None
    inference_logprobs: list[list[float]] | None
    group_overrides: dict | None
    overrides: list[dict] | None
    images: Any | None
    distill_token_ids: list[list[list[int]]] | None
    distill_logprobs: list[list[list[float]]] | None


class ScoredDataItem(TypedDict, total=False):
    tokens: list[int]
    masks: list[int]
    scores: float
    advantages: list[float] | None
    ref_logprobs: list[float] | None
    messages: list[Message] | None
    group_overrides: dict | None
    overrides: dict | None
    images: Any | None
    distill_token_ids: list[list[int]] | None
    distill_logprobs: list[list[float]] | None


class EvalHandlingEnum(str, Enum):
    """How training workers behave while an eval runs (a str enum, so it also equals its name)."""

    STOP_TRAIN = "STOP_TRAIN"
    LIMIT_TRAIN = "LIMIT_TRAIN"
    NONE = "NONE"
