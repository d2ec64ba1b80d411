"""Layered configuration, implemented once: model defaults < YAML file (`--config`) < CLI flags.

Atropos' layout is kept: a YAML file has top-level `env:` (a dict of env fields) and `openai:` (one server
dict, or a list of them for several servers); CLI flags are dotted, `--env.group_size 8`,
`--openai.base_url URL`. Unknown keys are errors with a did-you-mean hint, never silently ignored.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, cast, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atropos_cli.errors import ConfigError

__all__ = [
    "EnvConfig",
    "ServerConfig",
    "SERVER_TYPES",
    "RunConfig",
    "parse_dotted_flags",
    "load_yaml",
    "resolve_config",
    "config_diff",
    "validate_model",
    "resolve_servers",
    "validate_keys",
    "read_saved",
]

NAMESPACES = ("env", "openai", "teacher")  # teacher: the distillation teacher's server (TeacherDistillationEnv)
SERVER_TYPES = ("openai", "vllm", "sglang", "trl", "local")


class ServerConfig(BaseModel):
    """One inference server: Atropos' `APIServerConfig` fields (same names, so `--openai.*` flags port over)."""

    model_config = ConfigDict(extra="forbid")

    model_name: str = "default"
    base_url: str = ""
    api_key: str = ""
    server_type: Literal["openai", "vllm", "sglang", "trl", "local"] = "openai"
    tokenizer_name: str = "none"
    timeout: float = Field(1200.0, gt=0)
    num_max_requests_at_once: int = Field(512, ge=1)
    num_requests_for_eval: int = Field(64, ge=1)
    rolling_buffer_length: int = 1000
    n_kwarg_is_ignored: bool = False
    health_check: bool = True
    max_retries: int = Field(3, ge=0)
    weight: float = 1.0
    # local backend only
    device: str = "auto"
    dtype: str = "auto"


QUICK_GROUPS = 64  # groups a `process` run of the offline example env, or of an adapter's env, collects by default


class EnvConfig(BaseModel):
    """Atropos' `BaseEnvConfig` fields with the same names and meanings, plus a few of ours."""

    model_config = ConfigDict(extra="forbid")

    group_size: int = Field(4, ge=1)
    max_num_workers: int = -1
    max_eval_workers: int = 16
    max_num_workers_per_node: int = 8
    steps_per_eval: int = 100
    max_token_length: int = Field(2048, ge=1)
    eval_handling: Literal["STOP_TRAIN", "LIMIT_TRAIN", "NONE"] = "STOP_TRAIN"
    eval_limit_ratio: float = 0.5
    inference_weight: float = 1.0
    batch_size: int = -1
    max_batches_offpolicy: int = 3
    tokenizer_name: str | None = None
    use_wandb: bool = False
    rollout_server_url: str = "http://localhost:8000"
    total_steps: int = Field(1000, ge=1)
    wandb_name: str | None = None
    num_rollouts_to_keep: int = 32
    num_rollouts_per_group_for_logging: int = 1
    ensure_scores_are_not_same: bool = False
    data_path_to_save_groups: str | None = None
    data_dir_to_save_evals: str | None = None
    min_items_sent_before_logging: int = 2
    include_messages: bool = True
    min_batch_allocation: float | None = None
    worker_timeout: float = 600
    thinking_mode: bool = False
    reasoning_effort: str | None = None
    max_reasoning_tokens: int | None = None
    custom_thinking_prompt: str | None = None
    # ours
    seed: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    data_path: str | None = None


class RunConfig(BaseModel):
    """The resolved config of a run: what is saved as config.yaml beside the outputs."""

    model_config = ConfigDict(extra="forbid")

    env_name: str
    env: dict[str, Any]
    openai: list[ServerConfig]
    teacher: list[ServerConfig] = Field(default_factory=list)

    def to_yaml(self) -> str:
        data = self.model_dump(mode="json")
        return yaml.safe_dump(data, sort_keys=False)


def _coerce_scalar(raw: str) -> Any:
    """CLI values arrive as strings; YAML's scalar rules turn them into bool/int/float/None/list."""
    if raw == "None":
        return None
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def parse_dotted_flags(args: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Parse `--env.k v`, `--env.k=v` and bare `--env.flag` (True) into {"env": {...}, "openai": {...}}."""
    parsed: dict[str, dict[str, Any]] = {ns: {} for ns in NAMESPACES}
    i = 0
    while i < len(args):
        token = args[i]
        if not token.startswith("--"):
            raise ConfigError(f"unexpected argument {token!r}", hint="dotted flags look like --env.group_size 8")
        key, sep, value = token[2:].partition("=")
        if not sep:
            if i + 1 < len(args) and not args[i + 1].startswith("--"):
                value = args[i + 1]
                i += 1
            else:
                value = "true"
        i += 1
        namespace, dot, field = key.partition(".")
        if not dot or namespace not in NAMESPACES or not field:
            raise ConfigError(
                f"unknown option '--{key}'",
                hint="dotted options start with --env., --openai. or --teacher. (for example --env.group_size 8)",
            )
        parsed[namespace][field.replace("-", "_")] = _coerce_scalar(value)
    return parsed


def read_saved(path: Path, hint: str) -> Any:
    """A JSON or YAML file a run wrote earlier (config.yaml, config.json, trainer_state.json): one that is not
    UTF-8 or does not parse is a ConfigError naming it, never a traceback. Read as bytes, so an encoding error
    is the parser's, not Python's."""
    data = path.read_bytes()
    try:
        if path.suffix == ".json":
            return json.loads(data)
        return yaml.safe_load(data)
    except (ValueError, yaml.YAMLError) as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        detail = " ".join(str(exc).split())[:200]
        raise ConfigError(f"{path.name} of the run is not readable ({detail})", hint=hint, file=str(path)) from None


def load_yaml(path: str | Path) -> dict[str, Any]:
    """Read an Atropos-layout YAML config (plus `train:`, read by `atropos train`); other top-level keys are errors."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {str(path)!r} does not exist", hint="pass --config PATH to a YAML file")
    try:
        data = yaml.safe_load(path.read_bytes()) or {}  # bytes: a non-UTF-8 file is a YAMLError, not a traceback
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ConfigError(
            f"not valid YAML ({getattr(exc, 'problem', exc)})",
            hint="fix the YAML at that line (indentation, a missing ':' or quote)",
            file=str(path),
            line=mark.line + 1 if mark else None,
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: expected a mapping with 'env:' and 'openai:' keys, got {type(data).__name__}",
            hint="see examples/ for a config in Atropos' layout",
        )
    allowed = (*NAMESPACES, "train", "slurm", "testing", "env_name")
    for key in data:
        if key not in allowed:
            raise ConfigError(f"{path}: unknown top-level key {key!r}", hint=_did_you_mean(key, allowed))
    return data


def _did_you_mean(key: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(key, list(choices), n=1)
    if close:
        return f"did you mean {close[0]!r}?"
    return "allowed: " + ", ".join(sorted(choices))


def validate_keys(values: Mapping[str, Any], known: Iterable[str], where: str) -> None:
    """Unknown keys are errors with a did-you-mean hint, never silently ignored."""
    known = sorted(known)
    for key in values:
        if key not in known:
            raise ConfigError(f"unknown {where} option {key!r}", hint=_did_you_mean(key, known))


def _accepts_bool(annotation: Any) -> bool:
    return annotation is bool or annotation is Any or bool in get_args(annotation)


def _check_no_bare_flags(model_cls: type[BaseModel], values: Mapping[str, Any], where: str) -> None:
    """A bare `--env.group_size` (value forgotten) parses as True; only a boolean field may take that."""
    for key, value in values.items():
        if isinstance(value, bool) and not _accepts_bool(model_cls.model_fields[key].annotation):
            raise ConfigError(
                f"{where}.{key} needs a value, got {str(value).lower()!r}",
                hint=f"write --{where}.{key} VALUE (a bare dotted flag means true, for yes/no options only)"
                if where in NAMESPACES
                else f"give {key} a {model_cls.model_fields[key].annotation} value",
            )


def validate_model(model_cls: type[BaseModel], values: Mapping[str, Any], where: str) -> Any:
    """Build `model_cls` from `values`, turning unknown keys and bad values into one-line ConfigErrors."""
    validate_keys(values, model_cls.model_fields, where)
    _check_no_bare_flags(model_cls, values, where)
    try:
        return model_cls.model_validate(dict(values))
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigError(
            f"bad value for {where}.{loc}: {err.get('input')!r} ({err['msg']})",
            hint=f"see the defaults with `atropos {'train' if where == 'train' else 'process'} --help`; "
            f"{where}.{loc} is {err['type']}",
        ) from None


def _servers_from(raw: Any, where: str, namespace: str = "openai") -> list[dict[str, Any]]:
    if raw is None:
        return []
    if isinstance(raw, dict):
        return [raw]
    if isinstance(raw, list) and all(isinstance(s, dict) for s in raw):
        return list(raw)
    raise ConfigError(
        f"{where}: {namespace!r} must be a mapping or a list of mappings, got {type(raw).__name__}",
        hint=f"write {namespace}: {{base_url: ..., model_name: ...}} or a list of such mappings",
    )


def resolve_servers(
    defaults: list[ServerConfig], yaml_raw: Any, cli: Mapping[str, Any], namespace: str = "openai"
) -> list[ServerConfig]:
    """One list of servers, layered: the env's defaults (or one default server) < YAML `namespace:` (a mapping or
    a list: as many entries as defaults merge pairwise, otherwise each entry onto the first default) < the
    `--namespace.*` flags, which apply to every server."""
    yaml_servers = _servers_from(yaml_raw, "config", namespace)
    base = [s.model_dump() for s in defaults] or [ServerConfig().model_dump()]
    if yaml_servers:
        merged = (
            [{**base[0], **s} for s in yaml_servers]
            if len(yaml_servers) != len(base)
            else [{**b, **s} for b, s in zip(base, yaml_servers, strict=True)]
        )
    else:
        merged = base
    return [cast(ServerConfig, validate_model(ServerConfig, {**m, **cli}, namespace)) for m in merged]


def resolve_config(
    env_name: str,
    env_cls: type[EnvConfig],
    env_defaults: EnvConfig,
    server_defaults: list[ServerConfig],
    yaml_data: Mapping[str, Any] | None,
    cli_env: Mapping[str, Any],
    cli_openai: Mapping[str, Any],
) -> tuple[EnvConfig, list[ServerConfig]]:
    """Merge the three layers. With several servers in YAML, `--openai.*` flags apply to every server."""
    yaml_data = yaml_data or {}
    env_values = env_defaults.model_dump()
    yaml_env = yaml_data.get("env") or {}
    if not isinstance(yaml_env, dict):
        raise ConfigError("config 'env' must be a mapping of env options", hint="write env: {group_size: 8, ...}")
    env_values.update(yaml_env)
    env_values.update(cli_env)
    env_config = validate_model(env_cls, env_values, "env")

    return env_config, resolve_servers(server_defaults, yaml_data.get("openai"), cli_openai)


def config_diff(old: Mapping[str, Any], new: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two resolved configs (used by --resume)."""
    keys: list[str] = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        dotted = f"{prefix}{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping):
            keys.extend(config_diff(a, b, dotted + "."))
        elif json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            keys.append(dotted)
    return keys
