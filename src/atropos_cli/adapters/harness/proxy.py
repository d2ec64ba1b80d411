"""The recording proxy: an OpenAI-compatible endpoint per rollout session, in front of the policy's backend.

A harness (any program that speaks OpenAI's chat API) gets a base URL `http://HOST:PORT/s/SESSION/v1`; each
`POST .../chat/completions` is rendered to token ids by the policy's chat template (`session.SessionRecord`:
a call that continues an earlier one reuses its ids exactly), sampled by the backend as a completion of those
ids (`ServerManager.completion`: the local engine, vLLM/SGLang or any OpenAI-compatible server), and recorded:
prompt ids, completion ids, logprobs. The reply goes back in OpenAI's shape, with `tool_calls` parsed from the
model's text by the policy family's tool-call parser (`compat.tool_parsers`) when the request has `tools`;
`"stream": true` gets the same reply as server-sent events (one content chunk, then the finish).

Routes (errors in OpenAI's `{"error": {...}}` shape, real status codes):
- `POST /sessions` -> `{"id", "base_url"}`; `GET /sessions/ID` -> the session's report (calls, drift, rows);
  `DELETE /sessions/ID` -> the report, and the session is gone;
- `POST /s/ID/v1/chat/completions`, `GET /s/ID/v1/models`; `GET /health`.
Limits, as every server of ours: browser cross-site requests and foreign `Host`s refused (`httpguard`), a key
when given, a body over `max_body_mb` is a 413, at most `max_sessions` open sessions and `max_calls` calls
per session (429 past either), `n` other than 1 is a 400 (a session is one trajectory); connection limits come
from `httpserve` where the server is started.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
import uuid
from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from atropos_cli.adapters.harness.session import SessionRecord, clean_message
from atropos_cli.adapters.harness.settings import ProxySettings
from atropos_cli.compat.tool_parsers import get_parser
from atropos_cli.errors import BadRequestError, BadResponseError, InferenceError
from atropos_cli.httpguard import BearerAuth, BrowserGuard, HostPolicy
from atropos_cli.inference.openai_schema import ChatRequest, HTTPError, parse_request
from atropos_cli.inference.server import error_handlers, read_json, render_error
from atropos_cli.inference.sse import chat_events
from atropos_cli.types import Message

__all__ = ["Proxy", "create_proxy_app", "serve_in_loop"]


class Proxy:
    """The sessions and the backend they sample from (`server`: a `ServerManager`)."""

    def __init__(self, server: Any, tokenizer: Any, settings: ProxySettings | None = None) -> None:
        self.server, self.tokenizer = server, tokenizer
        self.settings = settings or ProxySettings()
        self.parser = get_parser(self.settings.tool_parser)
        self.sessions: dict[str, SessionRecord] = {}

    def open(self) -> str:
        if len(self.sessions) >= self.settings.max_sessions:
            raise HTTPError(
                429, f"{len(self.sessions)} sessions are open (the limit, --max-sessions): DELETE finished ones"
            )
        session_id = secrets.token_hex(16)  # the URL is the session's only handle: unguessable
        self.sessions[session_id] = SessionRecord(self.tokenizer)
        return session_id

    def get(self, session_id: str) -> SessionRecord:
        record = self.sessions.get(session_id)
        if record is None:
            raise HTTPError(404, f"no session {session_id!r} (it ended, or was never opened)", param="session")
        return record

    def close(self, session_id: str) -> SessionRecord:
        record = self.get(session_id)
        del self.sessions[session_id]
        return record

    def _sampling(self, req: ChatRequest) -> dict[str, Any]:
        settings = self.settings
        budget = min(req.budget or settings.max_tokens, settings.max_tokens)
        sampling: dict[str, Any] = {
            "n": 1, "max_tokens": budget, "stop": req.stop_list or None, "seed": req.seed, "logprobs": True,
            "temperature": req.temperature if settings.temperature is None else settings.temperature,
            "top_p": req.top_p if settings.top_p is None else settings.top_p,
        }  # fmt: skip
        return sampling

    def _reply(self, text: str, tools: list[dict[str, Any]] | None, tool_choice: Any) -> Message:
        if tools and tool_choice != "none":
            content, calls = self.parser.parse(text, tools)
            if calls:
                return {"role": "assistant", "content": content, "tool_calls": calls}
        return {"role": "assistant", "content": text}

    async def chat(self, session_id: str, req: ChatRequest) -> tuple[Message, str | None, dict[str, int]]:
        """One recorded call: (the reply message, its finish reason, usage)."""
        extras = req.model_extra or {}
        tools, tool_choice = _tools(extras.get("tools")), extras.get("tool_choice")
        if req.n != 1:
            raise HTTPError(400, f"n={req.n}: a session is one trajectory, so each call samples one reply", "n")
        if any(m.images() for m in req.messages):
            raise HTTPError(400, "the proxy records text chats; the request has image parts", "messages")
        messages = [clean_message(m.for_template()) for m in req.messages]
        record = self.get(session_id)
        async with record.lock:
            if record.calls >= self.settings.max_calls:
                raise HTTPError(429, f"the session made {record.calls} calls, the limit (--max-calls)")
            call = self._prepare(record, messages, tools)
            try:
                generation = await self.server.completion(prompt=call.prompt_ids, **self._sampling(req))
            except BaseException as exc:
                record.undo(call)
                if isinstance(exc, BadRequestError | BadResponseError):
                    raise HTTPError(400, f"the policy backend refused the call: {exc.text}") from None
                if isinstance(exc, InferenceError):
                    raise HTTPError(502, f"the policy backend failed: {exc.text}", kind="server_error") from None
                raise
            choice = generation.choices[0]
            reply = self._reply(choice.text, tools, tool_choice)
            record.record(call.segment, call.prompt_ids, generation.prompt_token_ids, choice, reply)
        finish = "tool_calls" if reply.get("tool_calls") else choice.finish_reason
        completion = len(choice.token_ids) if choice.token_ids is not None else generation.usage.completion_tokens
        usage = {"prompt_tokens": len(call.prompt_ids), "completion_tokens": completion}
        return reply, finish, {**usage, "total_tokens": usage["prompt_tokens"] + completion}

    def _prepare(self, record: SessionRecord, messages: list[Message], tools: list[dict[str, Any]] | None) -> Any:
        try:
            return record.prepare(messages, tools)
        except ValueError as exc:  # the chat template cannot bridge turns (it drops or repeats a reply)
            raise HTTPError(400, f"cannot render the chat with the policy's template: {exc}", "messages") from None


def _tools(value: Any) -> list[dict[str, Any]] | None:
    if value is None or value == []:
        return None
    if not isinstance(value, list) or not all(isinstance(t, dict) for t in value):
        raise HTTPError(400, "tools must be a list of tool objects ({'type': 'function', 'function': {...}})", "tools")
    return value


def _completion_body(model: str, reply: Message, finish: str | None, usage: dict[str, int]) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
        "model": model, "usage": usage,
        "choices": [{"index": 0, "message": reply, "finish_reason": finish, "logprobs": None}],
    }  # fmt: skip


def create_proxy_app(proxy: Proxy, api_key: str | None = None, hosts: HostPolicy | None = None) -> FastAPI:
    """The proxy's FastAPI app over `proxy`'s sessions."""
    app = FastAPI(title="atropos recording proxy")
    limit = int(proxy.settings.max_body_mb * 1024 * 1024)
    model = proxy.server.model_name
    if api_key:
        hint = "send 'Authorization: Bearer KEY' (harnesses: OPENAI_API_KEY=KEY)"
        app.add_middleware(BearerAuth, api_key=api_key, render=render_error, hint=hint)
    app.add_middleware(BrowserGuard, render=render_error, hosts=hosts or HostPolicy())
    error_handlers(app)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model, "sessions": len(proxy.sessions)}

    @app.post("/sessions")
    async def open_session(request: Request) -> dict[str, Any]:
        session_id = proxy.open()
        return {"id": session_id, "base_url": f"{str(request.base_url).rstrip('/')}/s/{session_id}/v1"}

    @app.get("/sessions/{session_id}")
    async def report(session_id: str) -> dict[str, Any]:
        return {"id": session_id, **proxy.get(session_id).report()}

    @app.delete("/sessions/{session_id}")
    async def close(session_id: str) -> dict[str, Any]:
        return {"id": session_id, **proxy.close(session_id).report()}

    @app.get("/s/{session_id}/v1/models")
    async def models(session_id: str) -> dict[str, Any]:
        proxy.get(session_id)
        card = {"id": model, "object": "model", "created": int(time.time()), "owned_by": "atropos"}
        return {"object": "list", "data": [card]}

    @app.post("/s/{session_id}/v1/chat/completions")
    async def chat(session_id: str, request: Request) -> Response:
        proxy.get(session_id)  # an unknown session is a 404 before the body is read
        req = parse_request(await read_json(request, limit), ChatRequest, strict=False)
        reply, finish, usage = await proxy.chat(session_id, req)
        body = _completion_body(model, reply, finish, usage)
        if req.stream:  # the same answer as server-sent events (inference/sse.py)
            usage_too = req.stream_options is not None and req.stream_options.include_usage
            return StreamingResponse(chat_events(body, usage_too), media_type="text/event-stream")
        return JSONResponse(body)

    return app


async def serve_in_loop(app: FastAPI, host: str = "127.0.0.1", limits: Any = None) -> tuple[Any, asyncio.Task, str]:
    """Start `app` on a free port of `host` in the running event loop: (uvicorn server, its task, base URL).
    Stop it with `server.should_exit = True` and await the task. The server leaves signals to the run that
    started it (uvicorn's own handlers would swap Ctrl-C's handler under the run, once per server)."""
    import uvicorn

    from atropos_cli.httpserve import listen, uvicorn_config

    class InLoop(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    sock = listen(host, 0)
    port = int(sock.getsockname()[1])
    config = uvicorn_config(app, limits, log_level="warning", access_log=False, lifespan="off")
    server = InLoop(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))
    deadline = time.monotonic() + 30
    while not server.started:
        if task.done() or time.monotonic() > deadline:
            sock.close()
            raise RuntimeError(f"the recording proxy did not start on {host}:{port}")
        await asyncio.sleep(0.005)
    return server, task, f"http://{host}:{port}"
