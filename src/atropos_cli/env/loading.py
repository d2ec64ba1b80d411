"""From what the user typed to a ready env: resolve the env, layer its config, build the server router.

Used by every command that runs an env (`process`, `evaluate`, `serve`, `train`). With no inference server
configured (no `--openai.base_url`, no YAML `openai:`), the env runs on the local transformers backend with
the shipped model, so the whole loop works offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atropos_cli.config import EnvConfig, RunConfig, ServerConfig, load_yaml, parse_dotted_flags, resolve_config
from atropos_cli.env.base import BaseEnv
from atropos_cli.env.registry import resolve_env
from atropos_cli.resources import DEFAULT_MODEL

__all__ = ["LoadedEnv", "load_env", "resolve_run_config", "uses_default_local_model"]


@dataclass
class LoadedEnv:
    env: BaseEnv
    env_config: EnvConfig
    servers: list[ServerConfig]
    run_config: RunConfig

    @property
    def server(self) -> Any:
        return self.env.server


def _default_to_local(servers: list[ServerConfig]) -> list[ServerConfig]:
    """A server with no base_url cannot be reached over HTTP: run it in-process (shipped model by default)."""
    resolved = []
    for server in servers:
        if server.server_type != "local" and not server.base_url:
            model = DEFAULT_MODEL if server.model_name == "default" else server.model_name
            server = server.model_copy(update={"server_type": "local", "model_name": model})
        elif server.server_type == "local" and server.model_name == "default":
            server = server.model_copy(update={"model_name": DEFAULT_MODEL})
        resolved.append(server)
    return resolved


def uses_default_local_model(servers: list[ServerConfig]) -> bool:
    return any(s.server_type == "local" and s.model_name == DEFAULT_MODEL for s in servers)


def resolve_run_config(
    env_spec: str,
    dotted_args: list[str],
    config_path: str | None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> tuple[type[BaseEnv], RunConfig, EnvConfig]:
    """Resolve the env class and its layered config without building servers (cheap: no model loading)."""
    env_cls = resolve_env(env_spec)
    env_defaults, server_defaults = env_cls.config_init()
    yaml_data = load_yaml(config_path) if config_path else None
    cli = parse_dotted_flags(dotted_args)
    overrides = overrides or {}
    cli_env = {**overrides.get("env", {}), **cli["env"]}
    cli_openai = {**overrides.get("openai", {}), **cli["openai"]}
    env_config, servers = resolve_config(
        env_spec,
        env_cls.env_config_cls,
        env_defaults,
        list(server_defaults),
        yaml_data,
        cli_env,
        cli_openai,
    )
    servers = _default_to_local(servers)
    run_config = RunConfig(env_name=env_spec, env=env_config.model_dump(mode="json"), openai=servers)
    return env_cls, run_config, env_config


def load_env(
    env_spec: str,
    dotted_args: list[str],
    config_path: str | None,
    overrides: dict[str, dict[str, Any]] | None = None,
) -> LoadedEnv:
    """Resolve and instantiate: env class + layered config + ServerManager over the configured servers."""
    from atropos_cli.inference.router import ServerManager

    env_cls, run_config, env_config = resolve_run_config(env_spec, dotted_args, config_path, overrides)
    check = getattr(env_cls, "check_config", None)  # Atropos envs do not have it
    if check is not None:
        check(env_config)
    manager = ServerManager(run_config.openai)
    env = env_cls(env_config, manager)
    return LoadedEnv(env=env, env_config=env_config, servers=run_config.openai, run_config=run_config)
