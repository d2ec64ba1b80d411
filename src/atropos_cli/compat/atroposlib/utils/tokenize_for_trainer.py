"""atroposlib.utils.tokenize_for_trainer: a chat -> {tokens, masks[, messages]} for the trainer.

Masks are -100 on every position the trainer must not learn, the token id elsewhere: by default only the
last message (the final assistant turn) is learned; with `train_on_all_assistant_turns=True` every
`assistant`/`agent` turn is. A trailing EOS is dropped when the completion was cut (`finish_reason ==
"length"`). Works with transformers 4 (apply_chat_template returns ids) and 5 (it returns a BatchEncoding).
"""

from __future__ import annotations

from typing import Any

__all__ = ["tokenize_for_trainer", "UNMASKED_ROLES"]

UNMASKED_ROLES = ["assistant", "agent"]


def _ids(tokenizer: Any, chat: list[Any], generation_prompt: bool = False) -> list[int]:
    if not chat:
        return []
    out = tokenizer.apply_chat_template(list(chat), tokenize=True, add_generation_prompt=generation_prompt)
    if hasattr(out, "keys") and "input_ids" in out:
        out = out["input_ids"]
    return [int(t) for t in out]


def _all_assistant_masks(tokenizer: Any, chat: list[Any], tokens: list[int]) -> list[int]:
    masks = [-100] * len(tokens)
    for i, message in enumerate(chat):
        if message["role"] not in UNMASKED_ROLES:
            continue
        start = len(_ids(tokenizer, chat[:i], generation_prompt=True))
        end = len(_ids(tokenizer, chat[: i + 1]))
        masks[start:end] = tokens[start:end]
    return masks


def tokenize_for_trainer(
    tokenizer: Any,
    chat: list[Any],
    include_messages: bool = False,
    train_on_all_assistant_turns: bool = False,
    finish_reason: str = "",
) -> dict[str, Any]:
    """Tokenize `chat` with the tokenizer's chat template; mask what the trainer must not learn."""
    tokens = _ids(tokenizer, chat)
    if train_on_all_assistant_turns:
        masks = _all_assistant_masks(tokenizer, chat, tokens)
    else:
        prefix = len(_ids(tokenizer, chat[:-1], generation_prompt=True))
        masks = [-100] * prefix + tokens[prefix:]
    if finish_reason == "length" and tokens and tokens[-1] == tokenizer.eos_token_id:
        tokens, masks = tokens[:-1], masks[:-1]
    out: dict[str, Any] = {"tokens": tokens, "masks": masks}
    if include_messages:
        out["messages"] = chat
    return out
