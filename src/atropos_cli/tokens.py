"""Token ids, masks and logprobs for the trainer, from whatever the backend and tokenizer provide.

Preference order for a rollout's tokens:
1. the backend's own ids (prompt ids + completion ids, logprobs per completion token): exact, no re-tokenising;
2. the tokenizer: chat template of the prompt (with generation prompt) + the completion text encoded, plus
   EOS when the model stopped on its own;
3. nothing: the group is still written (messages + scores), with `meta.tokens_missing` set.

Masks use Atropos' convention: -100 on prompt positions, the token id on trained positions; logprobs are 1.0
on masked positions. `transformers` is imported only when a tokenizer is actually loaded.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atropos_cli.inference.base import Generation
from atropos_cli.types import Message

__all__ = ["RolloutTokens", "build_rollout_tokens", "chat_prompt_ids", "MASKED", "MASKED_LOGPROB"]

MASKED = -100
MASKED_LOGPROB = 1.0


@dataclass
class RolloutTokens:
    tokens: list[list[int]]
    masks: list[list[int]]
    logprobs: list[list[float]] | None


def chat_prompt_ids(tokenizer: Any, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
    """Token ids of a chat rendered with the tokenizer's template, ending with the assistant's turn header (with
    `tools`, the OpenAI tool list the template shows the model, where it has a place for one)."""
    extra = {"tools": tools} if tools else {}
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, **extra)
    if hasattr(ids, "keys") and "input_ids" in ids:
        ids = ids["input_ids"]
    return list(ids)


def build_rollout_tokens(
    tokenizer: Any | None, messages: list[Message], generation: Generation, indices: list[int]
) -> RolloutTokens | None:
    """Tokens/masks/logprobs for the chosen choices of a generation, or None when there is no way to get them."""
    choices = [generation.choices[i] for i in indices]
    if generation.has_tokens:
        prompt = list(generation.prompt_token_ids or [])
        tokens = [prompt + list(c.token_ids or []) for c in choices]
        masks = [[MASKED] * len(prompt) + list(c.token_ids or []) for c in choices]
        logprobs = None
        if all(c.logprobs is not None and len(c.logprobs) == len(c.token_ids or []) for c in choices):
            logprobs = [[MASKED_LOGPROB] * len(prompt) + list(c.logprobs or []) for c in choices]
        return RolloutTokens(tokens, masks, logprobs)
    if tokenizer is None:
        return None
    prompt = chat_prompt_ids(tokenizer, messages)
    tokens, masks = [], []
    for choice in choices:
        completion = list(tokenizer.encode(choice.text, add_special_tokens=False))
        if choice.finish_reason == "stop" and tokenizer.eos_token_id is not None:
            completion.append(tokenizer.eos_token_id)
        tokens.append(prompt + completion)
        masks.append([MASKED] * len(prompt) + completion)
    return RolloutTokens(tokens, masks, None)
