"""`atropos export openenv ENV`: serve any env we run as an OpenEnv env server (OpenEnv trainers train on it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import DottedCommand, cli_errors, console, warn
from atropos_cli.cli.options import ModelOptions, with_options
from atropos_cli.errors import AtroposError
from atropos_cli.httpguard import HostPolicy, is_loopback_name
from atropos_cli.httpserve import LIMIT_FLAGS, HttpLimits, WsLimits

EXPORT_HELP = "Serve ENV to other frameworks: `atropos export openenv ENV` (an OpenEnv-compatible env server)."
ENV_HELP = "Env: a bundled name (see `atropos envs`), an installed entry point, or a path file.py[:Class]."

export_app = typer.Typer(help=EXPORT_HELP, no_args_is_help=True, add_completion=False)


@export_app.command("openenv", cls=DottedCommand)
@with_options(
    ModelOptions(HttpLimits, flags=LIMIT_FLAGS, panel="Connection limits"),
    ModelOptions(WsLimits, flags=LIMIT_FLAGS, panel="WebSocket limits"),
)
def openenv_command(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help=ENV_HELP)],
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes the env to the network.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    config: Annotated[Path | None, typer.Option("--config", help="YAML config (Atropos layout: env:).")] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="ATROPOS_OPENENV_API_KEY",
            help="Require 'Authorization: Bearer KEY' on every request and WebSocket (openenv clients: headers=).",
        ),
    ] = None,
    **limits: Any,
) -> None:
    """Serve ENV as an OpenEnv env server: reset -> the next item's prompt, step(message) -> reward and done.

    reset(seed=k) replays item k of the env's train stream (reset(split="eval", seed=k): its eval split); each
    model request the env makes is an observation (messages, prompt), the client's step(message=TEXT) is the
    reply, and the rollout's score is the reward of the step that ends it (multi-turn envs go on until then).
    Connect with openenv's clients (GenericEnvClient(base_url=URL)) or `atropos process openenv:URL`.
    Env options as dotted flags (--env.max_token_length 64, ...); the env runs with group_size 1.
    """
    from atropos_cli.runs.openenv_app import create_openenv_app
    from atropos_cli.runs.openenv_export import build_exported_env

    with cli_errors():
        exported = build_exported_env(env, list(ctx.args), str(config) if config else None)
        if not is_loopback_name(host) and not api_key:
            warn(f"binding {host} without --api-key: anyone who can reach this port can play the env")
        from atropos_cli.httpserve import listen, uvicorn_config

        listener = listen(host, port)
        url = f"http://{host}:{listener.getsockname()[1]}"

        def ready() -> None:
            console.print(f"serving {exported.env.name} as an OpenEnv env on {url} (Ctrl-C stops)", soft_wrap=True)

        import uvicorn

        failed: list[AtroposError] = []

        def setup_failed(exc: AtroposError) -> None:  # the env's setup() raised: stop, then say it in one line
            failed.append(exc)
            server.should_exit = True

        http = HttpLimits(**{k: v for k, v in limits.items() if k in HttpLimits.model_fields})
        ws = WsLimits(**{k: v for k, v in limits.items() if k in WsLimits.model_fields})
        app = create_openenv_app(exported, ready, api_key, setup_failed, HostPolicy(host), ws)
        server_config = uvicorn_config(app, http, ws=ws, log_level="warning", timeout_graceful_shutdown=2)
        server = uvicorn.Server(server_config)
        server.run(sockets=[listener])
        if failed:
            raise failed[0]


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
