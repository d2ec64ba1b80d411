"""`atropos export openenv|ors ENV`: serve any env we run to other frameworks' trainers (an OpenEnv env server,
an Open Reward Standard server)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import DottedCommand, cli_errors, console, warn
from atropos_cli.cli.options import ModelOptions, with_options
from atropos_cli.errors import AtroposError
from atropos_cli.httpguard import HostPolicy, is_loopback_name
from atropos_cli.httpserve import LIMIT_FLAGS, HttpLimits, SessionLimits, WsLimits
from atropos_cli.runs.ors_tasks import OrsTasks

EXPORT_HELP = (
    "Serve ENV to other frameworks: `atropos export openenv ENV` (an OpenEnv-compatible env server), "
    "`atropos export ors ENV` (an Open Reward Standard server)."
)
ENV_HELP = "Env: a bundled name (see `atropos envs`), an installed entry point, or a path file.py[:Class]."
HOST_HELP = "Interface to bind; 0.0.0.0 exposes the env to the network."
CONFIG_HELP = "YAML config (Atropos layout: env:)."

export_app = typer.Typer(help=EXPORT_HELP, no_args_is_help=True, add_completion=False)

# The app factory of a standard: (exported env, on_ready, api_key, on_error, host policy, limits) -> ASGI app.
AppFactory = Callable[[Any, Callable[[], None], str | None, Callable[[AtroposError], None], HostPolicy, Any], Any]


def _serve(
    env: str, dotted: list[str], config: Path | None, host: str, port: int, api_key: str | None, standard: str,
    make_app: AppFactory, limits: Any, http: HttpLimits, ws: WsLimits | None = None,
) -> None:  # fmt: skip
    """Build ENV over the client bridge and serve it until Ctrl-C (a failed env setup: one error line)."""
    from atropos_cli.runs.openenv_export import build_exported_env

    exported = build_exported_env(env, dotted, str(config) if config else None)
    if not is_loopback_name(host) and not api_key:
        warn(f"binding {host} without --api-key: anyone who can reach this port can play the env")
    import uvicorn

    from atropos_cli.httpserve import listen, uvicorn_config

    listener = listen(host, port)
    url = f"http://{host}:{listener.getsockname()[1]}"

    def ready() -> None:
        console.print(f"serving {exported.env.name} as {standard} on {url} (Ctrl-C stops)", soft_wrap=True)

    failed: list[AtroposError] = []

    def setup_failed(exc: AtroposError) -> None:  # the env's setup() raised: stop, then say it in one line
        failed.append(exc)
        server.should_exit = True

    app = make_app(exported, ready, api_key, setup_failed, HostPolicy(host), limits)
    server = uvicorn.Server(uvicorn_config(app, http, ws=ws, log_level="warning", timeout_graceful_shutdown=2))
    server.run(sockets=[listener])
    if failed:
        raise failed[0]


def _limits(model: type[Any], limits: dict[str, Any]) -> Any:
    return model(**{k: v for k, v in limits.items() if k in model.model_fields})


@export_app.command("openenv", cls=DottedCommand)
@with_options(
    ModelOptions(HttpLimits, flags=LIMIT_FLAGS, panel="Connection limits"),
    ModelOptions(WsLimits, flags=LIMIT_FLAGS, panel="WebSocket limits"),
)
def openenv_command(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help=ENV_HELP)],
    host: Annotated[str, typer.Option(help=HOST_HELP)] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    config: Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)] = None,
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

    with cli_errors():
        ws = _limits(WsLimits, limits)
        _serve(
            env, list(ctx.args), config, host, port, api_key, "an OpenEnv env", create_openenv_app, ws,
            _limits(HttpLimits, limits), ws,
        )  # fmt: skip


@export_app.command("ors", cls=DottedCommand)
@with_options(
    ModelOptions(HttpLimits, flags=LIMIT_FLAGS, panel="Connection limits"),
    ModelOptions(SessionLimits, flags=LIMIT_FLAGS, panel="Session limits"),
    ModelOptions(OrsTasks),
)
def ors_command(
    ctx: typer.Context,
    env: Annotated[str, typer.Argument(help=ENV_HELP)],
    host: Annotated[str, typer.Option(help=HOST_HELP)] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8080,
    config: Annotated[Path | None, typer.Option("--config", help=CONFIG_HELP)] = None,
    api_key: Annotated[
        str | None,
        typer.Option(
            envvar="ATROPOS_ORS_API_KEY",
            help="Require 'X-API-Key: KEY' (what ORS clients send: OPENREWARD_API_KEY) on every request.",
        ),
    ] = None,
    **limits: Any,
) -> None:
    """Serve ENV as an Open Reward Standard (ORS) env server: tasks, a session per rollout, rewards on tool calls.

    Splits train (the env's train stream, its first --train-tasks items) and eval (its eval split); a session
    on task k plays item k: the env's model request is the task's prompt (/messages, /prompt), the model's
    plain message goes to the env's terminal tool `reply`, which answers with the env's next request (a
    multi-turn env) or, once the env scored the rollout, with reward = its score and finished. Connect with the
    openreward SDK (AsyncOpenReward().environments.get(NAME, base_url=URL)) or `atropos process ors:URL`.
    Env options as dotted flags (--env.max_token_length 64, ...); the env runs with group_size 1.
    """
    from functools import partial

    from atropos_cli.runs.ors_app import create_ors_app

    with cli_errors():
        _serve(
            env, list(ctx.args), config, host, port, api_key, "an ORS env",
            partial(create_ors_app, tasks=_limits(OrsTasks, limits)), _limits(SessionLimits, limits),
            _limits(HttpLimits, limits),
        )  # fmt: skip


def register(app: typer.Typer) -> None:
    app.add_typer(export_app, name="export")
