"""What `collect_trajectories` (and `collect_trajectory`, `postprocess_histories`) must return, checked where the
runner receives it, so a wrong shape is one line naming the hook, the field and what was expected (an env written
for atroposlib otherwise fails deep inside the layer that reads the group).

- `collect_trajectories(item)` -> `(groups, backlog)`: groups a group, a list of groups, or None; backlog a list;
- `collect_trajectory(item)` -> `(rollout or None, backlog)`;
- a group: a `ScoredGroup`, or a dict whose `tokens` and `masks` (when given) hold one list of ints per rollout
  and whose `scores` hold one number per rollout.

A field missing or None is left to the group's own validation (a group without token ids is fine for viewing).
"""

from __future__ import annotations

from collections.abc import Mapping
from numbers import Real
from typing import Any

from atropos_cli.errors import EnvCodeError
from atropos_cli.types import ScoredGroup

__all__ = ["pair_problem", "groups_problem", "shape_error"]

GROUP = "a ScoredDataGroup (a dict of tokens, masks and scores, one entry per rollout)"
HINT = "collect_trajectories returns (group, backlog); a group holds one entry per rollout in each field"
PER_ROLLOUT = {
    "tokens": "a list of token-id lists, one per rollout",
    "masks": "a list of mask lists, one per rollout",
    "scores": "a list of numbers, one per rollout",
}


def describe(value: Any) -> str:
    """`a list of 3 dicts`, `a str`, `None`: what a value is, for a message."""
    if value is None:
        return "None"
    kind = type(value).__name__
    if isinstance(value, list | tuple) and not isinstance(value, ScoredGroup):
        inner = sorted({type(v).__name__ for v in value})
        plural = "s" if len(value) != 1 else ""
        return f"a {kind} of {len(value)}" + (f" {'/'.join(inner)}{plural}" if inner else "")
    return f"a {kind}"


def pair_problem(value: Any, what: str) -> str | None:
    """Why `value` is not `(what, backlog)`, or None when it is."""
    expected = f"expected a pair ({what}, backlog)"
    if isinstance(value, Mapping | ScoredGroup):
        return f"{describe(value)} alone; {expected}"
    if not isinstance(value, tuple | list) or len(value) != 2:
        return f"{describe(value)}; {expected}"
    if all(isinstance(v, Mapping | ScoredGroup) for v in value):
        return f"{describe(value)} (two groups, no backlog); {expected}"
    backlog = value[1]
    if backlog is not None and not isinstance(backlog, list | tuple):
        return f"a pair whose backlog is {describe(backlog)}; {expected}"
    return None


def groups_problem(result: Any) -> str | None:
    """Why `result` is not a group, a list of groups (None entries allowed) or None; naming the field."""
    if result is None:
        return None
    listed = isinstance(result, list)
    for index, group in enumerate(result if listed else [result]):
        if group is None or isinstance(group, ScoredGroup):
            continue
        if not isinstance(group, Mapping):
            return f"{f'a list whose item {index} is ' if listed else ''}{describe(group)}; expected {GROUP}"
        for field, expected in PER_ROLLOUT.items():
            problem = _field_problem(group.get(field), field == "scores")
            if problem:
                where = f"a list whose item {index} has" if listed else "a group with"
                return f"{where} '{field}' {problem}; expected {expected}"
    return None


def _field_problem(value: Any, numbers: bool) -> str | None:
    """What is wrong with a per-rollout field: not a list, or entries of the other kind (a rollout's own token ids
    where a list of them belongs, lists where scores belong). Finer checks are the group's validation's."""
    if value is None:
        return None
    if not isinstance(value, list | tuple):
        return f"as {describe(value)}"
    for entry in value:
        if numbers and (isinstance(entry, bool | str | list | tuple | Mapping) or entry is None):
            return f"as {describe(value)}"
        if not numbers and (isinstance(entry, Real | str | Mapping) or entry is None):
            return f"as {describe(value)}" + (" (one rollout's, not a group's)" if isinstance(entry, Real) else "")
    return None


def shape_error(env: Any, hook: str, problem: str) -> EnvCodeError:
    """`my_env.py:40: MyEnv.collect_trajectories returned ...`: at the hook's own file and line."""
    code = getattr(getattr(type(env), hook, None), "__code__", None)
    return EnvCodeError(
        f"{type(env).__name__}.{hook} returned {problem}",
        hint=HINT,
        file=code.co_filename if code is not None else None,
        line=code.co_firstlineno if code is not None else None,
    )
