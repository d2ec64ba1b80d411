"""atroposlib.envs.server_handling.managed_server_proxy: the ManagedServer proxy of Atropos' main, an
OpenAI-compatible HTTP front over ManagedServer sessions, so env code outside this process (microservices,
agents that only speak the OpenAI API) drives multi-turn rollouts whose tokens and logprobs are tracked.

Routes (errors as OpenAI's `{"error": {"message", "type", "code"}}`):
- `POST /sessions/create` `{"tool_parser": "hermes", "track_tree": false, "base_url": null}` -> `{uuid,
  model_name, tool_parser, base_url, created_at}`: one ManagedServer pinned to the server at `base_url`
  (404 naming the known ones) or the freest; an OpenAI endpoint gets DummyManagedServer (placeholder tokens);
  an unknown parser is a 400 naming the known ones. `GET /sessions` lists them.
- `POST /{uuid}/v1/chat/completions` (messages, n, max_tokens, temperature, stop, tools, tool_choice): the
  session's ManagedServer answers; tool calls come back as `tool_calls` (tool_call_translator).
  `POST /{uuid}/v1/chat/completions/render`: the prompt text and token ids it would send.
- `GET /{uuid}/nodes`: the tracked SequenceNodes; `DELETE /{uuid}` ends the session.
- `GET /health`, `GET /v1/models`, `GET /servers`, `POST /setup` (`{"model_name", "servers": [...]}`
  replaces the backends).
Like every server here it refuses browser cross-site requests and, given `api_key`, requests without it.
One session is one rollout: concurrent requests to one uuid confuse its prefix matching (as in Atropos).
`python -m atropos_cli.compat.atroposlib.envs.server_handling.managed_server_proxy --config servers.json
--port 9100` runs it standalone (127.0.0.1 unless --host).
"""

from __future__ import annotations

import argparse
import json
import time
import uuid as uuid_lib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from atropos_cli.compat.atroposlib.envs.server_handling.managed_server import DummyManagedServer, ManagedServer
from atropos_cli.compat.atroposlib.envs.server_handling.openai_server import OpenAIServer
from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import APIServerConfig
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import ServerManager
from atropos_cli.compat.atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atropos_cli.errors import AtroposError

__all__ = ["create_app", "openai_error", "ChatCompletionProxyRequest", "SessionCreateRequest", "main"]


class ChatMessage(BaseModel):
    role: str
    content: str | list[dict[str, Any]] | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class ChatCompletionProxyRequest(BaseModel):
    messages: list[ChatMessage]
    max_tokens: int = 1024
    temperature: float = 1.0
    n: int = 1
    stop: str | list[str] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: Any = None


class SessionCreateRequest(BaseModel):
    tool_parser: str = "hermes"
    track_tree: bool = False
    base_url: str | None = None


class SessionCreateResponse(BaseModel):
    uuid: str
    model_name: str
    tool_parser: str
    base_url: str | None = None
    created_at: float


class RenderResponse(BaseModel):
    prompt_text: str
    token_ids: list[int]
    num_tokens: int


@dataclass
class SessionState:
    uuid: str
    managed_server: ManagedServer
    translator: ToolCallTranslator
    model_name: str
    base_url: str | None = None
    created_at: float = field(default_factory=time.time)
    last_accessed: float = field(default_factory=time.time)


def openai_error(status_code: int, message: str, error_type: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(
        status_code=status_code, content={"error": {"message": message, "type": error_type, "code": status_code}}
    )


def _url(server: Any) -> str | None:
    return getattr(getattr(server, "config", None), "base_url", None)


def _select(manager: ServerManager, base_url: str | None) -> Any:
    if base_url is not None:
        for server in manager.servers:
            if (_url(server) or "").rstrip("/") == base_url.rstrip("/"):
                return server
        known = [u for u in map(_url, manager.servers) if u]
        raise HTTPException(status_code=404, detail=f"No server with base_url '{base_url}'. Available: {known}")
    healthy = [s for s in manager.servers if s.server_healthy] or manager.servers
    return max(healthy, key=lambda s: s.sem._value)


def _guard(app: FastAPI, api_key: str | None) -> None:
    from atropos_cli.httpguard import BearerAuth, BrowserGuard

    def render(status: int, message: str, hint: str | None) -> Any:
        return openai_error(status, message + (f" ({hint})" if hint else ""))

    if api_key:
        app.add_middleware(BearerAuth, api_key=api_key, render=render, hint="send Authorization: Bearer <key>")
    app.add_middleware(BrowserGuard, render=render)


def create_app(
    server_manager: ServerManager, tokenizer: Any, model_name: str = "unknown", api_key: str | None = None
) -> FastAPI:
    """The proxy app over `server_manager`'s servers (sessions live in the app)."""
    app = FastAPI(title="ManagedServer OpenAI Proxy")
    sessions: dict[str, SessionState] = {}
    _guard(app, api_key)

    def session_of(session_uuid: str) -> SessionState:
        session = sessions.get(session_uuid)
        if session is None:
            raise HTTPException(status_code=404, detail=f"Session {session_uuid} not found")
        session.last_accessed = time.time()
        return session

    @app.exception_handler(HTTPException)
    async def http_error(request: Any, exc: HTTPException) -> JSONResponse:
        return openai_error(exc.status_code, str(exc.detail))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "sessions": len(sessions), "servers": len(server_manager.servers)}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": int(time.time()), "owned_by": "atropos"}
        return {"object": "list", "data": [card]}

    @app.get("/servers")
    async def servers() -> dict[str, Any]:
        return {
            "servers": [
                {
                    "index": i,
                    "base_url": _url(s),
                    "healthy": getattr(s, "server_healthy", True),
                    "model_name": getattr(getattr(s, "config", None), "model_name", model_name),
                    "server_type": getattr(getattr(s, "config", None), "server_type", "unknown"),
                }
                for i, s in enumerate(server_manager.servers)
            ]
        }

    @app.post("/setup")
    async def setup(config: dict[str, Any]) -> dict[str, Any]:
        nonlocal model_name
        model_name = config.get("model_name", model_name)
        configs = [_server_config(entry, model_name, config) for entry in config.get("servers", [])]
        if configs:
            server_manager.servers = ServerManager(configs=configs).servers
        return {"status": "ok", "servers": len(server_manager.servers), "model_name": model_name}

    @app.post("/sessions/create", response_model=SessionCreateResponse)
    async def create_session(request: SessionCreateRequest) -> Any:
        server = _select(server_manager, request.base_url)
        try:
            translator = ToolCallTranslator(tokenizer=tokenizer, parser_name=request.tool_parser)
        except AtroposError as exc:
            return openai_error(400, f"{exc.message} ({exc.hint})")
        kind = DummyManagedServer if isinstance(server, OpenAIServer) else ManagedServer
        managed = kind(
            server=server, tokenizer=tokenizer, track_tree=request.track_tree, tool_parser=request.tool_parser
        )
        session = SessionState(str(uuid_lib.uuid4()), managed, translator, model_name, _url(server))
        sessions[session.uuid] = session
        return SessionCreateResponse(
            uuid=session.uuid,
            model_name=model_name,
            tool_parser=request.tool_parser,
            base_url=session.base_url,
            created_at=session.created_at,
        )

    @app.get("/sessions")
    async def list_sessions() -> dict[str, Any]:
        return {"sessions": [_session_row(s) for s in sessions.values()]}

    @app.post("/{session_uuid}/v1/chat/completions")
    async def chat_completions(session_uuid: str, request: ChatCompletionProxyRequest) -> Any:
        session = session_of(session_uuid)
        if not request.messages:
            return openai_error(400, "messages must not be empty")
        kwargs = _completion_kwargs(request)
        try:
            result = await session.managed_server.chat_completion(**kwargs)
        except Exception as exc:  # the backend's error goes back to the caller in OpenAI's shape
            return openai_error(500, f"Completion failed: {exc}", error_type="server_error")
        body = result.model_dump(exclude_none=True)
        body.update(id=f"chatcmpl-{uuid_lib.uuid4().hex}", created=int(time.time()), model=model_name)
        return body

    @app.post("/{session_uuid}/v1/chat/completions/render")
    async def render(session_uuid: str, request: ChatCompletionProxyRequest) -> Any:
        session = session_of(session_uuid)
        messages = [m.model_dump(exclude_none=True) for m in request.messages]
        try:
            prompt = session.managed_server._render(messages, request.tools)
        except Exception as exc:
            return openai_error(400, f"Failed to render prompt: {exc}")
        ids = list(tokenizer.encode(prompt, add_special_tokens=False)) if tokenizer is not None else []
        return RenderResponse(prompt_text=prompt, token_ids=ids, num_tokens=len(ids))

    @app.get("/{session_uuid}/nodes")
    async def nodes(session_uuid: str) -> dict[str, Any]:
        managed = session_of(session_uuid).managed_server
        state = managed.get_state()
        found = list(state.get("sequences", {}).values()) if managed.track_tree else state.get("nodes", [])
        return {"nodes": [node.model_dump() for node in found]}

    @app.delete("/{session_uuid}")
    async def delete(session_uuid: str) -> dict[str, Any]:
        session = sessions.pop(session_uuid, None)
        if session is None:
            raise HTTPException(status_code=404, detail=f"Session {session_uuid} not found")
        session.managed_server.reset()
        return {"status": "deleted", "uuid": session_uuid}

    return app


def _server_config(entry: dict[str, Any], model_name: str, config: dict[str, Any]) -> APIServerConfig:
    return APIServerConfig(
        model_name=model_name,
        base_url=entry["base_url"],
        api_key=entry.get("api_key", ""),
        server_type=entry.get("server_type", "vllm"),
        num_max_requests_at_once=entry.get("num_max_requests_at_once", 512),
        num_requests_for_eval=entry.get("num_requests_for_eval", 64),
        timeout=entry.get("timeout", 1200),
        tokenizer_name=config.get("tokenizer_name", "none"),
    )


def _session_row(session: SessionState) -> dict[str, Any]:
    managed = session.managed_server
    return {
        "uuid": session.uuid,
        "model_name": session.model_name,
        "base_url": session.base_url,
        "created_at": session.created_at,
        "last_accessed": session.last_accessed,
        "num_nodes": len(managed.sequences if managed.track_tree else managed.current_nodes),
    }


def _completion_kwargs(request: ChatCompletionProxyRequest) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "messages": [m.model_dump(exclude_none=True) for m in request.messages],
        "n": request.n,
        "max_tokens": request.max_tokens,
        "temperature": request.temperature,
    }
    if request.stop:
        kwargs["stop"] = request.stop
    if request.tools:
        kwargs["tools"] = request.tools
    if request.tool_choice is not None:
        kwargs["tool_choice"] = request.tool_choice
    return kwargs


def main(argv: list[str] | None = None) -> None:
    """`--config servers.json` (`{"model_name", "tokenizer_name"?, "servers": [{"base_url", "server_type"}]}`)."""
    parser = argparse.ArgumentParser(description="ManagedServer OpenAI proxy")
    parser.add_argument("--config", required=True, help="JSON: model_name, tokenizer_name, servers")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--api-key", default=None, help="require Authorization: Bearer KEY")
    args = parser.parse_args(argv)
    try:
        config = json.loads(Path(args.config).read_text())
        model_name = config["model_name"]
        configs = [_server_config(entry, model_name, config) for entry in config["servers"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"error: cannot read {args.config}: {exc}\nhint: see this module's docstring") from None
    from atropos_cli.inference.tokenizer import load_tokenizer

    try:
        tokenizer = load_tokenizer(config.get("tokenizer_name") or model_name)
        app = create_app(ServerManager(configs), tokenizer, model_name, api_key=args.api_key)
    except AtroposError as exc:
        raise SystemExit(f"error: {exc.message}" + (f"\nhint: {exc.hint}" if exc.hint else "")) from None
    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
