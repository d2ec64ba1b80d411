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

from atropos_cli.errors import ModelLoadError
from atropos_cli.inference.base import Generation
from atropos_cli.resources import resolve_model_path
from atropos_cli.types import Message

__all__ = ["RolloutTokens", "build_rollout_tokens", "load_tokenizer", "chat_prompt_ids", "MASKED", "MASKED_LOGPROB"]

MASKED = -100
MASKED_LOGPROB = 1.0


@dataclass
class RolloutTokens:
    tokens: list[list[int]]
    masks: list[list[int]]
    logprobs: list[list[float]] | None


def load_tokenizer(name: str) -> Any:
    """AutoTokenizer for a shipped model's short name, a local directory or a hub id."""
    from pathlib import Path

    path = resolve_model_path(name)
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise ModelLoadError(
            f"cannot load tokenizer {name!r}: transformers is not installed",
            hint='install the local extra: pip install "atropos[local]"',
        ) from None
    if Path(path).exists() and not Path(path).is_dir():
        raise ModelLoadError(f"tokenizer path {path!r} is a file", hint="pass the model's directory")
    try:
        return AutoTokenizer.from_pretrained(path)
    except OSError as exc:
        if Path(path).is_dir():
            raise ModelLoadError(
                f"directory {path!r} has no tokenizer files",
                hint="save one with tokenizer.save_pretrained(DIR), or pass --env.tokenizer_name",
            ) from None
        raise ModelLoadError(
            f"cannot load tokenizer {name!r}: not a local directory and the Hugging Face hub is unreachable "
            f"or has no such repo ({type(exc).__name__})",
            hint="pass a local directory (a saved model) or one of the shipped models: atropos-tiny-arith",
        ) from None


def chat_prompt_ids(tokenizer: Any, messages: list[Message]) -> list[int]:
    """Token ids of a chat rendered with the tokenizer's template, ending with the assistant's turn header."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
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
