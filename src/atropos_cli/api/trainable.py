"""What a trainer can train: the checks `atropos api` answers with 422 at POST and `atropos train` applies to
every group it gets (skipped and counted there, never an exit).

A token id must index the model's embedding: 0 <= id < vocab_size (the API knows vocab_size when the trainer
registered it: our trainer sends `vocab_size` with `POST /register`; Atropos' trainers do not, and then only
negative ids are refused). Scores, advantages and log-probs must be finite (JSON cannot carry NaN/Infinity) and
at most `MAX_ABS_VALUE` in magnitude: a reward of 1e308 is finite but its square, which the advantage's
variance needs, is not, and fp32 training overflows long before.
"""

from __future__ import annotations

from atropos_cli.types import MAX_ABS_VALUE, ScoredGroup, value_problem

__all__ = ["MAX_ABS_VALUE", "untrainable", "value_problem"]


def _token_problem(group: ScoredGroup, vocab_size: int | None) -> str | None:
    for i, tokens in enumerate(group.tokens):
        if not tokens:
            continue
        low, high = min(tokens), max(tokens)
        if low < 0:
            return f"rollout {i}: token id {low} is negative"
        if vocab_size is not None and high >= vocab_size:
            return f"rollout {i}: token id {high} is outside the trainer's vocabulary (0..{vocab_size - 1})"
    return None


def untrainable(group: ScoredGroup, vocab_size: int | None = None) -> str | None:
    """Why no trainer could train `group` (one line naming the rollout), or None when it can."""
    problem = _token_problem(group, vocab_size) or value_problem("score", group.scores)
    for name in ("advantages", "ref_logprobs", "inference_logprobs", "distill_logprobs"):
        rows = getattr(group, name, None) or []
        for i, row in enumerate(rows):
            flat = [v for item in row for v in (item if isinstance(item, list) else [item])] if row else []
            problem = problem or value_problem(name, flat, i)
    return problem
