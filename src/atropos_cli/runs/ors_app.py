"""The Open Reward Standard server of `atropos export ors ENV`: ORS' HTTP + server-sent-event routes over
`Exported` (runs/openenv_export: the env played one rollout per episode, its model requests handed to the client).

How the env maps onto ORS (what the `openreward` SDK's client, `AsyncOpenReward().environments.get(NAME,
base_url=URL)`, drives):
- one env, named after ours (`GET /list_environments`); splits `train` (the env's train stream, its first
  `train_tasks` items) and `eval` (type test: the env's eval split, when it has one); task k of a split is
  `{"split", "index": k, "item_id"}` (`/tasks`, `/num_tasks`, `/task`, `/task_range`);
- a session (`/create_session`, then `/create` with a split and index, or a task spec of ours) starts the env's
  rollout on that item; its first model request is the task's prompt (`/messages`: the chat, `/prompt`: its
  blocks);
- the env has one tool, `reply`, its `@terminal` tool (`/tools`: no other tool, `terminal_tool` reply with
  argument `message`): the model's plain message is the reply. The call answers with the env's next request as
  text blocks (reward 0, not finished: a multi-turn env goes on), or, once the env scored the rollout, with
  reward = the rollout's score, `finished`, and `metadata.reward_parts`. A rollout the env fails is the call's
  SSE `error` event (the SDK raises ToolFailed); a call after the end is refused (`episode_finished`).
Each route is served bare (`/call`) and under the env's name (`/{env}/call`), as ORS clients ask for either.

Guarded like our other servers (`httpguard`: a foreign Host, cross-site browser requests and non-JSON bodies
refused; with an API key every request needs `X-API-Key: KEY` (what ORS clients send) or `Authorization:
Bearer KEY`; bodies over `MAX_BODY_BYTES` get 413). Sessions are held to `httpserve.SessionLimits`: at most
`max_sessions` (a new one ends the idlest), and a session idle for `session_idle_s` is ended.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, Field

from atropos_cli.env.multiturn import chat_added
from atropos_cli.errors import AtroposError
from atropos_cli.httpguard import BearerAuth, BodyLimit, BrowserGuard, HostPolicy
from atropos_cli.httpserve import SessionLimits
from atropos_cli.runs.openenv_export import Episode, EpisodeError, Exported, Observation, env_lifespan
from atropos_cli.runs.ors_tasks import OrsTasks
from atropos_cli.types import Message

__all__ = ["create_ors_app", "MAX_BODY_BYTES", "REPLY_TOOL"]

MAX_BODY_BYTES = 1_048_576
REPLY_TOOL = "reply"
PING_S = 10.0  # an SSE comment this often while a call runs (ORS clients drop a stream silent for 30 s)


class CreateBody(BaseModel):
    env_name: str | None = None
    task_spec: dict[str, Any] | None = None
    split: str | None = None
    index: int | None = Field(None, ge=0)
    toolset_name: str | None = None


class CallBody(BaseModel):
    name: str
    input: dict[str, Any] = Field(default_factory=dict)
    task_id: str | None = None


@dataclass
class Session:
    episode: Episode
    chat: list[Message]
    finished: bool = False
    used: float = field(default_factory=time.monotonic)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # calls of one session run one at a time (as ORS')


def _chat(observation: Observation) -> list[Message]:
    """The env's request as a chat (a completion-style request: its prompt as one user message)."""
    return list(observation.messages) or [{"role": "user", "content": observation.prompt}]


def _blocks(text: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": text}]


def _text(messages: list[Message]) -> str:
    return "\n\n".join(str(m["content"]) for m in messages)


def _prompt_blocks(chat: list[Message]) -> list[dict[str, Any]]:
    """The chat as prompt blocks: one user message is its text; more get a `[role]` block before each."""
    if len(chat) == 1 and chat[0]["role"] == "user":
        return _blocks(str(chat[0]["content"]))
    blocks: list[dict[str, Any]] = []
    for message in chat:
        blocks += [{"type": "text", "text": f"[{message['role']}]"}, *_blocks(str(message["content"]))]
    return blocks


def _sse(event: str, data: str) -> str:
    return f"event: {event}\n" + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


def _run_tool_output(reward: float, finished: bool, text: str, metadata: dict[str, Any]) -> str:
    output = {"blocks": _blocks(text) if text else [], "metadata": metadata, "reward": reward, "finished": finished}
    return json.dumps({"ok": True, "output": output})


def _refused(reason: str, error: str) -> str:
    return json.dumps({"ok": False, "error": error, "reason": reason})


class Sessions:
    """The open sessions, at most `limits.max_sessions` (a new one ends the idlest), idle ones reaped."""

    def __init__(self, limits: SessionLimits) -> None:
        self.limits = limits
        self.open: dict[str, Session] = {}

    def get(self, sid: str | None) -> Session:
        self.reap()
        session = self.open.get(sid or "")
        if session is None:
            raise HTTPException(404, "Active environment not found")
        session.used = time.monotonic()
        return session

    def add(self, sid: str, session: Session) -> None:
        self.reap()
        while len(self.open) >= self.limits.max_sessions:
            self.end(min(self.open, key=lambda k: self.open[k].used))
        self.open[sid] = session

    def end(self, sid: str) -> None:
        session = self.open.pop(sid, None)
        if session is not None:
            session.episode.cancel()

    def reap(self) -> None:
        now = time.monotonic()
        for sid in [k for k, s in self.open.items() if now - s.used > self.limits.session_idle_s]:
            self.end(sid)


def create_ors_app(
    exported: Exported,
    on_ready: Callable[[], None] | None = None,
    api_key: str | None = None,
    on_error: Callable[[AtroposError], None] | None = None,
    hosts: HostPolicy | None = None,
    limits: SessionLimits | None = None,
    tasks: OrsTasks | None = None,
) -> Any:
    """The FastAPI app serving `exported` over ORS (`tasks`: the train split's size). The env's `setup()`
    runs at startup; when it fails, `on_error` gets the error (the caller stops the server and reports it;
    without one it raises)."""

    sessions = Sessions(limits or SessionLimits())
    train_tasks = (tasks or OrsTasks()).train_tasks
    env_name = "".join(c if c.isalnum() or c in "-_." else "_" for c in exported.env.name).lower() or "env"

    async def cleanup() -> None:
        for sid in list(sessions.open):
            sessions.end(sid)
        await exported.env.server.aclose()

    lifespan = env_lifespan(exported, on_ready, on_error, cleanup)

    title = f"ORS: {exported.env.name} (atropos export)"
    app = FastAPI(title=title, version=str(exported.env.version), lifespan=lifespan)

    def render(status: int, message: str, hint: str | None) -> JSONResponse:
        return JSONResponse({"detail": message, "hint": hint}, status_code=status)

    if api_key:
        hint = "send X-API-Key: KEY (ORS clients: OPENREWARD_API_KEY) or Authorization: Bearer KEY"
        app.add_middleware(BearerAuth, api_key=api_key, render=render, hint=hint, key_header=b"x-api-key")
    app.add_middleware(BodyLimit, max_bytes=MAX_BODY_BYTES, render=render)
    app.add_middleware(BrowserGuard, render=render, hosts=hosts or HostPolicy())

    @app.exception_handler(AtroposError)
    async def atropos_error(_: Request, exc: AtroposError) -> JSONResponse:
        return render(409 if isinstance(exc, EpisodeError) else 500, exc.text, exc.hint)

    def route(method: str, suffix: str) -> Callable[[Callable[..., Awaitable[Any]]], Any]:
        """Serve a handler at `/suffix` and at `/{env}/suffix` (any other env name is a 404)."""

        def register(handler: Callable[..., Awaitable[Any]]) -> Any:
            async def named(env: str, request: Request) -> Any:
                if env.lower() != env_name:
                    raise HTTPException(404, f"unknown environment {env!r}")
                return await handler(request)

            async def bare(request: Request) -> Any:
                return await handler(request)

            app.add_api_route(suffix, bare, methods=[method])
            app.add_api_route("/{env}" + suffix, named, methods=[method])
            return handler

        return register

    async def body(request: Request, model: type[BaseModel]) -> Any:
        try:
            return model.model_validate(await request.json())
        except (ValueError, TypeError) as exc:
            raise HTTPException(422, f"invalid request body: {str(exc)[:300]}") from None

    def split_of(name: str) -> str:
        if name == "train" or (name == "eval" and exported.has_eval()):
            return name
        raise HTTPException(400, "Invalid split")

    async def task(split: str, index: int) -> dict[str, Any]:
        if index >= await exported.count(split, train_tasks):
            raise HTTPException(400, "Invalid index")
        _, item = await exported.item(index, split)
        return {"split": split, "index": index, "item_id": exported.env.item_id(item)}

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/version")
    async def version() -> dict[str, Any]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            ours = version("atropos")
        except PackageNotFoundError:  # a checkout run without installing it
            ours = None
        return {"version": ours, "build_sha": None}

    @app.get("/list_environments")
    async def list_environments() -> list[str]:
        return [env_name]

    @app.post("/create_session")
    async def create_session() -> StreamingResponse:
        sid = uuid.uuid4().hex

        async def stream() -> AsyncIterator[str]:
            yield _sse("task_id", sid)
            yield _sse("end", "")

        return StreamingResponse(stream(), media_type="text/event-stream")

    @app.post("/delete_session")
    async def delete_session(request: Request) -> dict[str, Any]:
        return {"sid": request.headers.get("x-session-id")}

    @app.post("/ping")
    async def ping(request: Request) -> dict[str, str]:
        sessions.get(request.headers.get("x-session-id"))
        return {"status": "ok"}

    @app.post("/create")
    async def create(request: Request) -> dict[str, Any]:
        sid = request.headers.get("x-session-id")
        if not sid:
            raise HTTPException(400, "X-Session-ID header is required")
        if sid in sessions.open:
            raise HTTPException(400, "Session already exists")
        spec: CreateBody = await body(request, CreateBody)
        where = spec.task_spec or {"split": spec.split, "index": spec.index}
        if not isinstance(where.get("split"), str) or not isinstance(where.get("index"), int):
            raise HTTPException(422, "give split and index, or a task spec of this env (from /tasks)")
        split = split_of(where["split"])
        await task(split, where["index"])
        episode = await exported.episode(where["index"], split)
        first = await episode.start()
        sessions.add(sid, Session(episode, _chat(first), first.done))
        return {"sid": sid}

    @app.post("/delete")
    async def delete(request: Request) -> dict[str, Any]:
        sid = request.headers.get("x-session-id") or ""
        sessions.end(sid)
        return {"sid": sid}

    @route("GET", "/tools")
    async def tools(request: Request) -> dict[str, Any]:
        terminal = {"name": REPLY_TOOL, "arg": "message", "description": "Your reply to the last message."}
        return {"tools": [], "terminal_tool": terminal, "supports_score_group": False, "message_block_types": ["text"]}

    @route("GET", "/task_tools")
    async def task_tools(request: Request) -> dict[str, Any]:
        sessions.get(request.headers.get("x-session-id"))
        return await tools(request)  # type: ignore[no-any-return]

    @route("GET", "/splits")
    async def splits(request: Request) -> list[dict[str, str]]:
        listed = [{"name": "train", "type": "train"}]
        return listed + ([{"name": "eval", "type": "test"}] if exported.has_eval() else [])

    @route("POST", "/num_tasks")
    async def num_tasks(request: Request) -> dict[str, Any]:
        split = split_of((await request.json() or {}).get("split", ""))
        return {"num_tasks": await exported.count(split, train_tasks)}

    @route("POST", "/task")
    async def get_task(request: Request) -> dict[str, Any]:
        asked = await request.json() or {}
        index = asked.get("index")
        if not isinstance(index, int) or index < 0:
            raise HTTPException(400, "Invalid index")
        return {"task": await task(split_of(asked.get("split", "")), index), "env_name": env_name}

    async def task_list(split: str, start: int | None, stop: int | None) -> dict[str, Any]:
        total = await exported.count(split, train_tasks)
        indices = range(total)[slice(start, stop)]
        return {"tasks": [await task(split, k) for k in indices], "env_name": env_name}

    @route("POST", "/tasks")
    async def list_tasks(request: Request) -> dict[str, Any]:
        return await task_list(split_of((await request.json() or {}).get("split", "")), None, None)

    @route("POST", "/task_range")
    async def task_range(request: Request) -> dict[str, Any]:
        asked = await request.json() or {}
        return await task_list(split_of(asked.get("split", "")), asked.get("start"), asked.get("stop"))

    @route("GET", "/prompt")
    async def prompt(request: Request) -> list[dict[str, Any]]:
        return _prompt_blocks(sessions.get(request.headers.get("x-session-id")).chat)

    @route("GET", "/messages")
    async def messages(request: Request) -> list[dict[str, Any]]:
        chat = sessions.get(request.headers.get("x-session-id")).chat
        roles = ("system", "user", "assistant")
        return [
            {"role": m["role"] if m["role"] in roles else "user", "blocks": _blocks(str(m["content"])), "detail": None}
            for m in chat
        ]

    @route("POST", "/score_group")
    async def score_group(request: Request) -> Any:
        raise HTTPException(404, f"Environment {env_name!r} does not implement score_group")

    @route("POST", "/call")
    async def call(request: Request) -> StreamingResponse:
        session = sessions.get(request.headers.get("x-session-id"))
        asked: CallBody = await body(request, CallBody)
        task_id = uuid.uuid4().hex

        async def stream() -> AsyncIterator[str]:
            yield _sse("task_id", task_id)
            running = asyncio.ensure_future(_call(session, asked))
            while True:
                done, _ = await asyncio.wait({running}, timeout=PING_S)
                if done:
                    break
                yield ": ping\n\n"
            try:
                yield _sse("end", running.result())
            except AtroposError as exc:
                yield _sse("error", exc.text)
            except Exception as exc:  # noqa: BLE001 - the env's code: the client gets it, the server stays up
                yield _sse("error", f"{type(exc).__name__}: {exc}")

        return StreamingResponse(stream(), media_type="text/event-stream")

    return app


async def _call(session: Session, asked: CallBody) -> str:
    """One tool call: the reply steps the episode; the answer is ORS' RunToolOutput as JSON."""
    async with session.lock:
        return await _step(session, asked)


async def _step(session: Session, asked: CallBody) -> str:
    if asked.name != REPLY_TOOL:
        return _refused("not_found", f"{asked.name!r} is not a valid tool")
    message = asked.input.get("message")
    if not isinstance(message, str) or set(asked.input) != {"message"}:
        return _refused("input_validation", "Tool input validation error: reply takes {'message': str}")
    if session.finished:
        return _refused("episode_finished", f"{REPLY_TOOL!r} was not run: the episode has finished")
    try:
        observation: Observation = await session.episode.step(message)
    except EpisodeError:
        session.finished = True
        raise
    before = [*session.chat, {"role": "assistant", "content": message}]
    metadata = dict(observation.metadata)
    if observation.done:
        session.chat = list(observation.messages) or before
        session.finished = True
        return _run_tool_output(float(observation.reward or 0.0), True, "", metadata)
    session.chat = _chat(observation)
    return _run_tool_output(0.0, False, _text(chat_added(before, session.chat)), metadata)
