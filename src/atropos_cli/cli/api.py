"""`atropos api`: run the trajectory API (Atropos `run-api` compatible) with durability, limits and auth."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import cli_errors, console, fail
from atropos_cli.cli.options import AllowedHosts, ModelOptions, with_options
from atropos_cli.httpserve import LIMIT_FLAGS, HttpLimits


def _status_line(service: object) -> None:
    from atropos_cli.api.service import ApiService

    assert isinstance(service, ApiService)
    groups_in, seqs_out = service.metrics.rates()
    rejected = sum(service.metrics.rejected.values())
    trainer = "trainer registered" if service.registration else "waiting for trainer"
    console.print(
        f"[dim]api[/] step {service.step} | queue {len(service.queue.queue)} groups "
        f"(+{service.queue.buffered_count()} buffered, {len(service.pending)} batches formed) | "
        f"in {groups_in:.1f} groups/s | out {seqs_out:.1f} seq/s | rejected {rejected} | "
        f"{len(service.env_info)} envs | {trainer}",
        soft_wrap=True,
    )


@with_options(ModelOptions(HttpLimits, flags=LIMIT_FLAGS, panel="Connection limits"))
def api_command(
    host: Annotated[str, typer.Option(help="Interface to bind; 0.0.0.0 exposes the API to the network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="TCP port.")] = 8000,
    state_dir: Annotated[
        str | None, typer.Option(help="Directory for the durable queue (SQLite, WAL). Unset: in-memory, lost at exit.")
    ] = None,
    max_queue_groups: Annotated[int, typer.Option(help="Queue limit; past it POSTs get 503 + Retry-After.")] = 10_000,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body, after gzip inflation (MiB).")] = 64.0,
    api_key: Annotated[
        str | None, typer.Option(envvar="ATROPOS_API_KEY", help="Require 'Authorization: Bearer KEY' on every call.")
    ] = None,
    disable_reset: Annotated[
        bool, typer.Option(help="Answer /reset_data with 403 instead of wiping the state.")
    ] = False,
    fsync: Annotated[bool, typer.Option(help="fsync every commit (survives power loss, not only kill -9).")] = False,
    mix: Annotated[str, typer.Option(help="Batch composition: fifo (Atropos) or weighted (by env weight).")] = "fifo",
    max_staleness: Annotated[
        int | None,
        typer.Option(
            min=0,
            help="Bound on a group's staleness (trainer step - the meta.policy_version its producer posted): "
            "producers that follow /status pause (hold) or stale groups are dropped and counted (--stale-mode drop).",
        ),
    ] = None,
    stale_mode: Annotated[str, typer.Option(help="With --max-staleness: hold (pace producers) or drop.")] = "hold",
    status_every: Annotated[float, typer.Option(help="Seconds between status lines (0: none).")] = 10.0,
    allowed_host: AllowedHosts = None,
    **limits: Any,
) -> None:
    """Serve the trajectory queue: envs POST scored groups, trainers GET exact-size batches (Atropos wire)."""
    if mix not in ("fifo", "weighted"):
        raise fail(f"unknown --mix {mix!r}", hint="use fifo or weighted")
    if stale_mode not in ("hold", "drop"):
        raise fail(f"unknown --stale-mode {stale_mode!r}", hint="use hold or drop")
    with cli_errors():
        from atropos_cli.api.app import create_app
        from atropos_cli.api.service import ApiSettings
        from atropos_cli.httpserve import listen, serve

        listener = listen(host, port)  # a taken port fails before the state is opened or anything is printed
        port = listener.getsockname()[1]
        settings = ApiSettings(
            state_dir=state_dir,
            max_queue_groups=max_queue_groups,
            max_body_mb=max_body_mb,
            api_key=api_key or None,
            disable_reset=disable_reset,
            fsync=fsync,
            mix=mix,  # type: ignore[arg-type]
            host=host,
            allowed_hosts=allowed_host or [],
            max_staleness=max_staleness,
            stale_mode=stale_mode,  # type: ignore[arg-type]
        )
        app = create_app(settings, on_tick=_status_line if status_every > 0 else None, tick_s=status_every or 1.0)
        service = app.state.service
        where = (
            f"durable state in {service.store.path}"
            if state_dir
            else "IN-MEMORY mode (no --state-dir): the queue is lost at exit"
        )
        console.print(
            f"atropos api on http://{host}:{port} | {where} | {len(service.queue.queue)} groups queued, "
            f"step {service.step}, {len(service.pending)} formed batches restored",
            soft_wrap=True,
        )
        for note in service.restore_notes:
            console.print(f"[yellow]warning:[/] {note}", soft_wrap=True)
        if api_key:
            console.print("auth: bearer token required on every endpoint")
        elif host not in ("127.0.0.1", "localhost", "::1"):
            console.print(f"[yellow]warning:[/] bound to {host} without --api-key: anyone who can reach it can post")
        serve(app, listener, HttpLimits(**limits), log_level=os.environ.get("ATROPOS_API_LOG", "warning"))


def register(app: typer.Typer) -> None:
    app.command("api")(api_command)
