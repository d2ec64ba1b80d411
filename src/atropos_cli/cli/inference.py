"""`atropos inference`: serve a local model (default: the shipped `atropos-tiny-arith`) over an
OpenAI-compatible HTTP API, so any OpenAI client, Atropos env or `atropos process --openai.base_url` can use it.
The server itself is `atropos_cli.inference.server.create_app`; this module parses flags and runs uvicorn."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from atropos_cli.cli.common import cli_errors, console
from atropos_cli.cli.options import AllowedHosts, ModelOptions, with_options
from atropos_cli.httpserve import LIMIT_FLAGS, HttpLimits
from atropos_cli.resources import DEFAULT_MODEL


@with_options(ModelOptions(HttpLimits, flags=LIMIT_FLAGS, panel="Connection limits"))
def inference_command(
    model: Annotated[
        str, typer.Option(help="A shipped model's short name, a saved model directory, or a hub id.")
    ] = DEFAULT_MODEL,
    host: Annotated[str, typer.Option(help="Interface to bind (127.0.0.1 keeps it local).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on.")] = 9001,
    device: Annotated[str, typer.Option(help="auto (cuda > mps > cpu), cpu, cuda, cuda:1, mps.")] = "auto",
    dtype: Annotated[
        str, typer.Option(help="auto (bfloat16 on CUDA, else float32), float32, bfloat16, float16.")
    ] = "auto",
    max_batch_size: Annotated[
        int, typer.Option(min=1, help="Most sequences sampled together in one batch (concurrent requests merge).")
    ] = 128,
    max_wait_ms: Annotated[
        float, typer.Option(min=0, help="Keep a batch open until no request arrived for this long (ms).")
    ] = 3.0,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="ATROPOS_INFERENCE_API_KEY", help="Require 'Authorization: Bearer KEY' on every call."),
    ] = None,
    max_body_mb: Annotated[float, typer.Option(min=0.001, help="Largest request body (MiB); past it a 413.")] = 8.0,
    max_pending: Annotated[
        int, typer.Option(min=1, help="Most sequences (prompts x n) in flight; past it 503 + Retry-After.")
    ] = 1024,
    max_choices: Annotated[
        int, typer.Option(min=1, help="Most sequences one request may ask for (prompts x n); past it a 400.")
    ] = 256,
    allowed_host: AllowedHosts = None,
    **limits: Any,
) -> None:
    """Serve a local causal LM over an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /health,
    POST /reload_weights {"path": DIR} to swap in new weights without restarting).

    `atropos models` prints the shipped models' directories (TRL and transformers load them: from_pretrained).
    """
    with cli_errors():
        from atropos_cli.config import ServerConfig
        from atropos_cli.httpserve import listen, serve
        from atropos_cli.inference.local import LocalBackend
        from atropos_cli.inference.server import ServerSettings, create_app

        listener = listen(host, port)  # a taken port fails before the model loads
        port = listener.getsockname()[1]
        config = ServerConfig(server_type="local", model_name=model, device=device, dtype=dtype)
        backend = LocalBackend(config, max_batch_size=max_batch_size, max_wait_s=max_wait_ms / 1000)
        console.print(
            f"serving {backend.model_name!r} (version {backend.version}, {backend.device}, "
            f"context {backend.max_model_len}) on http://{host}:{port}/v1"
        )
        settings = ServerSettings(
            max_body_mb=max_body_mb, max_pending=max_pending, max_choices=max_choices, api_key=api_key or None,
            host=host, allowed_hosts=allowed_host or [],
        )  # fmt: skip
        if api_key:
            console.print("auth: bearer token required on every endpoint")
        elif host not in ("127.0.0.1", "localhost", "::1"):
            console.print(f"[yellow]warning:[/] bound to {host} without --api-key: anyone who can reach it can use it")
        serve(create_app(backend, settings), listener, HttpLimits(**limits))


def register(app: typer.Typer) -> None:
    app.command("inference")(inference_command)
