"""atroposlib.envs.server_handling.server_baseline: server configs and the per-server wrapper.

`APIServerConfig` IS our `ServerConfig` (with atroposlib's defaults and its lenient extra-key handling), so
the router runs it as is. `APIServer` is one configured server as env code sees it in `self.server.servers`:
`.config`, `.server_healthy`, `.sem` / `.eval_sem`, and `chat_completion` / `completion` /
`tokens_and_logprobs_completion` / `get_logprobs`, sent through a one-server router of ours (retries,
timeouts, clear errors) that shares the HTTP backend of the env's router.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from atropos_cli.config import ServerConfig
from atropos_cli.errors import InferenceError

__all__ = ["ServerBaseline", "APIServerConfig", "APIServer", "ReasoningConfig", "AsyncSemWithAdaptiveWeight"]

VALID_REASONING_EFFORTS = {"none", "minimal", "low", "medium", "high", "xhigh"}


class ServerBaseline(BaseModel):
    """Settings shared by all servers when their URLs are discovered rather than configured."""

    model_config = ConfigDict(extra="ignore")

    timeout: int = Field(default=1200, description="Timeout for the request in seconds.")
    num_max_requests_at_once: int = Field(default=512, description="Max concurrent training requests.")
    num_requests_for_eval: int = Field(default=64, description="Max concurrent eval requests.")
    model_name: str = Field(default="default", description="The model name to use.")
    rolling_buffer_length: int = Field(default=1000, description="Length of the timing buffers.")
    server_type: Literal["openai", "trl", "sglang", "vllm", "local"] = Field(default="openai")
    tokenizer_name: str = Field(default="none", description="Tokenizer; 'none' means use model_name.")


class APIServerConfig(ServerConfig, ServerBaseline):
    """One server: atroposlib's fields and defaults (api_key "", base_url "", n_kwarg_is_ignored, health_check)."""

    model_config = ConfigDict(extra="ignore")

    timeout: int = 1200

    @field_validator("api_key", "base_url", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        """atroposlib's fields are Optional[str] (env files pass `api_key=None`: read from the environment)."""
        return "" if value is None else value


@dataclass
class ReasoningConfig:
    """Reasoning ("thinking") request settings built from the env config's thinking fields."""

    enabled: bool = False
    effort: str | None = None
    max_tokens: int | None = None

    def __post_init__(self) -> None:
        if self.effort is not None and self.effort not in VALID_REASONING_EFFORTS:
            raise ValueError(f"reasoning effort {self.effort!r} is not one of {sorted(VALID_REASONING_EFFORTS)}")
        if self.effort is not None or self.max_tokens is not None:
            self.enabled = True

    def is_reasoning_kwargs_active(self) -> bool:
        return self.enabled

    def build_extra_body(self, base_url: str | None = None) -> dict[str, Any] | None:
        if not self.enabled:
            return None
        if base_url and "api.openai.com" in base_url:
            return {"reasoning_effort": self.effort or "medium"}
        reasoning: dict[str, Any] = {"enabled": True}
        if self.max_tokens is not None:
            reasoning["max_tokens"] = self.max_tokens
        elif self.effort is not None:
            reasoning["effort"] = self.effort
        return {"reasoning": reasoning}


class AsyncSemWithAdaptiveWeight(asyncio.Semaphore):
    """A semaphore that remembers its size (`max_val`) and a weight (`update_weight`) for fair sharing."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.max_val = value
        self.weight = 1.0

    def update_weight(self, weight: float) -> None:
        self.weight = weight

    def min_val(self) -> int:
        return int(self.max_val * (1.0 - self.weight)) if self.weight < 1.0 else 0


class APIServer:
    """One server of `ServerManager.servers` (subclasses name the backend kind, for isinstance checks)."""

    def __init__(self, config: APIServerConfig, reasoning_config: ReasoningConfig | None = None, router: Any = None):
        self.config = config
        self.reasoning_config = reasoning_config
        self.sem = AsyncSemWithAdaptiveWeight(config.num_max_requests_at_once)
        self.eval_sem = AsyncSemWithAdaptiveWeight(config.num_requests_for_eval)
        self.server_healthy = True
        self.initialized = True
        self.check_task = None
        self.attempts_list: list[int] = []
        self.request_timings: list[float] = []
        self.eval_attempts_list: list[int] = []
        self.eval_request_timings: list[float] = []
        if router is None:
            from atropos_cli.inference.router import ServerManager as Router

            router = Router([config])
        self.router = router

    async def update_weight(self, weight: float) -> None:
        self.sem.update_weight(weight)
        self.eval_sem.update_weight(weight)

    async def check_server_status_task(self, chat_completion: bool = True) -> None:
        """Health is the router's business here (a failed request is retried, then reported)."""

    async def wandb_metrics(self, metrics_dict: dict | None, server_name: str) -> dict:
        metrics = dict(metrics_dict or {})
        stats = self.router.stats()
        metrics[f"server/{server_name}_requests"] = stats["requests"]
        metrics[f"server/{server_name}_failures"] = stats["failures"]
        return metrics

    def _kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        kwargs = dict(kwargs)
        kwargs.pop("model", None)
        kwargs.pop("skip_reasoning", None)
        return kwargs

    async def chat_completion(self, **kwargs: Any) -> Any:
        return await self.router.chat_completion(**self._kwargs(kwargs))

    async def completion(self, **kwargs: Any) -> Any:
        return await self.router.completion(**self._kwargs(kwargs))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> tuple[list, list, list, list]:
        """(prompt_tokens, [output ids], [output logprobs], [finish reasons]) through the completions route."""
        kwargs = self._kwargs(kwargs)
        prompt = kwargs.pop("input_ids", None) or kwargs.pop("prompt")
        kwargs.pop("prompt", None)
        if "max_new_tokens" in kwargs:
            kwargs["max_tokens"] = kwargs.pop("max_new_tokens")
        generation = await self.router.completion(prompt, logprobs=True, **kwargs)
        if not generation.has_tokens:
            raise InferenceError(
                f"server {self.config.base_url or self.config.model_name} returned no token ids",
                hint="ManagedServer needs token ids: use --openai.server_type vllm (or local)",
            )
        outputs = [list(c.token_ids or []) for c in generation.choices]
        logprobs = [list(c.logprobs or [1.0] * len(c.token_ids or [])) for c in generation.choices]
        prompt_ids = list(prompt) if isinstance(prompt, list) else list(generation.prompt_token_ids or [])
        return prompt_ids, outputs, logprobs, [c.finish_reason or "stop" for c in generation.choices]

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        raise InferenceError(
            f"get_logprobs (prompt logprobs) is not available from a {self.config.server_type!r} server",
            hint="teacher logprobs need vLLM's native /generate: --teacher.server_type vllm",
        )
