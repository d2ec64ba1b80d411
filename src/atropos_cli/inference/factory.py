"""Turn one `ServerConfig` into the backend that serves it; the router calls this for each configured server.

`local` -> the in-process transformers backend (imported only here, only when asked: it pulls in torch);
every other server type (openai, vllm, sglang, trl) -> the OpenAI-compatible HTTP backend.

`serving(model, backend)`: while it is entered, a local server of `model` is served by that backend instead of
a new one. The trainer builds an env inside it, so the env's router (however the env's constructor builds it:
an Atropos env builds its own from server configs) samples from the engine whose weights the trainer updates.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from atropos_cli.config import ServerConfig
from atropos_cli.inference.base import InferenceBackend

__all__ = ["make_backend", "serving"]

_provided: contextvars.ContextVar[dict[str, InferenceBackend] | None] = contextvars.ContextVar(
    "atropos_provided_backends", default=None
)


@contextlib.contextmanager
def serving(model: str, backend: InferenceBackend) -> Iterator[None]:
    """Local servers of `model` built while this is entered are `backend` (one engine for all of them)."""
    token = _provided.set({**(_provided.get() or {}), model: backend})
    try:
        yield
    finally:
        _provided.reset(token)


def make_backend(config: ServerConfig) -> InferenceBackend:
    if config.server_type == "local":
        provided = (_provided.get() or {}).get(config.model_name)
        if provided is not None:
            return provided
        from atropos_cli.inference.local import LocalBackend

        return LocalBackend(config)
    from atropos_cli.inference.openai_compat import OpenAICompatBackend

    return OpenAICompatBackend(config)
