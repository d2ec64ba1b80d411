"""`Env.cli()`: atroposlib's `python env.py serve|process|evaluate`, run by our runners.

Flags as atroposlib reads them: `--env.<field> V`, `--openai.<field> V`, `--slurm V`, `--testing V`,
`--config FILE.yaml` (keys `env:`, `openai:`), `--k=v` or `--k v`; precedence CLI > YAML > config_init.
- `process`: atroposlib's process defaults (keep equal scores, include messages) and output path
  `data/<name or groups>.jsonl`, never overwritten (`_1`, `_2` ... suffixes); writes the jsonl, the HTML
  viewer beside it (`<stem>.html`) and our parquet/config/failures siblings. Groups run one at a time.
- `evaluate`: `setup()` then `evaluate()`; `evaluate_config.yaml` in `data_dir_to_save_evals`.
- `serve`: our online loop against `--env.rollout_server_url`.
- `--slurm V` / `--testing V` (or YAML top-level `slurm:` / `testing:`; default false, as atroposlib's CLI
  passes them) go to the env's constructor: `--slurm true` spreads the first server over the Slurm job's
  inference nodes, `--testing true` answers from a ServerHarness (see server_manager). `--proxy_url URL`
  routes `managed_server()` through the ManagedServer proxy (as ATROPOS_PROXY_URL does).
This is a script entry point: a usage error or an AtroposError ends the process with a one-line message
(SystemExit), never a traceback.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from atropos_cli.compat.atroposlib.envs._manager_flags import manager_flags, reset_manager_flags
from atropos_cli.compat.atroposlib.utils.cli import get_double_dash_flags
from atropos_cli.errors import AtroposError

__all__ = ["run_cli", "free_groups_path"]

MODES = ("serve", "process", "evaluate")
NAMESPACES = ("env.", "openai.", "teacher.")
MANAGER_FLAGS = ("slurm", "testing", "max_n_completions", "proxy_url", "config")


def _usage(cls: type[Any]) -> str:
    config, _ = cls.config_init()
    env_flags = " ".join(f"--env.{name}" for name in type(config).model_fields)
    return (
        f"usage: python {Path(sys.argv[0]).name} {{{','.join(MODES)}}} [--config FILE] [--slurm V] [--testing V] "
        f"[--env.FIELD V ...] [--openai.FIELD V ...]\nenv fields: {env_flags}"
    )


def free_groups_path(path: Path) -> Path:
    """`path`, or `stem_1`, `stem_2`, ... when a run already wrote there (atroposlib never overwrites)."""
    from atropos_cli.runs.process import RunPaths

    candidate, n = path, 1
    while any(p.exists() for p in RunPaths.for_jsonl(candidate).outputs()):
        candidate, n = path.with_stem(f"{path.stem}_{n}"), n + 1
    return candidate


def _parse(cls: type[Any], argv: list[str]) -> tuple[str, list[str], str | None, dict[str, Any]]:
    if not argv or argv[0] not in MODES:
        raise SystemExit(_usage(cls))
    flags = get_double_dash_flags(argv[1:])
    if "help" in flags:
        sys.stdout.write(_usage(cls) + "\n")
        raise SystemExit(0)
    unknown = [k for k in flags if not k.startswith(NAMESPACES) and k not in MANAGER_FLAGS]
    if unknown:
        raise SystemExit(f"error: unknown flag --{unknown[0]}\n{_usage(cls)}")
    dotted = [part for k, v in flags.items() if k.startswith(NAMESPACES) for part in (f"--{k}", str(v))]
    manager: dict[str, Any] = {k: flags[k] for k in ("slurm", "testing") if k in flags}
    if flags.get("proxy_url"):  # the ManagedServer proxy: ServerManager reads it from the environment
        os.environ["ATROPOS_PROXY_URL"] = str(flags["proxy_url"])
    return argv[0], dotted, flags.get("config"), manager


def _flag(value: Any, name: str) -> bool:
    text = str(value).strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no", "none"):
        return False
    raise SystemExit(f"error: --{name} takes true or false, not {value!r}")


def _manager_flags(manager: dict[str, Any], config: str | None) -> dict[str, bool]:
    """--slurm / --testing over the YAML file's top-level keys (CLI > YAML > false)."""
    from_yaml: dict[str, Any] = {}
    if config:
        import yaml

        try:
            loaded = yaml.safe_load(Path(config).read_text()) or {}
        except (OSError, yaml.YAMLError):
            loaded = {}  # the config loader reports a bad file with its own error
        from_yaml = {k: loaded[k] for k in ("slurm", "testing") if isinstance(loaded, dict) and k in loaded}
    merged = {**from_yaml, **manager}
    return {name: _flag(merged.get(name, False), name) for name in ("slurm", "testing")}


def _load(cls: type[Any], mode: str, dotted: list[str], config: str | None) -> Any:
    from atropos_cli.env.loading import load_env

    script = getattr(sys.modules.get(cls.__module__), "__file__", None) or cls.__name__
    overrides: dict[str, dict[str, Any]] = {"env": {}, "openai": {}}
    if cls.name is not None and "--env.wandb_name" not in dotted:
        overrides["env"]["wandb_name"] = cls.name
    return load_env(str(script), dotted, config, overrides, mode=mode, env_cls=cls)


async def _process(cls: type[Any], loaded: Any) -> Any:
    from atropos_cli.runs.process import RunPaths, prepare_output, run_process

    config = loaded.env_config
    path = free_groups_path(Path(config.data_path_to_save_groups or f"data/{cls.name or 'groups'}.jsonl"))
    config.data_path_to_save_groups = str(path)
    paths = RunPaths.for_jsonl(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    prepare_output(paths, loaded.run_config, resume=False, overwrite=False)
    loaded.env.process_mode = True
    return await run_process(loaded, paths, num_groups=config.total_steps, concurrency=1, skip=set())


async def _evaluate(loaded: Any) -> Any:
    folder = loaded.env_config.data_dir_to_save_evals
    try:
        if folder:
            Path(folder).mkdir(parents=True, exist_ok=True)
            (Path(folder) / "evaluate_config.yaml").write_text(loaded.run_config.to_yaml())
        return await loaded.env._run_evaluate()
    finally:
        await loaded.server.aclose()


async def _serve(loaded: Any) -> Any:
    from atropos_cli.runs.serve import ServeOptions, api_key_from_env, serve_env

    options = ServeOptions(api_url=loaded.env_config.rollout_server_url, api_key=api_key_from_env())
    return await serve_env(loaded, options)


def run_cli(cls: type[Any], argv: list[str] | None = None) -> None:
    mode, dotted, config, manager = _parse(cls, sys.argv[1:] if argv is None else argv)
    token = manager_flags(**_manager_flags(manager, config))
    try:
        loaded = _load(cls, mode, dotted, config)
        runner = (
            _process(cls, loaded) if mode == "process" else _evaluate(loaded) if mode == "evaluate" else _serve(loaded)
        )
        result = asyncio.run(runner)
    except AtroposError as exc:
        raise SystemExit(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else "")) from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    finally:
        reset_manager_flags(token)
    _report(mode, loaded, result)


def _report(mode: str, loaded: Any, result: Any) -> None:
    """The outcome, as `atropos process|serve` prints it: the summary line, the note when the env filtered
    every group, and an error exit when every group errored."""
    if mode == "process":
        from atropos_cli.runs.process import RunPaths, process_report

        report = process_report(result, RunPaths.for_jsonl(Path(loaded.env_config.data_path_to_save_groups)))
        print(report.summary, flush=True)
        if report.note:
            print(f"note: {report.note}", file=sys.stderr, flush=True)
        if result.interrupted:
            raise SystemExit("interrupted: finished groups are saved")
        if report.error:
            raise SystemExit(f"error: {report.error}\nhint: check the server and the env")
    elif mode == "serve":
        counts = result.counts
        print(f"sent {counts.summary()} to {loaded.env_config.rollout_server_url}", flush=True)
        if counts.groups == 0 and counts.failed_groups and not counts.filtered_groups:
            raise SystemExit("error: every group failed\nhint: check the server and the env")
