"""NeMo Gym's wire format, as its resources servers and its simple agent speak it (nemo-gym 0.7.0).

A task row (one line of a NeMo Gym dataset) is `{"responses_create_params": {"input": [...], "tools": [...],
...}, ...task fields}`: the OpenAI Responses API request the agent sends the policy, beside whatever fields
the server's `verify` reads. One rollout, as NeMo Gym's simple agent plays it against a resources server:

1. `POST /seed_session` with the row; the server's session cookie ties the later calls to this rollout;
2. the policy answers; each function call of the answer is `POST /{tool name}` with the call's JSON arguments,
   and the reply's body, whatever its status, is the call's output the policy reads next; then the policy
   answers again, until an answer calls no tool (or the turn limit);
3. `POST /verify` with the row and `response`, a Responses API response whose `output` lists the assistant
   messages, function calls and their outputs in order; the answer's `reward` scores the rollout.

This module turns a row into chat messages and tools (`row_messages`, `chat_tools`), builds the `output`
items and the response (`message_item`, `call_item`, `call_output_item`, `response_body`), and is the HTTP
client of one rollout's session (`ResourcesSession`: our bounded client, a cookie jar per rollout).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any

from atropos_cli.errors import AtroposError
from atropos_cli.types import Message

__all__ = [
    "NemoGymError",
    "ResourcesSession",
    "call_item",
    "call_output_item",
    "chat_tools",
    "check_reachable",
    "message_item",
    "response_body",
    "row_messages",
]

MAX_REPLY_BYTES = 16 << 20  # one answer of the resources server
_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]{0,127}")
_ROLES = {"developer": "system", "system": "system", "user": "user", "assistant": "assistant"}


class NemoGymError(AtroposError):
    """The resources server refused a call of the rollout's session (its status and body in the message)."""


def row_messages(params: dict[str, Any]) -> list[Message]:
    """The chat of `responses_create_params`: `instructions` as the system message, then each `input` item
    (`developer` -> system; text parts joined; earlier function calls and outputs as tool-call turns)."""
    messages: list[Message] = []
    if params.get("instructions"):
        messages.append({"role": "system", "content": str(params["instructions"])})
    items = params.get("input")
    if isinstance(items, str):
        return [*messages, {"role": "user", "content": items}]
    for item in items or []:
        kind = item.get("type", "message")
        if kind == "message" and item.get("role") in _ROLES:
            messages.append({"role": _ROLES[item["role"]], "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {"name": item["name"], "arguments": item["arguments"]}
            messages.append({"role": "assistant", "content": "", "tool_calls": [
                {"id": item["call_id"], "type": "function", "function": call}]})  # fmt: skip
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": _text(item["output"])})
        else:
            role = item.get("role")
            raise ValueError(f"the row's input has a {kind!r} item (role {role!r}) this adapter cannot show")
    if not messages:
        raise ValueError("the row's responses_create_params has no input")
    return messages


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if part.get("type") not in ("input_text", "output_text", "text"):
            raise ValueError(f"a message part of type {part.get('type')!r} (only text is supported)")
        parts.append(part["text"])
    return "".join(parts)


def chat_tools(params: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The row's Responses API function tools as chat-completions tools (what chat templates render)."""
    tools = []
    for tool in params.get("tools") or []:
        if tool.get("type", "function") != "function":
            raise ValueError(f"the row offers a {tool.get('type')!r} tool (only function tools are supported)")
        function = {k: tool[k] for k in ("name", "description", "parameters", "strict") if k in tool}
        tools.append({"type": "function", "function": function})
    return tools or None


def message_item(text: str, index: int) -> dict[str, Any]:
    return {
        "id": f"msg_{index}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def call_item(call: dict[str, Any]) -> dict[str, Any]:
    """A parsed tool call (OpenAI chat entry) as a Responses API function_call item."""
    function = call["function"]
    return {
        "type": "function_call",
        "id": f"fc_{call['id']}",
        "call_id": call["id"],
        "name": function["name"],
        "arguments": function["arguments"],
        "status": "completed",
    }


def call_output_item(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def response_body(params: dict[str, Any], output: list[dict[str, Any]], model: str, *, complete: bool) -> dict:
    """The Responses API response `verify` reads: the rollout's output items, in order."""
    return {
        "id": f"resp_{int(time.time() * 1000)}",
        "object": "response",
        "created_at": time.time(),
        "model": model,
        "output": output,
        "status": "completed" if complete else "incomplete",
        "incomplete_details": None if complete else {"reason": "max_output_tokens"},
        "parallel_tool_calls": bool(params.get("parallel_tool_calls", True)),
        "tool_choice": params.get("tool_choice", "auto"),
        "tools": params.get("tools") or [],
    }


def check_reachable(base_url: str, timeout_s: float) -> None:
    """A running server answers its liveness route (`GET /health`, every NeMo Gym server has it)."""
    import httpx

    from atropos_cli.errors import EnvLoadError
    from atropos_cli.httpclient import ReplyTooLarge, bounded_get

    try:
        response, _ = bounded_get(base_url.rstrip("/") + "/health", timeout_s, 1 << 16)
    except (httpx.HTTPError, ReplyTooLarge) as exc:
        raise EnvLoadError(
            f"cannot reach the NeMo Gym resources server at {base_url}: {exc}",
            hint="is it running (ng_run, or `python app.py` under NeMo Gym's config)? Or give its folder: nemogym:DIR",
        ) from None
    if response.status_code != 200:
        raise EnvLoadError(
            f"{base_url}/health answered {response.status_code}: not a NeMo Gym server",
            hint="nemogym:URL is a resources server's address (host and port)",
        )


class ResourcesSession:
    """One rollout's session on a resources server: `seed`, `call_tool`, `verify`, over one cookie jar."""

    def __init__(self, base_url: str, timeout_s: float, tool_names: set[str]) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.tool_names = tool_names
        self._client: Any = None

    async def __aenter__(self) -> ResourcesSession:
        import httpx

        self._client = httpx.AsyncClient(timeout=httpx.Timeout(min(self.timeout_s, 30.0)), follow_redirects=False)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._client.aclose()

    async def seed(self, row: dict[str, Any]) -> None:
        await self._post_ok("/seed_session", row)

    async def call_tool(self, name: str, arguments: str) -> str:
        """The tool's output as the model sees it: the reply body whatever its status (as NeMo Gym's agent
        passes a failing tool's error on to the model); a name the row does not offer, or arguments that are
        not a JSON object, are an error output without a request."""
        if name not in self.tool_names or not _TOOL_NAME.fullmatch(name):
            return json.dumps({"error": f"no tool named {name!r}; the tools are {sorted(self.tool_names)}"})
        try:
            parsed = json.loads(arguments)
        except json.JSONDecodeError as exc:
            return json.dumps({"error": f"Invalid tool call arguments: {exc}"})
        if not isinstance(parsed, dict):
            return json.dumps({"error": "Invalid tool call arguments: not a JSON object"})
        response = await self._post("/" + name, parsed)
        return str(response.text)

    async def verify(self, row: dict[str, Any], response: dict[str, Any]) -> dict[str, Any]:
        """The verify answer (`reward` and whatever else the server reports); a reward that is not a number
        is an error."""
        answer = (await self._post_ok("/verify", {**row, "response": response})).json()
        reward = answer.get("reward") if isinstance(answer, dict) else None
        if isinstance(reward, bool) or not isinstance(reward, int | float):
            raise NemoGymError(f"POST /verify answered no numeric reward: {json.dumps(answer)[:200]}")
        return dict(answer)

    async def _post_ok(self, path: str, body: dict[str, Any]) -> Any:
        response = await self._post(path, body)
        if response.status_code >= 400:
            raise NemoGymError(f"POST {path} answered {response.status_code}: {response.text[:300]}")
        return response

    async def _post(self, path: str, body: dict[str, Any]) -> Any:
        import httpx

        from atropos_cli.httpclient import ReplyTooLarge, bounded_send

        try:
            return await bounded_send(
                self._client, "POST", self.base_url + path, self.timeout_s, MAX_REPLY_BYTES, json=body
            )
        except (httpx.HTTPError, ReplyTooLarge) as exc:
            raise NemoGymError(f"POST {path} on the resources server failed: {exc}") from None
