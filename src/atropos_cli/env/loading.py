"""From what the user typed to a ready env: resolve the env, layer its config, build the server router.

Used by every command that runs an env (`process`, `evaluate`, `serve`, `train`). With no inference server
configured (no `--openai.base_url`, no YAML `openai:`), the env runs on the local transformers backend with
the shipped model, so the whole loop works offline.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from atropos_cli.config import (
    EnvConfig,
    RunConfig,
    ServerConfig,
    load_yaml,
    parse_dotted_flags,
    resolve_config,
    resolve_servers,
)
from atropos_cli.env.base import BaseEnv, env_error
from atropos_cli.env.registry import resolve_env
from atropos_cli.errors import AtroposError
from atropos_cli.resources import DEFAULT_MODEL

__all__ = ["LoadedEnv", "load_env", "build_env", "resolve_run_config", "uses_default_local_model", "default_to_local"]


@dataclass
class LoadedEnv:
    env: BaseEnv
    env_config: EnvConfig
    servers: list[ServerConfig]
    run_config: RunConfig

    @property
    def server(self) -> Any:
        return self.env.server


def default_to_local(servers: list[ServerConfig]) -> list[ServerConfig]:
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
    *,
    mode: str | None = None,
    env_cls: type[BaseEnv] | None = None,
) -> tuple[type[BaseEnv], RunConfig, EnvConfig]:
    """Resolve the env class and its layered config without building servers (cheap: no model loading).

    Layers, lowest first: config_init(), the run mode's defaults (`env_cls.mode_defaults(mode)`), YAML,
    `overrides` (plain CLI options), dotted flags. The env config is validated as the class config_init
    returned (a subclass of `env_config_cls`, as Atropos envs often return).
    """
    env_cls = env_cls or resolve_env(env_spec)
    try:
        env_defaults, server_defaults = env_cls.config_init()
    except AtroposError:
        raise
    except Exception as exc:
        raise env_error(env_cls, "config_init()", exc, "config_init() must return (env config, servers)") from None
    if mode:
        env_defaults = env_defaults.model_copy(update=env_cls.mode_defaults(mode))
    yaml_data = load_yaml(config_path) if config_path else None
    cli = parse_dotted_flags(dotted_args)
    overrides = overrides or {}
    cli_env = {**overrides.get("env", {}), **cli["env"]}
    cli_openai = {**overrides.get("openai", {}), **cli["openai"]}
    config_cls = type(env_defaults) if isinstance(env_defaults, env_cls.env_config_cls) else env_cls.env_config_cls
    env_config, servers = resolve_config(
        env_spec,
        config_cls,
        env_defaults,
        env_cls.server_defaults(server_defaults),
        yaml_data,
        cli_env,
        cli_openai,
    )
    servers = default_to_local(servers)
    teacher = _teacher_servers(env_cls, yaml_data, {**overrides.get("teacher", {}), **cli["teacher"]})
    env_json = env_config.model_dump(mode="json")
    run_config = RunConfig(env_name=env_spec, env=env_json, openai=servers, teacher=teacher)
    return env_cls, run_config, env_config


def _teacher_servers(env_cls: type[BaseEnv], yaml_data: Any, cli_teacher: dict[str, Any]) -> list[ServerConfig]:
    """The teacher's servers (distillation envs), layered like `openai`; none when nothing configures one."""
    defaults = env_cls.teacher_defaults()
    from_yaml = (yaml_data or {}).get("teacher")
    if not (defaults or from_yaml or cli_teacher):
        return []
    return resolve_servers(defaults, from_yaml, cli_teacher, "teacher")


def load_env(
    env_spec: str,
    dotted_args: list[str],
    config_path: str | None,
    overrides: dict[str, dict[str, Any]] | None = None,
    *,
    mode: str | None = None,
    env_cls: type[BaseEnv] | None = None,
) -> LoadedEnv:
    """Resolve and instantiate: env class + layered config + ServerManager over the configured servers."""
    env_cls, run_config, env_config = resolve_run_config(
        env_spec, dotted_args, config_path, overrides, mode=mode, env_cls=env_cls
    )
    env = build_env(env_cls, run_config, env_config)
    return LoadedEnv(env=env, env_config=env_config, servers=run_config.openai, run_config=run_config)


def build_env(env_cls: type[BaseEnv], run_config: RunConfig, env_config: EnvConfig) -> BaseEnv:
    """The env as its class builds itself (ours: over a router of the servers; an Atropos env: its own
    constructor, `(config, server_configs)`), after its cheap config checks; a constructor that raises is one
    error line naming the env's file:line."""
    check = getattr(env_cls, "check_config", None)  # envs that are not ours may lack it
    if check is not None:
        check(env_config)
    try:
        return env_cls.build(env_config, run_config.openai, run_config.teacher)
    except AtroposError:
        raise
    except Exception as exc:
        raise env_error(
            env_cls, "__init__", exc, "fix the env's constructor (it runs with the resolved config)"
        ) from None
