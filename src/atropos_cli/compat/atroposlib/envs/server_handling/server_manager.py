"""atroposlib.envs.server_handling.server_manager: `ServerManager`, what env code calls as `self.server`.

It IS our router (`atropos_cli.inference.router.ServerManager`: routing to the freest server, n-splitting,
retries, clear errors), built from atroposlib-style configs, plus atroposlib's extras: `.servers` (one
`OpenAIServer` / `VLLMServer` / ... per config, for `isinstance` checks and direct calls),
`tokens_and_logprobs_completion`, `get_logprobs`, `managed_server()`, `dedicated_server()`, `update_weight`.

Configs: a list -> one server each. A lone `APIServerConfig` -> that one server (atroposlib itself would
discover URLs instead and ignore its base_url). A `ServerBaseline` -> atroposlib's discovery: four local
servers at http://localhost:9004..9007/v1, or inside a Slurm job its inference nodes (`_slurm.py`)
(`atropos process|serve` instead treat a baseline as one server configured by `--openai.*`, or the local
model when no URL is given). `slurm=True` (`--slurm true`): the first config copied to every inference
server of the Slurm job. `testing=True` (`--testing true`): `servers` is one `ServerHarness` and every
request goes to it; one it was not programmed for is a ConfigError (atroposlib returns None).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from pydantic import BaseModel, Field

from atropos_cli.compat.atroposlib.envs.server_handling._slurm import inference_urls
from atropos_cli.compat.atroposlib.envs.server_handling.managed_server import DummyManagedServer, ManagedServer
from atropos_cli.compat.atroposlib.envs.server_handling.openai_server import OpenAIServer
from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ReasoningConfig,
    ServerBaseline,
)
from atropos_cli.compat.atroposlib.envs.server_handling.server_harness import ServerHarness
from atropos_cli.compat.atroposlib.envs.server_handling.sglang_server import SGLangServer
from atropos_cli.compat.atroposlib.envs.server_handling.trl_vllm_server import TrlVllmServer
from atropos_cli.compat.atroposlib.envs.server_handling.vllm_server import VLLMServer
from atropos_cli.config import ServerConfig
from atropos_cli.errors import ConfigError
from atropos_cli.inference.router import ServerManager as Router

__all__ = ["ServerManager", "ServerManagerConfig", "APIServerConfig", "ServerBaseline", "APIServer"]

SERVER_CLASSES: dict[str, type[APIServer]] = {
    "openai": OpenAIServer,
    "vllm": VLLMServer,
    "sglang": SGLangServer,
    "trl": TrlVllmServer,
    "local": APIServer,
}


class ServerManagerConfig(BaseModel):
    slurm: bool = Field(default=False, description="Whether environment is running on slurm or not.")
    testing: bool = Field(default=False, description="If set to True, environment uses mock OpenAI data.")
    max_n_completions: int = Field(default=8, description="Split any n larger than this into several calls.")
    proxy_url: str | None = Field(default=None, description="URL of the ManagedServer OpenAI proxy.")


def as_server_configs(configs: Any, slurm: bool = False) -> list[APIServerConfig]:
    """atroposlib's accepted shapes -> a list of APIServerConfig (see the module docstring)."""
    if isinstance(configs, ServerBaseline) and not isinstance(configs, ServerConfig):
        urls = inference_urls() if os.environ.get("SLURM_JOB_NODELIST") else None
        urls = urls or [f"http://localhost:{9004 + i}/v1" for i in range(4)]
        return [APIServerConfig(**configs.model_dump(), base_url=url, api_key="x") for url in urls]
    listed = [configs] if isinstance(configs, ServerConfig) else list(configs)
    found = [c if isinstance(c, APIServerConfig) else APIServerConfig(**dict(c)) for c in listed]
    urls = inference_urls() if slurm else None
    return [found[0].model_copy(update={"base_url": url}) for url in urls] if urls else found


class ServerManager(Router):
    def __init__(
        self,
        configs: Any,
        server_class: Any = None,
        slurm: bool = False,
        testing: bool = False,
        max_n_completions: int = 8,
        reasoning_config: ReasoningConfig | None = None,
        proxy_url: str | None = None,
        use_proxy: bool = False,
        tool_parser: str | None = None,
        backends: list[Any] | None = None,
    ) -> None:
        server_configs = as_server_configs(configs, slurm=slurm)
        super().__init__(list(server_configs), backends, max_n_completions=max_n_completions)
        self.reasoning_config = reasoning_config
        self.tool_parser = tool_parser
        self.proxy_url = proxy_url or os.environ.get("ATROPOS_PROXY_URL")
        self.use_proxy = use_proxy or bool(self.proxy_url)
        # one wrapper per server; each sends through a one-server router sharing this router's backend
        self.servers: list[Any] = [
            self._wrap(config, Router([config], [server.backend]), server_class)
            for config, server in zip(server_configs, self._servers, strict=True)
        ]
        self._harness = ServerHarness() if testing else None
        if self._harness is not None:
            self.servers = [self._harness]

    async def _scripted(self, method: str, **kwargs: Any) -> Any:
        answer = await getattr(self._harness, method)(**kwargs)
        if answer is None:
            raise ConfigError(
                f"--testing: the ServerHarness has no {method} answer set for this request",
                hint="program it in test code (env.server.servers[0].set_desired_response(...)), or drop --testing "
                "and point --openai.base_url at a server (python -m atropos_cli.testing.fake_server)",
            )
        return answer

    async def chat_completion(self, *args: Any, **kwargs: Any) -> Any:
        if self._harness is not None:
            return await self._scripted("chat_completion", **kwargs)
        return await super().chat_completion(*args, **kwargs)

    async def completion(self, *args: Any, **kwargs: Any) -> Any:
        if self._harness is not None:
            return await self._scripted("completion", **kwargs)
        return await super().completion(*args, **kwargs)

    def _wrap(self, config: APIServerConfig, router: Router, server_class: Any) -> APIServer:
        cls = server_class if isinstance(server_class, type) and server_class is not APIServer else None
        cls = cls or SERVER_CLASSES.get(config.server_type, APIServer)
        return cls(config, self.reasoning_config, router=router)

    def _freest(self) -> APIServer:
        healthy = [s for s in self.servers if s.server_healthy] or self.servers
        return max(healthy, key=lambda s: s.sem._value)

    async def update_weight(self, weight: float) -> None:
        for server in self.servers:
            await server.update_weight(weight)

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> tuple[list, list, list, list]:
        """(prompt_tokens, output_tokens[], output_logprobs[], finish_reasons[]) from the freest server."""
        kwargs.pop("split", None)
        if self._harness is not None:
            return await self._scripted("tokens_and_logprobs_completion", **kwargs)  # type: ignore[no-any-return]
        return await self._freest().tokens_and_logprobs_completion(**kwargs)

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        kwargs.pop("split", None)
        return await self._freest().get_logprobs(**kwargs)

    @asynccontextmanager
    async def dedicated_server(self) -> AsyncIterator[APIServer]:
        server = self._freest()
        async with server.sem:
            yield server

    @asynccontextmanager
    async def managed_server(
        self, tokenizer: Any = None, base_url: str | None = None, preserve_think_blocks: bool = False
    ) -> AsyncIterator[Any]:
        """A ManagedServer over one server (the one at `base_url`, else the freest); state cleared on exit.
        With a proxy (`proxy_url=` / ATROPOS_PROXY_URL, or use_proxy), a session in the ManagedServer proxy."""
        if self.use_proxy:
            from atropos_cli.compat.atroposlib.envs.server_handling.proxy_client import create_proxy_session

            if not self.proxy_url:
                raise ConfigError("use_proxy needs a proxy URL", hint="pass proxy_url= or set ATROPOS_PROXY_URL")
            proxied = await create_proxy_session(
                self.proxy_url, base_url=base_url, tool_parser=self.tool_parser or "hermes", model_name=self.model_name
            )
            try:
                yield proxied
            finally:
                await proxied.cleanup()
            return
        pinned = [s for s in self.servers if base_url and s.config.base_url == base_url]
        server = pinned[0] if pinned else self._freest()
        if isinstance(server, OpenAIServer) and os.environ.get("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "").lower() in (
            "1",
            "true",
            "yes",
        ):
            managed: Any = DummyManagedServer(server=server, tokenizer=tokenizer)
        else:
            managed = ManagedServer(
                server=server,
                tokenizer=tokenizer or self.tokenizer,
                tool_parser=self.tool_parser,
                preserve_think_blocks=preserve_think_blocks,
            )
        try:
            yield managed
        finally:
            managed.reset()
