"""The recording proxy's settings: `atropos proxy`'s flags, and what the `harness:` env sets from its config
(a module of its own so that listing them imports no server code)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["ProxySettings"]


class ProxySettings(BaseModel):
    """The recording proxy's settings (`atropos proxy`'s flags; the harness env fills them from its config)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    tool_parser: str = "hermes"
    """How tool calls look in the policy's text (hermes, qwen, llama3_json, mistral, deepseek_v3, ...)."""
    max_tokens: int = Field(default=1024, ge=1)
    """Most tokens one call samples (a call asking for more, or for no limit, gets this many)."""
    temperature: float | None = Field(default=None, ge=0.0)
    """Sampling temperature of every call (unset: the harness's own value, 1.0 when it sends none)."""
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    """Nucleus sampling of every call (unset: the harness's own value)."""
    max_sessions: int = Field(default=1024, ge=1)
    """Most open sessions; past it a 429 (DELETE finished ones)."""
    max_calls: int = Field(default=256, ge=1)
    """Most model calls one session may make; past it a 429."""
    max_body_mb: float = Field(default=8.0, gt=0)
    """Largest request body (MiB); past it a 413."""
