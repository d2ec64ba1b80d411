"""`atropos proxy`: the recording proxy on its own, in front of a policy backend, for harnesses run elsewhere.

The proxy is `atropos_cli.adapters.harness.proxy` (the `harness:` env starts the same one per group); this
module resolves the backend from `--openai.*` flags (none: the shipped model in-process), loads the policy's
tokenizer and serves the app with the connection limits of every server here."""

from __future__ import annotations

from typing import Annotated, Any

import typer
from typer.core import TyperCommand

from atropos_cli.adapters.harness.settings import ProxySettings
from atropos_cli.cli.common import DottedCommand, cli_errors, console, warn
from atropos_cli.cli.options import AllowedHosts, ModelOptions, with_options
from atropos_cli.httpserve import LIMIT_FLAGS, HttpLimits

PROXY_HELP = (
    "Serve the recording proxy: an OpenAI-compatible endpoint per rollout session that records every call's token ids."
)


@with_options(
    ModelOptions(ProxySettings, panel="Proxy"),
    ModelOptions(HttpLimits, flags=LIMIT_FLAGS, panel="Connection limits"),
)
def proxy_command(
    ctx: typer.Context,
    host: Annotated[str, typer.Option(help="Interface to bind (127.0.0.1 keeps it local).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port).")] = 9100,
    tokenizer: Annotated[
        str | None, typer.Option(help="The policy's tokenizer (name or directory); default: the served model's.")
    ] = None,
    api_key: Annotated[
        str | None,
        typer.Option(envvar="ATROPOS_PROXY_API_KEY", help="Require 'Authorization: Bearer KEY' on every call."),
    ] = None,
    allowed_host: AllowedHosts = None,
    **settings: Any,
) -> None:
    """Serve the recording proxy: an OpenAI-compatible endpoint per rollout session that records every call's
    token ids.

    POST /sessions opens a session and answers its base URL (http://HOST:PORT/s/ID/v1): point a harness's OpenAI
    client at it. Every chat call is rendered with the policy's chat template, sampled by the backend
    (--openai.base_url URL --openai.server_type vllm|sglang|openai; none: the shipped model in-process) and
    recorded. GET /sessions/ID reports the calls, the drift (a harness that rewrote its history) and the
    trainable rows (tokens, masks, logprobs); DELETE /sessions/ID ends it. See docs/envs-harness.md.
    """
    with cli_errors():
        from atropos_cli.adapters.harness.proxy import Proxy, create_proxy_app
        from atropos_cli.config import parse_dotted_flags, resolve_servers
        from atropos_cli.env.loading import default_to_local
        from atropos_cli.errors import ConfigError
        from atropos_cli.httpguard import HostPolicy, is_loopback_name
        from atropos_cli.httpserve import listen, serve
        from atropos_cli.inference.router import ServerManager
        from atropos_cli.inference.tokenizer import load_tokenizer

        dotted = parse_dotted_flags(list(ctx.args))
        stray = sorted(k for k, v in dotted.items() if v and k != "openai")
        if stray:
            raise ConfigError(f"atropos proxy takes no --{stray[0]}.* flags", hint="only --openai.* (the backend)")
        proxy_settings = ProxySettings(**{k: v for k, v in settings.items() if k in ProxySettings.model_fields})
        listener = listen(host, port)  # a taken port fails before a model loads
        servers = default_to_local(resolve_servers([], None, dotted["openai"]))
        router = ServerManager(servers)
        name = tokenizer or router.tokenizer_name
        policy_tokenizer = load_tokenizer(name) if name else router.tokenizer
        if policy_tokenizer is None:
            policy_tokenizer = load_tokenizer(router.model_name)
        app = create_proxy_app(
            Proxy(router, policy_tokenizer, proxy_settings), api_key or None, HostPolicy(host, allowed_host or [])
        )
        url = f"http://{host}:{listener.getsockname()[1]}"
        console.print(f"recording proxy for {router.model_name!r} on {url} (POST /sessions opens one; Ctrl-C stops)")
        if not api_key and not is_loopback_name(host):
            warn(f"bound to {host} without --api-key: anyone who can reach it can sample from the policy")
        serve(app, listener, HttpLimits(**{k: v for k, v in settings.items() if k in HttpLimits.model_fields}))


class ProxyCommand(DottedCommand):
    """Dotted flags set aside as every run command's, but only `--openai.*` mean anything here: no env flags."""

    def format_help(self, ctx: Any, formatter: Any) -> None:
        TyperCommand.format_help(self, ctx, formatter)


def register(app: typer.Typer) -> None:
    app.command("proxy", cls=ProxyCommand)(proxy_command)
