"""`atropos serve ENV`: run an env online against a trajectory API (`atropos api` or atroposlib's `run-api`)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import DottedCommand, cli_errors, console, err_console, fail

ENV_HELP = "Env: a bundled name (see `atropos envs`), an installed entry point, or a path file.py[:Class]."


def _overrides(base_url: str | None, model: str | None, group_size: int | None) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {"env": {}, "openai": {}}
    if base_url is not None:
        out["openai"]["base_url"] = base_url
    if model is not None:
        out["openai"]["model_name"] = model
    if group_size is not None:
        out["env"]["group_size"] = group_size
    return out


def serve_command(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help=ENV_HELP)],
    api_url: Annotated[str, typer.Option(help="Trajectory API URL (atropos api or Atropos run-api).")] = (
        "http://127.0.0.1:8000"
    ),
    api_key: Annotated[
        str | None, typer.Option(envvar="ATROPOS_API_KEY", help="Bearer token of the trajectory API.")
    ] = None,
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible server URL (= --openai.base_url).")] = None,
    model: Annotated[str | None, typer.Option(help="Model name (= --openai.model_name).")] = None,
    group_size: Annotated[int | None, typer.Option(help="Rollouts per group (= --env.group_size).")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML config (Atropos layout: env:, openai:).")
    ] = None,
    spill: Annotated[
        Path | None, typer.Option(help="Where unsent groups go at shutdown (default .atropos/serve-spill-<env>.jsonl).")
    ] = None,
    max_groups: Annotated[int | None, typer.Option(help="Stop after sending this many groups.")] = None,
) -> None:
    """Run ENV online: register with the API, collect groups with up to max_num_workers workers, post them.

    Atropos-style dotted flags work too (--env.max_batches_offpolicy 2, --openai.base_url URL, ...).
    Ctrl-C stops cleanly: finished groups are posted or written to the spill file, never lost.
    """
    from atropos_cli.env.loading import load_env
    from atropos_cli.runs.serve import ServeOptions, ServeStats, serve_env

    seen: list[ServeStats] = []

    def on_event(stats: ServeStats, message: str) -> None:
        seen[:] = [stats]
        err_console.print(
            f"[dim]serve[/] step {stats.step} | sent {stats.counts.groups} | in flight {stats.in_flight}"
            f"{' | paused (off-policy bound)' if stats.paused else ''} | {message}",
            soft_wrap=True,
        )

    with cli_errors():
        loaded = load_env(
            env, list(ctx.args), str(config) if config else None, _overrides(base_url, model, group_size), mode="serve"
        )
        options = ServeOptions(
            api_url=api_url, api_key=api_key, spill_path=str(spill) if spill else None, max_groups=max_groups
        )
        try:
            stats = asyncio.run(serve_env(loaded, options, on_event))
        except KeyboardInterrupt:
            if seen:
                _summary(seen[0], api_url, "interrupted: ")
            raise fail(
                "interrupted: finished groups were sent or spilled (see above)",
                hint="run the same command again to continue",
                code=130,
            ) from None
        _summary(stats, api_url)


def _summary(stats: Any, api_url: str, prefix: str = "") -> None:
    spilled = f", {stats.spilled} unsent groups written to {stats.spill_path}" if stats.spilled else ""
    console.print(
        f"{prefix}sent {stats.counts.summary()} to {api_url} as {stats.wandb_name} ({len(stats.evals)} evals{spilled})",
        soft_wrap=True,
    )


def register(app: typer.Typer) -> None:
    app.command(
        "serve",
        cls=DottedCommand,
    )(serve_command)
