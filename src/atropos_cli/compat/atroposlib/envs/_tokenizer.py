"""The tokenizer atroposlib env code sees: `apply_chat_template` with transformers 4's defaults.

atroposlib 0.4.0 runs on transformers 4, where `tokenizer.apply_chat_template(chat)` returns the token ids; env
files rely on it (`max_tokens = max_token_length - len(tokenizer.apply_chat_template(chat, ...))`). Transformers
5 returns a BatchEncoding there (`len()` is 2: its keys), so those files would ask for the wrong lengths. Here
the env's tokenizer returns ids unless the caller passes `return_dict=True`, whichever transformers is installed.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

__all__ = ["with_atroposlib_defaults"]

_MARK = "_atroposlib_chat_template_defaults"


def with_atroposlib_defaults(tokenizer: Any) -> Any:
    """`tokenizer` itself, its `apply_chat_template` defaulting to `return_dict=False` where transformers' default
    is True (transformers 5). Idempotent; anything without such a method is returned unchanged."""
    method = getattr(tokenizer, "apply_chat_template", None)
    if method is None or getattr(tokenizer, _MARK, False):
        return tokenizer
    try:
        parameter = inspect.signature(method).parameters.get("return_dict")
    except (TypeError, ValueError):  # a builtin or an odd callable: leave it as it is
        return tokenizer
    if parameter is None or parameter.default is not True:
        return tokenizer

    @functools.wraps(method)
    def apply_chat_template(*args: Any, return_dict: bool = False, **kwargs: Any) -> Any:
        return method(*args, return_dict=return_dict, **kwargs)

    try:
        tokenizer.apply_chat_template = apply_chat_template
        setattr(tokenizer, _MARK, True)
    except (AttributeError, TypeError):  # a frozen or slotted object: nothing to adapt
        pass
    return tokenizer
