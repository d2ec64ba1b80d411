"""The wire schema, defined once: `ScoredGroup` and the small models around it.

`ScoredGroup` is the one record for files (jsonl, parquet), HTTP (the trajectory API) and the trainer. Its
top-level fields are a superset of Atropos' `ScoredData` (same names, same shapes), so a group posted by an
Atropos environment parses here and `to_scored_data()` gives exactly the 14 keys an Atropos trainer reads.
What we add lives under the single optional `meta` key (provenance and per-rollout diagnostics).

Validation happens once, at construction, and names the bad rollout: "rollout 3: tokens has 12 entries but
masks has 11". Offline runs without a tokenizer may leave `tokens`/`masks` empty; `require_tokens()` is the
check the API and the trainer apply.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, model_validator

__all__ = [
    "MAX_ABS_VALUE",
    "value_problem",
    "Message",
    "RolloutMeta",
    "GroupMeta",
    "ScoredGroup",
    "RolloutFailure",
    "SCORED_DATA_KEYS",
    "describe_validation_error",
    "PolicyVersion",
    "MAX_POLICY_VERSION",
]

MAX_POLICY_VERSION = 2**31 - 1
PolicyVersion = Annotated[int, Strict(), Field(ge=0, le=MAX_POLICY_VERSION)]
"""A policy version (trainer step) as it crosses a boundary: a JSON integer in [0, 2**31-1]; `true`, `"3"` and
`3.0` are refused, not coerced (the API's ingest also bounds it by the trainer's step, `api/staleness.py`)."""

# The exact keys of Atropos' ScoredData (the body of POST /scored_data), in its order.
SCORED_DATA_KEYS = (
    "tokens",
    "masks",
    "scores",
    "advantages",
    "ref_logprobs",
    "messages",
    "generation_params",
    "inference_logprobs",
    "overrides",
    "group_overrides",
    "images",
    "env_id",
    "distill_token_ids",
    "distill_logprobs",
)

# A chat message as Atropos stores it: role + content, extra keys (reward, tool_calls, name) kept as they are.
Message = dict[str, Any]


class RolloutMeta(BaseModel):
    """Per-rollout diagnostics that Atropos does not carry."""

    model_config = ConfigDict(extra="allow")

    finish_reason: str | None = None
    reward_parts: dict[str, float] | None = None
    completion_tokens: int | None = None
    latency_s: float | None = None
    policy_versions: list[PolicyVersion] | None = None
    """The policy version (trainer step) that produced each trained token (mask != -100), in order; a weight swap
    mid-sequence shows as a step up. Set by the disaggregated loop's engines (`--inference-gpus`)."""


class GroupMeta(BaseModel):
    """Provenance of a group: who made it, from what, how. Every field is optional."""

    model_config = ConfigDict(extra="allow")

    group_id: str | None = None
    env: str | None = None
    env_version: str | None = None
    item_id: str | None = None
    item_digest: str | None = None
    """16 hex digits of the item's content (`env.item_digest`), equal in every process: the groups of one item
    are findable, and duplicates countable, whether or not the env gives its items ids."""
    index: int | None = None
    """Position of the item in the run's (seeded, deterministic) item stream; `--resume` skips done indices."""
    model: str | None = None
    sampling: dict[str, Any] | None = None
    seed: int | None = None
    created_at: float | None = None
    duration_s: float | None = None
    failed_rollouts: int = 0
    rollouts: list[RolloutMeta] | None = None
    tokens_missing: bool = False
    policy_version: PolicyVersion | None = None
    """The oldest policy version (trainer step) that produced any token of the group: the trajectory API and the
    trainer measure staleness from it (trainer step - policy_version)."""


def _is_list_of_lists(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, list) for v in value)


class ScoredGroup(BaseModel):
    """A group of scored rollouts of one item. Field names and shapes follow Atropos' `ScoredData`."""

    model_config = ConfigDict(extra="ignore")

    tokens: list[list[int]] = Field(default_factory=list)
    masks: list[list[int]] = Field(default_factory=list)
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[Message]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    overrides: list[dict[str, Any]] | None = None
    group_overrides: dict[str, Any] | None = None
    images: Any | None = None
    env_id: int | None = None
    distill_token_ids: list[list[list[int]]] | None = None
    distill_logprobs: list[list[list[float]]] | None = None
    meta: GroupMeta | None = None

    @property
    def size(self) -> int:
        return len(self.scores)

    @property
    def has_tokens(self) -> bool:
        return bool(self.tokens) and len(self.tokens) == self.size

    @model_validator(mode="after")
    def _check_shapes(self) -> ScoredGroup:
        n = len(self.scores)
        if n == 0:
            raise ValueError("group is empty: scores has no entries (a group needs at least one rollout)")
        for i, score in enumerate(self.scores):
            if not math.isfinite(score):
                raise ValueError(f"rollout {i}: score is {score!r}; scores must be finite numbers")
        if self.tokens or self.masks:
            _check_count("tokens", self.tokens, n)
            _check_count("masks", self.masks, n)
            for i, (toks, mask) in enumerate(zip(self.tokens, self.masks, strict=True)):
                if len(toks) != len(mask):
                    raise ValueError(
                        f"rollout {i}: tokens has {len(toks)} entries but masks has {len(mask)}; "
                        "masks must align with tokens (-100 where not trained)"
                    )
        for name in ("advantages", "ref_logprobs", "inference_logprobs"):
            per_token = getattr(self, name)
            if per_token is None:
                continue
            _check_count(name, per_token, n)
            if self.tokens:
                for i, (values, toks) in enumerate(zip(per_token, self.tokens, strict=True)):
                    if len(values) != len(toks):
                        raise ValueError(f"rollout {i}: {name} has {len(values)} entries but tokens has {len(toks)}")
        for name in ("messages", "overrides"):
            value = getattr(self, name)
            if value is not None:
                _check_count(name, value, n)
        if self.messages is not None:
            for i, chat in enumerate(self.messages):
                for j, message in enumerate(chat):
                    if not isinstance(message, dict) or "role" not in message or "content" not in message:
                        raise ValueError(f"rollout {i}: message {j} needs 'role' and 'content' keys")
        if self.meta is not None and self.meta.rollouts is not None:
            _check_count("meta.rollouts", self.meta.rollouts, n)
            for i, rollout in enumerate(self.meta.rollouts):
                per_token, row = rollout.policy_versions, self.tokens[i] if self.tokens else None
                if row is not None and per_token is not None and len(per_token) > len(row):
                    raise ValueError(
                        f"rollout {i}: meta.rollouts.policy_versions has {len(per_token)} entries, more "
                        f"than its {len(row)} tokens (one per trained token)"
                    )
        return self

    @property
    def policy_version_span(self) -> tuple[int, int] | None:
        """(oldest, newest) policy version of any token: over `meta.policy_version` and every rollout's per-token
        `policy_versions` (a producer's group version alone could hide an older token list); None without any."""
        if self.meta is None:
            return None
        lows = [self.meta.policy_version] if self.meta.policy_version is not None else []
        highs = list(lows)
        for rollout in self.meta.rollouts or ():
            if rollout.policy_versions:
                lows.append(min(rollout.policy_versions))
                highs.append(max(rollout.policy_versions))
        return (min(lows), max(highs)) if lows else None

    @property
    def oldest_policy_version(self) -> int | None:
        span = self.policy_version_span
        return span[0] if span is not None else None

    def require_tokens(self) -> None:
        """Raise ValueError unless every rollout carries token ids (needed by the API and the trainer)."""
        if not self.has_tokens:
            raise ValueError(
                "group has no token ids; set tokenizer_name (or use a backend that returns token ids) "
                "to post groups to a trajectory API or to train on them"
            )

    def to_scored_data(self) -> dict[str, Any]:
        """The exact Atropos `ScoredData` dict (14 keys, nulls included), as the trajectory API serves it."""
        return {key: getattr(self, key) for key in SCORED_DATA_KEYS}

    def to_wire(self) -> dict[str, Any]:
        """What goes over HTTP (POST /scored_data, GET /batch): `to_scored_data()`, plus `meta` with only the
        policy versions when the group has them (an extra optional key: Atropos' readers ignore it)."""
        data = self.to_scored_data()
        version = self.meta.policy_version if self.meta is not None else None
        if version is None:
            return data
        meta: dict[str, Any] = {"policy_version": version}
        rollouts = self.meta.rollouts if self.meta is not None else None
        if rollouts and any(r.policy_versions is not None for r in rollouts):
            meta["rollouts"] = [{"policy_versions": r.policy_versions} for r in rollouts]
        return {**data, "meta": meta}

    def to_record(self) -> dict[str, Any]:
        """The dict written to jsonl: Atropos' keys plus `meta`, without empty optional keys."""
        return self.model_dump(mode="json", exclude_none=True)


class RolloutFailure(BaseModel):
    """A rollout or group that failed: written to failures.jsonl, never dropped silently."""

    model_config = ConfigDict(extra="ignore")

    kind: Literal["rollout", "group"] = "group"
    group_id: str | None = None
    env: str | None = None
    item_id: str | None = None
    index: int | None = None
    rollout_index: int | None = None
    error_type: str
    error: str
    created_at: float | None = None


def _check_count(name: str, value: list[Any], n: int) -> None:
    if len(value) != n:
        raise ValueError(f"{name} has {len(value)} rollouts but scores has {n}; give one entry per rollout")


def describe_validation_error(exc: ValidationError) -> str:
    """One line for a failed validation, naming the field path of the first error.

    `inference_logprobs.0: Input should be a valid list (got 0.5) (and 2 more)`; a shape check of
    `ScoredGroup` (which names its rollout itself) reads as its message alone.
    """
    first = exc.errors()[0]
    where = ".".join(str(part) for part in first["loc"])
    message = first["msg"].removeprefix("Value error, ")
    if first["type"] not in ("value_error", "missing") and "input" in first:
        shown = repr(first["input"])
        message += f" (got {shown[:60] + '...' if len(shown) > 60 else shown})"
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return f"{where + ': ' if where else ''}{message}{more}"


MAX_ABS_VALUE = 1e6
"""Largest |score|, |advantage| and |log-prob| a group may carry (rewards are usually within ±10): a reward of
1e308 is finite but its square, which the advantage's variance needs, is not (`api.trainable`)."""


def value_problem(name: str, values: list[float], rollout: int | None = None) -> str | None:
    """Why `values` cannot be trained (the first non-finite or beyond ±MAX_ABS_VALUE), or None."""
    for value in values:
        if not math.isfinite(value) or abs(value) > MAX_ABS_VALUE:
            where = f"rollout {rollout}: " if rollout is not None else ""
            return f"{where}{name} {value!r} is outside ±{MAX_ABS_VALUE:g}"
    return None
