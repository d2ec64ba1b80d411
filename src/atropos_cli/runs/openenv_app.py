"""The OpenEnv server app of `atropos export openenv`: OpenEnv 0.10's HTTP and WebSocket routes over `Exported`.

Routes (what openenv's `create_app` serves in simulation mode, and what `openenv validate URL` checks):
`GET /health`, `GET /metadata`, `GET /schema` (action `{"message": str}`, observation, state), `GET /state`,
`POST /reset`, `POST /step`, `POST /mcp` (JSON-RPC: this env has no MCP tools, `tools/list` is empty),
`WS /ws` (one episode per connection at a time: reset/step/state/close messages, OpenEnv's error codes).
HTTP `/reset` and `/step` drive one episode shared by all HTTP callers (OpenEnv builds a fresh env per HTTP
call, which cannot carry an episode; ours keeps it), so concurrent clients use `/ws`.

Guarded like our other servers (`httpguard.BrowserGuard`: a foreign Host, duplicate Host headers, browser
cross-site requests and non-JSON bodies are refused, on HTTP and on the WebSocket handshake alike); with an API
key every HTTP request and WebSocket handshake needs `Authorization: Bearer KEY` (`httpguard.BearerAuth`). A body
over `MAX_BODY_BYTES` is answered 413 (`httpguard.BodyLimit`); WebSocket sessions are held to the server's
`WsLimits` (`httpserve.WsSessions`: message size, idle time, a session cap that evicts the idlest).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, HTTPException, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from atropos_cli.errors import AtroposError, ConfigError
from atropos_cli.httpguard import BearerAuth, BodyLimit, BrowserGuard, HostPolicy
from atropos_cli.httpserve import WsLimits, WsSessions
from atropos_cli.runs.openenv_export import Episode, EpisodeError, Exported, Observation, env_lifespan
from atropos_cli.types import Message

__all__ = ["ExportAction", "ExportObservation", "ExportState", "create_openenv_app", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 1_048_576  # an action or a reset is a few KiB; past this a POST is answered 413


class ExportAction(BaseModel):
    """The model's reply to the last observation."""

    model_config = ConfigDict(extra="forbid")
    message: str = Field(..., description="The model's reply text")
    metadata: dict[str, Any] = Field(default_factory=dict)


class ExportObservation(BaseModel):
    model_config = ConfigDict(extra="forbid")
    messages: list[Message] = Field(default_factory=list, description="The chat the env sent to the model")
    prompt: str = Field("", description="The text of the env's last message (or its completion prompt)")
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict, description="item_id, index, split (+ reward_parts)")


class ExportState(BaseModel):
    episode_id: str | None = None
    step_count: int = 0
    item_id: str | None = None
    index: int | None = None
    done: bool = False


class ResetBody(BaseModel):
    model_config = ConfigDict(extra="allow")
    seed: int | None = Field(None, ge=0)
    episode_id: str | None = None
    split: str = "train"


class Session:
    """One client's episode (a WebSocket connection's, or the shared HTTP one)."""

    def __init__(self, exported: Exported) -> None:
        self.exported = exported
        self.episode: Episode | None = None
        self.episode_id: str | None = None

    async def reset(self, data: dict[str, Any]) -> Observation:
        body = ResetBody.model_validate(data)
        self.close()
        self.episode = await self.exported.episode(body.seed, body.split)
        self.episode_id = body.episode_id
        return await self.episode.start()

    async def step(self, data: dict[str, Any]) -> Observation:
        action = ExportAction.model_validate(data)
        if self.episode is None:
            raise EpisodeError("no episode: call reset first", hint="reset, then step with the model's reply")
        return await self.episode.step(action.message)

    def state(self) -> dict[str, Any]:
        episode = self.episode
        return ExportState(
            episode_id=self.episode_id,
            step_count=episode.step_count if episode else 0,
            item_id=episode.item_id if episode else None,
            index=episode.index if episode else None,
            done=episode.done if episode else False,
        ).model_dump()

    def close(self) -> None:
        if self.episode is not None:
            self.episode.cancel()


def _error(message: str, code: str) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code}}


async def _ws_answer(session: Session, message: Any) -> dict[str, Any] | None:
    """One WebSocket message's answer (None: close the session)."""
    kind = message.get("type") if isinstance(message, dict) else None
    data = message.get("data") or {} if isinstance(message, dict) else {}
    try:
        if kind == "reset":
            return {"type": "observation", "data": (await session.reset(data)).wire()}
        if kind == "step":
            return {"type": "observation", "data": (await session.step(data)).wire()}
        if kind == "state":
            return {"type": "state", "data": session.state()}
        if kind == "close":
            return None
        return _error(f"Unknown message type: {kind}", "UNKNOWN_TYPE")
    except ValidationError as exc:
        return _error(f"Invalid message: {exc.errors()[0]['msg']} at {exc.errors()[0]['loc']}", "VALIDATION_ERROR")
    except AtroposError as exc:
        return _error(exc.text, "EXECUTION_ERROR")
    except Exception as exc:  # noqa: BLE001 - env code (items, eval split): the client gets it, the server stays up
        return _error(f"{type(exc).__name__}: {exc}", "EXECUTION_ERROR")


def create_openenv_app(
    exported: Exported,
    on_ready: Callable[[], None] | None = None,
    api_key: str | None = None,
    on_error: Callable[[AtroposError], None] | None = None,
    hosts: HostPolicy | None = None,
    limits: WsLimits | None = None,
) -> Any:
    """The FastAPI app serving `exported` (`limits`: its WebSocket sessions'). The env's `setup()` runs at
    startup (in the server's event loop); when
    it fails, `on_error` gets the error (the caller stops the server and reports it; without one it raises)."""
    import importlib.util

    if importlib.util.find_spec("websockets") is None and importlib.util.find_spec("wsproto") is None:
        raise ConfigError(
            "serving OpenEnv needs a WebSocket library for uvicorn (OpenEnv's clients play over /ws)",
            hint="pip install websockets (atropos depends on it: reinstall atropos)",
        )

    async def cleanup() -> None:
        http.close()
        await exported.env.server.aclose()

    lifespan = env_lifespan(exported, on_ready, on_error, cleanup)

    app = FastAPI(
        title=f"OpenEnv: {exported.env.name} (atropos export)", version=str(exported.env.version), lifespan=lifespan
    )
    http = Session(exported)
    http_lock = asyncio.Lock()

    def render(status: int, message: str, hint: str | None) -> JSONResponse:
        return JSONResponse({"detail": message, "hint": hint}, status_code=status)

    if api_key:
        hint = "send Authorization: Bearer KEY (openenv clients: headers=...; atropos: ATROPOS_OPENENV_API_KEY)"
        app.add_middleware(BearerAuth, api_key=api_key, render=render, hint=hint)
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, render=render)
    app.add_middleware(BrowserGuard, render=render, hosts=hosts or HostPolicy())
    sessions = WsSessions(limits)

    async def http_call(method: Any, data: dict[str, Any]) -> Any:
        async with http_lock:
            try:
                return dict((await method(data)).wire())
            except ValidationError as exc:
                raise HTTPException(422, detail=exc.errors(include_url=False)) from None
            except AtroposError as exc:
                return render(409 if isinstance(exc, EpisodeError) else 500, exc.text, exc.hint)
            except Exception as exc:  # noqa: BLE001 - env code: a 500 with its message, the server stays up
                return render(500, f"{type(exc).__name__}: {exc}", "see the env's code")

    @app.post("/reset")
    async def reset(body: dict[str, Any] | None = None) -> Any:
        return await http_call(http.reset, body or {})

    @app.post("/step")
    async def step(body: dict[str, Any]) -> Any:
        return await http_call(http.step, body.get("action") or {})

    @app.get("/state")
    async def state() -> dict[str, Any]:
        return http.state()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        env = exported.env
        return {"name": env.name, "description": exported.description, "version": env.version, "author": None}

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            "action": ExportAction.model_json_schema(),
            "observation": ExportObservation.model_json_schema(),
            "state": ExportState.model_json_schema(),
        }

    @app.post("/mcp")
    async def mcp(body: dict[str, Any]) -> dict[str, Any]:
        ident = body.get("id")
        if body.get("method") == "tools/list":
            return {"jsonrpc": "2.0", "id": ident, "result": {"tools": []}}
        return {"jsonrpc": "2.0", "id": ident, "error": {"code": -32601, "message": "this env has no MCP tools"}}

    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:  # Host, Origin and the key were checked on the handshake
        await sessions.admit(socket)
        session = Session(exported)
        try:
            while (raw := await sessions.receive(socket)) is not None:
                try:
                    message = json.loads(raw)
                except json.JSONDecodeError as exc:
                    await socket.send_text(json.dumps(_error(f"Invalid JSON: {exc}", "INVALID_JSON")))
                    continue
                answer = await _ws_answer(session, message)
                if answer is None:
                    break
                await socket.send_text(json.dumps(answer))
        except (WebSocketDisconnect, RuntimeError):  # the client left (or was evicted) mid-answer
            return
        finally:
            session.close()
            sessions.release(socket)
        with contextlib.suppress(WebSocketDisconnect, RuntimeError):  # the client may have gone first
            await socket.close()

    return app
