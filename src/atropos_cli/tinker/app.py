"""The HTTP routes of `atropos serve-trainer`: the Tinker API under /api/v1 as the tinker SDK calls it.

Errors are JSON `{"detail": message}` with a 4xx status and `x-should-retry: false` (the SDK then raises at
once instead of retrying). With an API key, every call needs it in `X-API-Key` (the header the SDK sends).
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from atropos_cli.errors import ApiRequestError
from atropos_cli.httpguard import BodyLimit, BrowserGuard, HostPolicy
from atropos_cli.tinker import protowire, wire
from atropos_cli.tinker.errors import invalid, not_found, unsupported
from atropos_cli.tinker.service import Service, Settings

PREFIX = "/api/v1"
PROTOBUF = "application/x-protobuf"
# Flags the SDK fetches once (its ClientConfigResponse): plain httpx transport, uncompressed protobuf bodies,
# custom losses run client-side, one retrieve_future poll per request.
CLIENT_CONFIG = {
    "use_pyqwest_transport": False,
    "proto_compress_fwdbwd": False,
    "custom_loss_server_side": False,
    "sample_use_retrieve_futures": False,
    "sample_join_sampling_session": False,
    "parallel_fwdbwd_chunks": False,
}
# Tinker API calls this server does not serve: each answers 422 naming itself.
UNSERVED = {
    "/create_custom_loss": "server-side custom losses (forward_backward_custom runs client-side)",
    "/save_weights_external": "saving weights to external storage",
    "/copy_weights": "copying weights between training runs",
    "/join_sampling_session": "joining a pickled sampling session",
    "/retrieve_futures": "batched future polling",
    "/weights_info": "the REST checkpoint registry",
    "/training_runs": "the REST training-run registry",
    "/checkpoints": "the REST checkpoint registry",
    "/auth/token": "token exchange (send your key in X-API-Key)",
    "/auth/apikey": "API key introspection",
    "/sessions": "the REST session registry (listing, search, project, trace export)",
    "/audit": "the audit log",
    "/billing": "billing",
}


def _error(status: int, message: str, hint: str | None = None) -> JSONResponse:
    text = message + (f" (hint: {hint})" if hint else "")
    return JSONResponse({"detail": text}, status, headers={"x-should-retry": "false"})


class KeyAuth:
    """Every request carries the server's key in X-API-Key (the tinker SDK's header). Pure ASGI."""

    def __init__(self, app: Any, api_key: str) -> None:
        self.app, self.key = app, api_key.encode()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-api-key", b"")
        if secrets.compare_digest(given, self.key):
            await self.app(scope, receive, send)
            return
        message = "wrong API key" if given else "this server requires an API key"
        await _error(401, message, "set TINKER_API_KEY to the key serve-trainer was started with")(scope, receive, send)


async def _json(request: Request) -> Any:
    body = await request.body()
    try:
        return orjson.loads(body or b"{}")
    except orjson.JSONDecodeError as exc:
        raise invalid(f"request body is not valid JSON ({exc})") from None


def create_app(
    settings: Settings,
    api_key: str | None = None,
    max_body_mb: float = 256.0,
    host: str = "127.0.0.1",
    allowed_hosts: list[str] | None = None,
) -> FastAPI:
    """The app; `host` (the bound address) and `allowed_hosts` are the Host values it answers (DNS rebinding)."""
    service = Service(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await service.aclose()

    app = FastAPI(title="atropos serve-trainer", lifespan=lifespan)
    app.state.service = service
    app.add_middleware(BodyLimit, max_bytes=int(max_body_mb * 1024 * 1024), render=_error)
    if api_key:
        app.add_middleware(KeyAuth, api_key=api_key)
    hosts = HostPolicy(host, allowed_hosts or [])
    app.add_middleware(BrowserGuard, render=_error, hosts=hosts, body_types=("application/json", PROTOBUF))

    @app.exception_handler(ApiRequestError)
    async def _refused(_: Request, exc: ApiRequestError) -> JSONResponse:
        return _error(exc.status or 400, exc.message, exc.hint)

    @app.exception_handler(ClientDisconnect)
    async def _gone(_: Request, exc: ClientDisconnect) -> Response:
        return Response(status_code=499)  # the client closed the connection (a poll it gave up): nobody reads it

    @app.exception_handler(404)
    async def _no_route(request: Request, _: Exception) -> JSONResponse:
        return _error(404, f"no route {request.url.path}", "this server speaks the Tinker API under /api/v1")

    _service_routes(app, service)
    _training_routes(app, service)
    _unserved_routes(app)
    return app


def _service_routes(app: FastAPI, service: Service) -> None:
    @app.get(PREFIX + "/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post(PREFIX + "/client/config")
    async def client_config() -> dict[str, Any]:
        return CLIENT_CONFIG

    @app.post(PREFIX + "/client/dynamic_config")
    async def dynamic_config() -> dict[str, Any]:
        return {}

    @app.post(PREFIX + "/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}

    @app.get(PREFIX + "/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        model = {
            "model_name": service.settings.model_name,
            "max_context_length": service.host.max_len,
            "trainable": True,
            "sampleable": True,
        }
        return {"supported_models": [model]}

    @app.post(PREFIX + "/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        wire.parse(wire.CreateSession, await _json(request), "create_session")
        return {"type": "create_session", "session_id": service.create_session()}

    @app.post(PREFIX + "/session_heartbeat")
    async def heartbeat(request: Request) -> Any:
        ref = wire.parse(wire.SessionRef, await _json(request), "session_heartbeat")
        if not service.heartbeat(ref.session_id):
            return _error(410, f"session {ref.session_id!r} is not open on this server (finished, or restarted)")
        return {"type": "session_heartbeat"}

    @app.post(PREFIX + "/sessions/{session_id}/finish")
    async def finish_session(session_id: str) -> Response:
        await service.finish_session(session_id)
        return Response(status_code=204)

    @app.post(PREFIX + "/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        req = wire.parse(wire.CreateSamplingSession, await _json(request), "create_sampling_session")
        session = await service.create_sampling_session(req.model_path, req.base_model)
        return {"type": "create_sampling_session", "sampling_session_id": session}

    @app.get(PREFIX + "/samplers/{sampler_id}")
    async def sampler(sampler_id: str) -> dict[str, Any]:
        key = service.sampler_sessions.get(sampler_id)
        if key is None:
            raise not_found(f"no sampling session {sampler_id!r}", hint="create a sampling client")
        path = key if key.startswith("tinker://") else None
        return {"sampler_id": sampler_id, "base_model": service.settings.model_name, "model_path": path}

    @app.post(PREFIX + "/retrieve_future")
    async def retrieve_future(request: Request) -> Response:
        req = wire.parse(wire.RetrieveFuture, await _json(request), "retrieve_future")
        result = await service.retrieve(req.request_id)
        if isinstance(result, bytes):
            return Response(result, media_type=PROTOBUF)
        return JSONResponse(result)

    @app.post(PREFIX + "/cancel_future")
    async def cancel_future() -> Response:
        return Response(status_code=204)


def _training_routes(app: FastAPI, service: Service) -> None:
    @app.post(PREFIX + "/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        return service.create_model(wire.parse(wire.CreateModel, await _json(request), "create_model"))

    @app.post(PREFIX + "/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        return service.info(wire.parse(wire.ModelRef, await _json(request), "get_info").model_id)

    @app.post(PREFIX + "/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != PROTOBUF:
            raise invalid(f"forward_backward takes {PROTOBUF}, got {media or 'none'!r}", hint="use the tinker SDK")
        if request.headers.get("content-encoding"):
            raise unsupported("compressed forward_backward bodies are not supported")
        return service.forward_backward(protowire.read_forward_backward(await request.body()))

    @app.post(PREFIX + "/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        return service.optim_step(wire.parse(wire.OptimStep, await _json(request), "optim_step"))

    @app.post(PREFIX + "/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        return service.save_state(wire.parse(wire.SaveWeights, await _json(request), "save_weights"))

    @app.post(PREFIX + "/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        return service.load_state(wire.parse(wire.LoadWeights, await _json(request), "load_weights"))

    @app.post(PREFIX + "/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        return service.save_for_sampler(wire.parse(wire.SaveWeights, await _json(request), "save_weights_for_sampler"))

    @app.post(PREFIX + "/asample")
    async def asample(request: Request) -> dict[str, Any]:
        return await service.sample(wire.parse(wire.Sample, await _json(request), "asample"))


def _unserved_routes(app: FastAPI) -> None:
    def refusal(what: str) -> Any:
        async def refuse() -> JSONResponse:
            return _error(422, f"{what} is not supported by atropos serve-trainer", "see docs/tinker.md")

        return refuse

    for route, what in UNSERVED.items():
        methods = ["GET", "POST", "PUT", "DELETE"]
        app.add_api_route(PREFIX + route, refusal(what), methods=methods)
        app.add_api_route(PREFIX + route + "/{rest:path}", refusal(what), methods=methods)
