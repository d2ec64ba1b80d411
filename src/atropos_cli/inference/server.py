"""The OpenAI-compatible HTTP app: `atropos inference` serves a local model with it, and the fake test server
(`atropos_cli.testing.fake_server`) is one more backend behind the same app, so both share one request schema
(`openai_schema`) and one set of limits.

`create_app(served, settings)` is a FastAPI factory over a `Served` (a `LocalBackend` is wrapped in
`LocalServed`). Endpoints: `GET /health`, `GET /v1/models`, `GET /stats`, `POST /v1/chat/completions`,
`POST /v1/completions`, and `POST /reload_weights {"path": DIR}` (the trainer calls it after a step: the local
backend swaps weights between two batches and bumps `version`).

Limits, checked before any model work: browser cross-site requests and non-JSON bodies are refused
(`httpguard`); with an API key every request needs `Authorization: Bearer KEY`; a body over `max_body_mb` is
a 413 (read no further); a prompt whose text cannot fit the context is a 400 before it is tokenized; a request
asking for more than `max_choices` sequences (prompts x n) is a 400; past `max_pending` sequences in flight
(every request's prompts x n) new ones get 503 + Retry-After, so `/health` stays fast.
Errors use real status codes with OpenAI's error body; a bad parameter value is a 400 that names it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field

from atropos_cli.errors import AtroposError, ModelLoadError
from atropos_cli.httpguard import BearerAuth, BrowserGuard, HostPolicy
from atropos_cli.inference.local import BadRequestError, LocalBackend
from atropos_cli.inference.openai_schema import ChatRequest, CompletionRequest, HTTPError, parse_request, prompt_list
from atropos_cli.inference.served import LocalServed, Served
from atropos_cli.inference.sse import chat_events

__all__ = [
    "create_app", "ServerSettings", "ChatRequest", "CompletionRequest", "read_json", "error_handlers", "render_error",
]  # fmt: skip


class ServerSettings(BaseModel):
    max_body_mb: float = Field(default=8.0, gt=0)
    """Largest request body (MiB); past it a 413 and the rest is not read."""
    max_pending: int = Field(default=1024, ge=1)
    """Most sequences (prompts x n of every request) in flight; past it 503 + Retry-After (health stays fast)."""
    max_choices: int = Field(default=256, ge=1)
    """Most sequences one request may ask for (prompts x n); past it a 400 naming n."""
    api_key: str | None = None
    """Require `Authorization: Bearer KEY` on every request."""
    host: str = "127.0.0.1"
    """The address the server is bound to: a `Host` naming it is answered (see `httpguard.HostPolicy`)."""
    allowed_hosts: list[str] = Field(default_factory=list)
    """Names besides loopback and the bound address that requests may use in `Host` (`*`: any)."""


class ReloadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str = Field(min_length=1)


def render_error(status: int, message: str, hint: str | None = None) -> JSONResponse:
    text = message + (f" (hint: {hint})" if hint else "")
    kind = "server_error" if status >= 500 else "invalid_request_error"
    return JSONResponse({"error": {"message": text, "type": kind, "param": None, "code": status}}, status)


def _error(exc: HTTPError) -> JSONResponse:
    body = {"error": {"message": exc.message, "type": exc.kind, "param": exc.param, "code": exc.status}}
    return JSONResponse(body, status_code=exc.status, headers=exc.headers)


async def read_json(request: Request, limit: int) -> Any:
    declared = request.headers.get("content-length", "")
    too_large = HTTPError(413, f"request body is over the limit of {limit} bytes (--max-body-mb)")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    try:
        return orjson.loads(b"".join(chunks))
    except orjson.JSONDecodeError:
        raise HTTPError(400, "request body is not valid JSON") from None


class _Gate:
    """Counts the sequences in flight (a request holds one while its body is read, then prompts x n); refuses
    what would go past the limit (503 + Retry-After)."""

    def __init__(self, limit: int) -> None:
        self.limit, self.pending = limit, 0

    def _take(self, held: list[int], count: int) -> None:
        if count > 0 and self.pending + count > self.limit:
            raise HTTPError(
                503, f"server busy: {self.pending} sequences in flight (limit {self.limit}, --max-pending)",
                kind="server_error", headers={"Retry-After": "1"},
            )  # fmt: skip
        self.pending += count
        held[0] += count

    @contextlib.contextmanager
    def slot(self) -> Iterator[Callable[[int], None]]:
        """Hold one sequence; the block calls the yielded `grow(total)` once it knows the request's size."""
        held = [0]
        self._take(held, 1)
        try:
            yield lambda total: self._take(held, total - held[0])
        finally:
            self.pending -= held[0]


def _sequences(req: ChatRequest | CompletionRequest, limit: int) -> int:
    """Prompts x n of a request; a 400 naming n past `limit` (--max-choices)."""
    prompts = len(prompt_list(req.prompt)) if isinstance(req, CompletionRequest) else 1
    total = prompts * req.n
    if total > limit:
        raise HTTPError(
            400, f"the request asks for {total} sequences ({prompts} prompts x n={req.n}), over the limit of "
            f"{limit} per request (--max-choices)", param="n",
        )  # fmt: skip
    return total


def _check_prompt_size(served: Served, req: ChatRequest | CompletionRequest) -> None:
    limit = served.max_prompt_chars()
    chars = req.prompt_chars()
    if limit is not None and chars > limit:
        raise HTTPError(
            400, f"prompt has {chars} characters: more than the model's context can hold ({limit} at most)",
            param="messages" if isinstance(req, ChatRequest) else "prompt",
        )  # fmt: skip


def streamed(run: Callable[[ChatRequest], Awaitable[Any]]) -> Callable[[ChatRequest], Awaitable[Any]]:
    """`run`, answering a `stream: true` request with its whole answer as server-sent events."""

    async def answer(req: ChatRequest) -> Any:
        body = await run(req)
        if not req.stream or isinstance(body, Response):
            return body
        include_usage = req.stream_options is not None and req.stream_options.include_usage
        return StreamingResponse(chat_events(body, include_usage), media_type="text/event-stream")

    return answer


def create_app(backend: Served | LocalBackend, settings: ServerSettings | None = None) -> FastAPI:
    """The FastAPI app serving `backend`. Closing the app (lifespan end) closes the backend."""
    served: Served = LocalServed(backend) if isinstance(backend, LocalBackend) else backend
    settings = settings or ServerSettings()
    limit = int(settings.max_body_mb * 1024 * 1024)
    gate = _Gate(settings.max_pending)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        yield
        await served.aclose()

    app = FastAPI(title=f"atropos inference ({served.model_name})", lifespan=lifespan)
    app.state.served = served
    if settings.api_key:
        hint = "send 'Authorization: Bearer KEY' (OpenAI clients: api_key=KEY)"
        app.add_middleware(BearerAuth, api_key=settings.api_key, render=render_error, hint=hint)
    app.add_middleware(BrowserGuard, render=render_error, hosts=HostPolicy(settings.host, settings.allowed_hosts))
    error_handlers(app)
    _info_routes(app, served)

    async def generate(request: Request, model: type[Any], run: Callable[[Any], Awaitable[Any]]) -> Response:
        with gate.slot() as grow, served.arriving():  # a burst of requests being parsed becomes one batch
            req = parse_request(await read_json(request, limit), model, served.strict)
            _check_prompt_size(served, req)
            grow(_sequences(req, min(settings.max_choices, settings.max_pending)))
            answer = await run(req)
        # a JSONResponse skips FastAPI's jsonable_encoder walk over the nested body (measurably faster)
        return answer if isinstance(answer, Response) else JSONResponse(answer)

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        return await generate(request, ChatRequest, streamed(served.chat))

    @app.post("/v1/completions")
    async def complete(request: Request) -> Response:
        return await generate(request, CompletionRequest, served.complete)

    @app.post("/reload_weights")
    async def reload_weights(request: Request) -> dict[str, Any]:
        req = parse_request(await read_json(request, limit), ReloadRequest, strict=True)  # type: ignore[arg-type]
        return await served.reload(req.path)

    return app


def error_handlers(app: FastAPI) -> None:
    @app.exception_handler(HTTPError)
    async def _on_http_error(_: Request, exc: HTTPError) -> JSONResponse:
        return _error(exc)

    @app.exception_handler(AtroposError)
    async def _on_atropos_error(_: Request, exc: AtroposError) -> JSONResponse:
        message = exc.message + (f" (hint: {exc.hint})" if exc.hint else "")
        if isinstance(exc, BadRequestError | ModelLoadError):
            return _error(HTTPError(400, message))
        return _error(HTTPError(500, message, kind="server_error"))


def _info_routes(app: FastAPI, served: Served) -> None:
    @app.get("/health")
    async def health() -> dict[str, Any]:
        return served.health()

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return served.stats()

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [served.model_card()]}
