"""FastAPI factory of the trajectory API (`atropos api`): Atropos' `run-api` endpoints, same
paths, bodies and response shapes, plus `/health` and `/metrics`.

Sits between the network and `service.ApiService`. Request bodies go through `wire.py` (size limit, gzip
with an inflate limit, strict JSON, ScoredGroup validation). Errors use real status codes with a JSON body
`{"status": "error", "message": ..., "hint": ...}`: 400 bad JSON/gzip, 401 bad token, 403 reset disabled,
403 a browser's cross-site request or reset disabled, 404 unknown env, 409 no trainer yet, 413 too large, 415 a
body that is not JSON, 422 invalid group, 503 queue full (+ Retry-After). `httpguard` runs before any route.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, Response

from atropos_cli.api import wire
from atropos_cli.api.service import (
    ApiBusy,
    ApiConflict,
    ApiInvalid,
    ApiNotFound,
    ApiService,
    ApiSettings,
    RegisterEnv,
    Registration,
)
from atropos_cli.api.wire import WireError
from atropos_cli.httpguard import BearerAuth, BrowserGuard, HostPolicy

__all__ = ["create_app"]

_RETRY_AFTER_S = "1"
_EMPTY_EXAMPLE: dict[str, Any] = {
    "tokens": [], "masks": [], "scores": [], "advantages": None, "ref_logprobs": None, "messages": None,
    "generation_params": None, "inference_logprobs": None, "overrides": None, "group_overrides": None,
    "images": None, "env_id": None, "distill_token_ids": None, "distill_logprobs": None,
}  # fmt: skip


def _error(status: int, message: str, hint: str | None = None, **extra: Any) -> JSONResponse:
    headers = {"Retry-After": _RETRY_AFTER_S} if status == 503 else None
    body = {"status": "error", "message": message, "hint": hint, **extra}
    return JSONResponse(body, status_code=status, headers=headers)


def _install_error_handlers(app: FastAPI, service: ApiService) -> None:
    @app.exception_handler(WireError)
    async def _wire(_: Request, exc: WireError) -> JSONResponse:
        service.metrics.on_reject(exc.reason)
        return _error(exc.status, exc.message, exc.hint)

    @app.exception_handler(ApiBusy)
    async def _busy(_: Request, exc: ApiBusy) -> JSONResponse:
        service.metrics.on_reject("queue_full")
        return _error(503, exc.message, exc.hint)

    @app.exception_handler(ApiConflict)
    async def _conflict(_: Request, exc: ApiConflict) -> JSONResponse:
        service.metrics.on_reject("no_trainer")
        return _error(409, exc.message, exc.hint)

    @app.exception_handler(ApiNotFound)
    async def _not_found(_: Request, exc: ApiNotFound) -> JSONResponse:
        return _error(404, exc.message, exc.hint)

    @app.exception_handler(ApiInvalid)
    async def _invalid(_: Request, exc: ApiInvalid) -> JSONResponse:
        service.metrics.on_reject("invalid_group")
        return _error(422, exc.message, exc.hint)


Handler = Callable[[Request], Awaitable[Any]]


def _route(app: FastAPI, method: str | list[str], path: str) -> Callable[[Handler], Handler]:
    """Register a plain Starlette route (no FastAPI dependency solving: ~0.2 ms less per request); a dict
    answer is encoded with orjson."""

    def register(handler: Handler) -> Handler:
        async def endpoint(request: Request) -> Response:
            answer = await handler(request)
            if isinstance(answer, Response):
                return answer
            return Response(orjson.dumps(answer), media_type="application/json")

        methods = [method] if isinstance(method, str) else method
        app.router.add_route(path, endpoint, methods=methods, include_in_schema=False)
        return handler

    return register


async def _json_body(request: Request, settings: ApiSettings) -> Any:
    limit = int(settings.max_body_mb * 1024 * 1024)
    wire.check_length(request.headers.get("content-length"), limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        wire.check_length(str(size), limit)
        chunks.append(chunk)
    body = b"".join(chunks)
    if request.headers.get("content-encoding", "").lower() == "gzip":
        body = wire.inflate(body, limit)
    return wire.parse_json(body)


def create_app(
    settings: ApiSettings,
    on_tick: Callable[[ApiService], None] | None = None,
    tick_s: float = 5.0,
) -> FastAPI:
    """Build the app. `on_tick(service)` (the CLI's status line) runs every `tick_s` seconds while serving."""
    service = ApiService(settings)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        task = asyncio.create_task(_ticker(service, on_tick, tick_s)) if on_tick else None
        try:
            yield
        finally:
            if task:
                task.cancel()
            service.close()

    app = FastAPI(title="atropos api", lifespan=lifespan)
    app.state.service = service
    if settings.api_key:
        hint = "send 'Authorization: Bearer <key>' (atropos serve: --api-key or ATROPOS_API_KEY)"
        app.add_middleware(
            BearerAuth, api_key=settings.api_key, render=_error, hint=hint, on_reject=service.metrics.on_reject
        )
    hosts = HostPolicy(settings.host, settings.allowed_hosts)
    app.add_middleware(BrowserGuard, render=_error, on_reject=service.metrics.on_reject, hosts=hosts)  # runs first
    _install_error_handlers(app, service)
    _trainer_routes(app, service)
    _env_routes(app, service)
    _admin_routes(app, service)
    return app


async def _ticker(service: ApiService, on_tick: Callable[[ApiService], None], tick_s: float) -> None:
    while True:
        await asyncio.sleep(tick_s)
        on_tick(service)


def _trainer_routes(app: FastAPI, service: ApiService) -> None:
    settings = service.settings

    @_route(app, "POST", "/register")
    async def register(request: Request) -> JSONResponse:
        reg = wire.parse_model(Registration, await _json_body(request, settings), "registration")
        return JSONResponse({"uuid": service.register(reg)})  # a 128-bit int: beyond orjson's range

    @_route(app, "GET", "/batch")
    async def batch(_: Request) -> Response:
        if service.registration is None:
            body = {"status": "error", "message": "Trainer not registered. Call /register first.", "batch": []}
            return JSONResponse(body, status_code=409)
        payloads = service.next_batch()
        if payloads is None:
            return Response(b'{"batch":null}', media_type="application/json")
        return Response(b'{"batch":[' + b",".join(payloads) + b"]}", media_type="application/json")

    @_route(app, "GET", "/info")
    async def info(_: Request) -> dict[str, int]:
        reg = service.registration
        if reg is None:
            return {"batch_size": -1, "max_token_len": -1}
        return {"batch_size": reg.batch_size, "max_token_len": reg.max_token_len}

    @_route(app, "GET", "/wandb_info")
    async def wandb_info(_: Request) -> dict[str, str | None]:
        reg = service.registration
        return {"group": reg.wandb_group if reg else None, "project": reg.wandb_project if reg else None}

    @_route(app, "GET", "/status")
    async def status(_: Request) -> dict[str, int]:
        return service.status()


def _env_routes(app: FastAPI, service: ApiService) -> None:
    settings = service.settings

    @_route(app, "POST", "/register-env")
    async def register_env(request: Request) -> dict[str, Any]:
        req = wire.parse_model(RegisterEnv, await _json_body(request, settings), "env registration")
        return service.register_env(req)

    @_route(app, "POST", "/disconnect-env")
    async def disconnect_env(request: Request) -> dict[str, Any]:
        return service.disconnect_env(_env_id(await _json_body(request, settings)))

    @_route(app, "GET", "/status-env")
    async def status_env(request: Request) -> dict[str, Any]:
        # Atropos sends a GET with a JSON body; a query parameter works too for clients that cannot.
        query = request.query_params.get("env_id")
        data = {"env_id": query} if query is not None else await _json_body(request, settings)
        return service.status_env(_env_id(data))

    @_route(app, "POST", "/scored_data")
    async def scored_data(request: Request) -> dict[str, Any]:
        data = await _json_body(request, settings)
        service.check_accepting(1)
        return (await service.ingest([wire.to_ingest_item(data, vocab_size=service.vocab_size())]))[0]

    @_route(app, "POST", "/scored_data_list")
    async def scored_data_list(request: Request) -> dict[str, Any]:
        data = await _json_body(request, settings)
        if not isinstance(data, list) or not data:
            raise WireError(422, "expected a non-empty JSON list of groups", "invalid_body")
        if len(data) > settings.max_queue_groups:
            # 503 would make clients retry forever: this list can never fit.
            raise WireError(
                413,
                f"{len(data)} groups in one request, over the queue limit of {settings.max_queue_groups}",
                "body_too_large",
                hint="post fewer groups per request",
            )
        service.check_accepting(len(data))
        vocab = service.vocab_size()
        answers = await service.ingest([wire.to_ingest_item(g, i, vocab) for i, g in enumerate(data)])
        result: dict[str, Any] = {"status": "received", "groups_processed": len(answers)}
        buffered = [a for a in answers if a["status"] == "buffered"]
        if buffered:
            result["buffered"] = len(buffered)
            result["last_buffer_size"] = buffered[-1]["buffer_size"]
        return result


def _env_id(data: Any) -> int:
    value = data.get("env_id") if isinstance(data, dict) else None
    try:
        return int(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise WireError(422, f"expected a body {{'env_id': <int>}}, got {data!r:.200}", "invalid_body") from None


def _admin_routes(app: FastAPI, service: ApiService) -> None:
    @_route(app, "GET", "/")
    async def root(_: Request) -> dict[str, str]:
        return {"message": "AtroposLib API"}

    @_route(app, "GET", "/latest_example")
    async def latest_example(_: Request) -> Response:
        payload = service.latest_example()
        if payload is None:
            return JSONResponse(_EMPTY_EXAMPLE)
        return Response(payload, media_type="application/json")

    # GET as in Atropos (its sft/dpo tools call it); a browser cannot reach it (BrowserGuard); POST works too.
    @_route(app, ["GET", "POST"], "/reset_data")
    async def reset_data(_: Request) -> Response:
        if service.settings.disable_reset:
            return _error(403, "/reset_data is disabled on this API", "restart it without --disable-reset")
        service.reset()
        return PlainTextResponse("Reset successful")

    @_route(app, "GET", "/health")
    async def health(_: Request) -> dict[str, Any]:
        return {
            "status": "ok",
            "durable": service.store.durable,
            "step": service.step,
            "queue_groups": len(service.queue.queue),
            "buffered_groups": service.queue.buffered_count(),
            "batched_groups": sum(len(batch[1]) for batch in service.pending),
            "outstanding_groups": service.outstanding_groups(),
            "trainer_registered": service.registration is not None,
        }

    @_route(app, "GET", "/metrics")
    async def metrics(_: Request) -> PlainTextResponse:
        text = service.metrics.render(service.gauges())
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")
