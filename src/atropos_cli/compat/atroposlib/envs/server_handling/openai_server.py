"""atroposlib.envs.server_handling.openai_server: `OpenAIServer` (chat/completions; no token ids) and
`resolve_openai_configs`, the rule that turns config_init's servers + YAML + `--openai.*` into server configs."""

from __future__ import annotations

from typing import Any

from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import (
    APIServer,
    APIServerConfig,
    ServerBaseline,
)
from atropos_cli.errors import ConfigError

__all__ = ["OpenAIServer", "resolve_openai_configs"]


class OpenAIServer(APIServer):
    """An OpenAI-compatible endpoint reached through the openai SDK (text in, text out)."""


def resolve_openai_configs(
    default_server_configs: Any,
    openai_config_dict: dict[str, Any],
    yaml_config: dict[str, Any],
    cli_passed_flags: dict[str, Any],
    logger: Any = None,
) -> Any:
    """Several servers (YAML list of >= 2, or a config_init list of >= 2) are used as given, and then any
    `--openai.*` flag is an error; otherwise one APIServerConfig is built from the merged dict (a list of one
    when config_init gave a list). A bare ServerBaseline with no overrides stays a baseline."""
    yaml_servers = (yaml_config or {}).get("openai")
    cli_openai = {k: v for k, v in cli_passed_flags.items() if k.startswith("openai.")}
    multi_yaml = isinstance(yaml_servers, list) and len(yaml_servers) >= 2
    multi_default = not multi_yaml and isinstance(default_server_configs, list) and len(default_server_configs) >= 2
    if (multi_yaml or multi_default) and cli_openai:
        raise ConfigError(
            "CLI overrides for OpenAI settings (--openai.*) are not supported when multiple servers are defined",
            hint="set each server's fields in the YAML 'openai:' list instead",
        )
    if multi_yaml:
        return [APIServerConfig(**entry) for entry in yaml_servers or []]
    if multi_default:
        return default_server_configs
    single = APIServerConfig(**openai_config_dict)
    if isinstance(default_server_configs, APIServerConfig):
        return single
    if isinstance(default_server_configs, ServerBaseline) and not cli_openai and not yaml_servers:
        return default_server_configs
    return [single]
