"""Turn one `ServerConfig` into the backend that serves it; the router calls this for each configured server.

`local` -> the in-process transformers backend (imported only here, only when asked: it pulls in torch);
every other server type (openai, vllm, sglang, trl) -> the OpenAI-compatible HTTP backend.
"""

from __future__ import annotations

from atropos_cli.config import ServerConfig
from atropos_cli.inference.base import InferenceBackend

__all__ = ["make_backend"]


def make_backend(config: ServerConfig) -> InferenceBackend:
    if config.server_type == "local":
        from atropos_cli.inference.local import LocalBackend

        return LocalBackend(config)
    from atropos_cli.inference.openai_compat import OpenAICompatBackend

    return OpenAICompatBackend(config)
