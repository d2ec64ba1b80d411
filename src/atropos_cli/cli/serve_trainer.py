"""`atropos serve-trainer`: a self-hosted Tinker-compatible training service (the tinker SDK and tinker-cookbook
recipes run against it unchanged; docs/tinker.md)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import cli_errors, console, fail
from atropos_cli.cli.options import AllowedHosts, ModelOptions, with_options
from atropos_cli.errors import EXIT_USAGE
from atropos_cli.httpserve import LIMIT_FLAGS, HttpLimits

LOOPBACK = ("127.0.0.1", "localhost", "::1")
IDLE_TIMEOUT_S = 7 * 24 * 3600.0  # how long the replicas of --nproc-per-node wait for rank 0's next call


@with_options(ModelOptions(HttpLimits, flags=LIMIT_FLAGS, panel="Connection limits"))
def serve_trainer_command(
    model: Annotated[str, typer.Option(help="Base model: a shipped model's name or a model directory.")] = (
        "atropos-tiny-arith"
    ),
    host: Annotated[str, typer.Option(help="Interface to bind; beyond loopback an --api-key is required.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="TCP port (0: any free port, printed).")] = 8000,
    state_dir: Annotated[
        str, typer.Option(help="Where checkpoints live; a restart with the same directory serves their paths.")
    ] = "atropos-tinker-state",
    device: Annotated[str, typer.Option(help="cpu, cuda, cuda:N or auto.")] = "auto",
    max_slots: Annotated[
        int, typer.Option(min=1, help="Training clients held at once (LoRA slots and full copies).")
    ] = 8,
    max_body_mb: Annotated[float, typer.Option(help="Largest request body (MiB).")] = 256.0,
    nproc_per_node: Annotated[
        int,
        typer.Option(
            min=1,
            help="Data-parallel replicas (one process each, a GPU each on CUDA): forward_backward's datums are "
            "split between them and gradients summed before each optim_step.",
        ),
    ] = 1,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="ATROPOS_TINKER_API_KEY", help="Require this key (X-API-Key, 'tml-...': TINKER_API_KEY)."),
    ] = None,
    allowed_host: AllowedHosts = None,
    **limits: Any,
) -> None:
    """Serve the Tinker training API (the tinker SDK's service, training and sampling clients) on a local model."""
    if host not in LOOPBACK and not api_key:
        raise fail(
            f"--host {host} exposes the trainer beyond this machine without a key",
            hint="add --api-key tml-...",
            code=EXIT_USAGE,
        )
    if api_key and not api_key.startswith("tml-"):
        raise fail(
            "--api-key must start with 'tml-' (the tinker SDK refuses other keys)",
            hint="e.g. tml-local-1",
            code=EXIT_USAGE,
        )
    with cli_errors():
        from pathlib import Path

        from atropos_cli.httpserve import listen, serve
        from atropos_cli.inference.local import resolve_device
        from atropos_cli.resources import resolve_model_path
        from atropos_cli.tinker.app import create_app
        from atropos_cli.tinker.service import Settings
        from atropos_cli.trainer.scale.distributed import in_launcher

        if nproc_per_node > 1 and not in_launcher():
            _launch(nproc_per_node)
            return
        dist = _join(device) if in_launcher() else None
        if dist is not None and not dist.is_main:
            _follow(resolve_model_path(model), dist, max_slots)
            return
        listener = listen(host, port)
        port = listener.getsockname()[1]
        settings = Settings(
            model_dir=resolve_model_path(model),
            model_name=model,
            state_dir=Path(state_dir),
            device=dist.device if dist is not None else resolve_device(device),
            max_slots=max_slots,
            dist=dist,
        )
        app = create_app(settings, api_key, max_body_mb, host, allowed_host)
        console.print(
            f"atropos serve-trainer on http://{host}:{port} | model {model} on {settings.device} | "
            f"checkpoints in {settings.state_dir} | {max_slots} slots"
            + (f" | {dist.world} replicas" if dist is not None else ""),
            soft_wrap=True,
        )
        console.print(
            f"point the SDK at it: TINKER_BASE_URL=http://{host}:{port} TINKER_API_KEY={api_key or 'tml-local'}"
        )
        serve(app, listener, HttpLimits(**limits), log_level=os.environ.get("ATROPOS_TINKER_LOG", "warning"))


def _launch(nproc: int) -> None:
    """This same command on `nproc` local ranks (torchrun's launcher); returns when they all stopped."""
    import sys

    from atropos_cli.quiet import verbose
    from atropos_cli.trainer.scale.launch import launch

    try:
        launch(nproc, sys.argv[1:], verbose())
    except KeyboardInterrupt:  # Ctrl-C: rank 0 closed the service and the other ranks left with it
        return


def _join(device: str) -> Any:
    """This rank's place in the process group. Ranks other than 0 wait in a collective between requests, for as
    long as the service is idle: hence a long timeout (a dead rank still stops all at once: the launcher)."""
    from atropos_cli.trainer.scale.distributed import init_from_env

    return init_from_env(device, timeout_s=IDLE_TIMEOUT_S)


def _follow(model_dir: str, dist: Any, max_slots: int) -> None:
    """A rank other than 0: its replica of the model applies rank 0's training calls until the service stops."""
    from atropos_cli.tinker.replicas import follow
    from atropos_cli.tinker.slots import Host

    dist.catch_stop_signals()  # the launcher's Ctrl-C reaches every rank: this one leaves when rank 0 says so
    follow(Host(model_dir, dist.device, max_slots), dist)
    dist.close()


def register(app: typer.Typer) -> None:
    app.command("serve-trainer")(serve_trainer_command)
