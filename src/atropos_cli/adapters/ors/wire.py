"""The Open Reward Standard (ORS) wire protocol, client side: an env server's splits, tasks and sessions.

ORS (the `openreward` SDK's `Server`, and the hosted envs) is plain HTTP plus server-sent events:

- `GET /list_environments` names the server's envs (the first is its default); per env `GET /{env}/splits`
  (`[{"name", "type"}]`), `POST /{env}/num_tasks` and `POST /{env}/task` (`{"split", "index"}`);
- a session: `POST /create_session` (an SSE stream whose `task_id` event is the session id), then
  `POST /create` with header `X-Session-ID` and `{"env_name", "split", "index"}`; `GET /{env}/messages` (the
  task's prompt as role-tagged messages of blocks; older servers: `GET /{env}/prompt`, the blocks alone);
  `GET /{env}/task_tools` (the tools, and the `terminal_tool` that takes a plain assistant message);
  `POST /{env}/call` with `{"name", "input"}` (an SSE stream: `task_id`, then `chunk`s and an `end` whose data
  joined is `{"ok": true, "output": {"blocks", "metadata", "reward", "finished"}}` or `{"ok": false, "error",
  "reason"}`; an `error` event when the tool raised); `POST /delete` and `POST /delete_session` end it.

This module speaks it with httpx (no openreward import), each call held to a total deadline and a size cap
(`httpclient.bounded_send`), no redirect followed; a session whose env is still setting up (503 with
`X-Backend-State: starting`) is asked again after its `Retry-After`, within the same deadline. A server that
answers wrongly is one `OrsError` (the rollout's failure record). `OPENREWARD_API_KEY`, when set, is sent as
`X-API-Key` (what the hosted envs and `atropos export ors --api-key` ask for); `--env.deployment` as
`X-Deployment`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
from dataclasses import dataclass, field
from typing import Any

from atropos_cli.errors import AtroposError, EnvLoadError

__all__ = ["OrsClient", "OrsError", "OrsSession", "ToolResult", "Tools", "blocks_text", "API_KEY_VAR"]

API_KEY_VAR = "OPENREWARD_API_KEY"
MAX_REPLY_BYTES = 8 * 2**20  # largest reply (a prompt, a tool result) accepted from the env server


class OrsError(AtroposError):
    """The ORS server answered with an error, or with something that is not ORS."""


@dataclass
class Tools:
    """A session's tools: OpenAI-style specs the model may call, and the terminal tool (name, argument)."""

    specs: list[dict[str, Any]]
    terminal: tuple[str, str | None] | None


@dataclass
class ToolResult:
    text: str
    reward: float | None
    finished: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # the server refused the call (unknown tool, bad input): the model sees this


def blocks_text(blocks: Any) -> str:
    """The text of ORS content blocks (text blocks joined; an image is named, its data left out)."""
    if not isinstance(blocks, list):
        raise OrsError(f"expected a list of content blocks, got {str(blocks)[:200]}", hint="is this an ORS server?")
    parts = []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "image":
            parts.append(f"[image {block.get('mimeType', '')}]")
        elif kind == "tool_result":
            parts.append(blocks_text(block.get("blocks") or []))
    return "\n".join(parts)


def parse_sse(body: str) -> list[tuple[str, str]]:
    """The (event, data) pairs of a server-sent-events body (comments, such as keep-alive pings, skipped)."""
    events: list[tuple[str, str]] = []
    event: str | None = None
    data: list[str] = []
    for line in body.splitlines():
        if not line:
            if event is not None:
                events.append((event, "\n".join(data)))
            event, data = None, []
        elif not line.startswith(":") and ":" in line:
            name, value = line.split(":", 1)
            value = value[1:] if value.startswith(" ") else value
            if name == "event":
                event = value
            elif name == "data":
                data.append(value)
    if event is not None:
        events.append((event, "\n".join(data)))
    return events


class OrsClient:
    """The HTTP side of one ORS server (`await client.aclose()` when done)."""

    def __init__(self, base_url: str, timeout_s: float, deployment: str | None = None) -> None:
        import httpx

        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.env_name = ""
        self.headers = {"Accept": "application/json"}
        if os.environ.get(API_KEY_VAR):
            self.headers["X-API-Key"] = os.environ[API_KEY_VAR]
        if deployment:
            self.headers["X-Deployment"] = deployment
        self._http = httpx.AsyncClient(follow_redirects=False, timeout=httpx.Timeout(min(timeout_s, 30.0)))

    async def aclose(self) -> None:
        await self._http.aclose()

    def path(self, suffix: str) -> str:
        return f"/{self.env_name}{suffix}"

    async def call(
        self, method: str, path: str, body: Any = None, sid: str | None = None, sse: bool = False, events: bool = False
    ) -> Any:
        """One request's JSON answer (an SSE stream's joined `end` data, or with `events` its (event, data)
        pairs); OrsError for anything else."""
        import httpx

        from atropos_cli.httpclient import ReplyTooLarge, bounded_send

        headers = dict(self.headers, **({"X-Session-ID": sid} if sid else {}))
        if sse:
            headers["Accept"] = "text/event-stream"
        url = self.base_url + path
        deadline = time.monotonic() + self.timeout_s
        for attempt in itertools.count():
            try:
                response = await bounded_send(
                    self._http, method, url, self.timeout_s, MAX_REPLY_BYTES, headers=headers, json=body
                )
            except httpx.ReadTimeout:
                raise OrsError(
                    f"{method} {path}: no whole answer within {self.timeout_s:g}s", hint="raise --env.timeout_s"
                ) from None
            except (httpx.HTTPError, ReplyTooLarge) as exc:
                hint = "is the ORS server running?"
                raise OrsError(f"{method} {url}: {type(exc).__name__}: {exc}", hint=hint) from None
            wait = _starting_wait(response, attempt)
            if wait is None or time.monotonic() + wait > deadline:
                break
            await asyncio.sleep(wait)  # the session's env is still setting up (a sandbox starting): ask again
        if response.status_code >= 300:
            raise OrsError(
                f"{method} {path} answered {response.status_code}: {_detail(response.text)}",
                hint=_status_hint(response.status_code),
            )
        if events:
            return parse_sse(response.text)
        return _sse_result(response.text, path) if sse else _json(response.text, path)

    async def environments(self) -> list[str]:
        names = await self.call("GET", "/list_environments")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise OrsError(f"/list_environments answered {str(names)[:200]}", hint="is this an ORS server?")
        return names

    async def splits(self) -> list[dict[str, str]]:
        splits = await self.call("GET", self.path("/splits"))
        if not isinstance(splits, list) or not all(isinstance(s, dict) and "name" in s for s in splits):
            raise OrsError(f"/splits answered {str(splits)[:200]}", hint="is this an ORS server?")
        return splits

    async def num_tasks(self, split: str) -> int:
        return int((await self.call("POST", self.path("/num_tasks"), {"split": split}))["num_tasks"])

    async def task(self, split: str, index: int) -> Any:
        return (await self.call("POST", self.path("/task"), {"split": split, "index": index})).get("task")


class OrsSession:
    """One task's session (`async with OrsSession(client, split, index) as s: await s.messages()`)."""

    def __init__(self, client: OrsClient, split: str, index: int) -> None:
        self.client, self.split, self.index = client, split, index
        self.sid: str | None = None

    async def __aenter__(self) -> OrsSession:
        events = await self.client.call("POST", "/create_session", {}, sse=True, events=True)
        ids = [data.strip() for event, data in events if event == "task_id"]
        if not ids or not ids[0]:
            raise OrsError("POST /create_session sent no session id", hint="is this an ORS server?")
        self.sid = ids[0]
        body = {"env_name": self.client.env_name, "split": self.split, "index": self.index}
        try:
            await self.client.call("POST", "/create", body, sid=self.sid)
        except BaseException:
            await self.__aexit__()  # the id the server handed out is given back
            raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        for path in ("/delete", "/delete_session"):
            with contextlib.suppress(OrsError):  # a session the server already dropped needs no more ending
                await self.client.call("POST", path, None, sid=self.sid)

    async def messages(self) -> list[dict[str, str]]:
        """The task's prompt as chat messages (`/messages`; a server without it: `/prompt` as one user turn)."""
        try:
            raw = await self.client.call("GET", self.client.path("/messages"), sid=self.sid)
        except OrsError as exc:
            if "answered 404" not in exc.text:
                raise
            prompt = await self.client.call("GET", self.client.path("/prompt"), sid=self.sid)
            return [{"role": "user", "content": blocks_text(prompt)}]
        if not isinstance(raw, list):
            raise OrsError(f"/messages answered {str(raw)[:200]}", hint="is this an ORS server?")
        return [{"role": str(m.get("role")), "content": blocks_text(m.get("blocks"))} for m in raw]

    async def tools(self) -> Tools:
        raw = await self.client.call("GET", self.client.path("/task_tools"), sid=self.sid)
        if not isinstance(raw, dict) or not isinstance(raw.get("tools"), list):
            raise OrsError(f"/task_tools answered {str(raw)[:200]}", hint="is this an ORS server?")
        specs = [
            {"name": t["name"], "description": t.get("description") or "", "parameters": t.get("input_schema") or {}}
            for t in raw["tools"]
        ]
        terminal = raw.get("terminal_tool")
        return Tools(specs, (terminal["name"], terminal.get("arg")) if isinstance(terminal, dict) else None)

    async def call_tool(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        answer = await self.client.call(
            "POST", self.client.path("/call"), {"name": name, "input": arguments}, sid=self.sid, sse=True
        )
        if not isinstance(answer, dict) or "ok" not in answer:
            raise OrsError(f"/call answered {str(answer)[:200]}", hint="is this an ORS server?")
        if not answer["ok"]:
            reason = answer.get("reason") or "refused"
            return ToolResult(f"error ({reason}): {answer.get('error')}", None, False, error=str(reason))
        output = answer.get("output") or {}
        reward = output.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise OrsError(f"tool {name!r} gave reward {reward!r}, not a number", hint="fix the env's ToolOutput")
        metadata = output["metadata"] if isinstance(output.get("metadata"), dict) else {}
        return ToolResult(blocks_text(output.get("blocks") or []), reward, bool(output.get("finished")), metadata)


def _starting_wait(response: Any, attempt: int) -> float | None:
    """Seconds to wait before asking again when the server says the session's env is still starting (503 with
    `X-Backend-State: starting`, what ORS servers answer while `setup()` runs), else None."""
    from atropos_cli.retry import Backoff, parse_retry_after

    if response.status_code != 503 or response.headers.get("x-backend-state") != "starting":
        return None
    return Backoff().delay(attempt, parse_retry_after(response.headers.get("retry-after")))


def _json(text: str, path: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        raise OrsError(
            f"{path} answered something that is not JSON: {text[:200]!r}", hint="is this an ORS server?"
        ) from None


def _sse_result(text: str, path: str) -> Any:
    """The JSON an SSE answer carries: its `chunk`s and `end` joined; an `error` event is the tool's failure."""
    chunks: list[str] = []
    for event, data in parse_sse(text):
        if event == "error":
            raise OrsError(f"{path}: the env failed: {data[:500]}", hint="see the env server's log")
        if event in ("chunk", "end"):
            chunks.append(data)
        if event == "end":
            return _json("".join(chunks), path) if "".join(chunks) else None
    raise OrsError(f"{path}: the event stream ended without an 'end' event", hint="is this an ORS server?")


def _detail(text: str) -> str:
    try:
        detail = json.loads(text).get("detail", text)
    except (ValueError, AttributeError):
        detail = text
    return str(detail)[:300]


def _status_hint(status: int) -> str:
    if status == 401:
        return f"the server requires an API key: set {API_KEY_VAR}"
    if status in (301, 302, 307, 308):
        return "redirects are not followed: name the env (--env.env_name) or use the final URL"
    return "see the env server's log"


def check_reachable(base_url: str, timeout_s: float) -> list[str]:
    """`GET /list_environments` now (before any model loads): the env names, or one EnvLoadError."""
    import httpx

    from atropos_cli.httpclient import ReplyTooLarge, bounded_get

    url = base_url.rstrip("/") + "/list_environments"
    headers = {"X-API-Key": os.environ[API_KEY_VAR]} if os.environ.get(API_KEY_VAR) else {}
    try:
        response, body = bounded_get(url, timeout_s, MAX_REPLY_BYTES, headers)
    except (httpx.HTTPError, ReplyTooLarge) as exc:
        raise EnvLoadError(
            f"cannot reach the ORS server at {base_url}: {type(exc).__name__}: {exc}",
            hint="start it first (or name its package: ors:PACKAGE starts one for you)",
        ) from None
    if response.status_code == 401:
        raise EnvLoadError(f"{url} requires an API key", hint=f"set {API_KEY_VAR} to the server's key")
    try:
        names = json.loads(body)
    except ValueError:
        names = None
    if response.status_code != 200 or not isinstance(names, list) or not names:
        raise EnvLoadError(
            f"{url} answered {response.status_code} without a list of envs", hint="is this an ORS server?"
        )
    return [str(n) for n in names]
