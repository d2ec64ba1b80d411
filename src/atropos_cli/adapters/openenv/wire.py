"""OpenEnv's wire protocol, client side: one episode is one WebSocket session on `/ws` of an OpenEnv server.

OpenEnv (the `openenv` package, 0.10) serves an env over HTTP and a WebSocket. Its HTTP `/reset` and `/step`
build a fresh env for every call (no episode spans two requests), so multi-turn episodes go over `/ws`, as
openenv's own `EnvClient` does: the client sends `{"type": "reset", "data": {...}}`, `{"type": "step", "data":
ACTION}`, `{"type": "state"}`, `{"type": "close"}`; the server answers `{"type": "observation", "data":
{"observation": {...}, "reward": R, "done": D, "metadata": {...}}}`, `{"type": "state", "data": {...}}` or
`{"type": "error", "data": {"message", "code"}}`. `GET /health` and `GET /schema` (the action, observation and
state JSON schemas) are plain HTTP.

This module speaks that protocol (aiohttp, no openenv import) and maps text both ways: an observation to chat
messages, the model's reply to an action. It raises `OpenEnvError` for anything the server did wrong.

Held against a hostile server: every call has a total deadline (the handshake, and each reset/step/state
answer: `timeout_s`; `/schema`: its whole reply, however slowly it drips), every reply a size cap
(`MAX_MESSAGE_BYTES` a WebSocket message, `MAX_SCHEMA_BYTES` the schema), no redirect is followed (a handshake
or `/schema` answered 3xx is an error), and a malformed frame or a reply that is not a JSON object is one
`OpenEnvError` (the rollout's failure record), never an exception of the transport.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

from atropos_cli.errors import AtroposError, EnvLoadError
from atropos_cli.types import Message

__all__ = [
    "OpenEnvError",
    "StepResult",
    "OpenEnvSession",
    "fetch_schema",
    "pick_action_field",
    "observation_messages",
    "RESERVED_OBSERVATION_KEYS",
    "auth_headers",
]

RESERVED_OBSERVATION_KEYS = ("done", "reward", "metadata")
MAX_MESSAGE_BYTES = 8 * 2**20  # largest WebSocket message (observation) accepted from the env server
MAX_SCHEMA_BYTES = 2**20  # largest GET /schema reply
API_KEY_VAR = "ATROPOS_OPENENV_API_KEY"


def auth_headers() -> dict[str, str]:
    """`Authorization: Bearer $ATROPOS_OPENENV_API_KEY` when it is set (an env server that requires a key, such
    as `atropos export openenv --api-key`); read from the environment so the key never lands in a run's config."""
    import os

    key = os.environ.get(API_KEY_VAR)
    return {"Authorization": f"Bearer {key}"} if key else {}


class OpenEnvError(AtroposError):
    """The env server answered with an error, closed the session, or sent something that is not OpenEnv's."""


@dataclass
class StepResult:
    observation: dict[str, Any]
    reward: float | None
    done: bool
    metadata: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, data: Any) -> StepResult:
        if not isinstance(data, dict) or not isinstance(data.get("observation", {}), dict):
            raise OpenEnvError(f"not an OpenEnv observation: {str(data)[:200]}", hint="is this an OpenEnv server?")
        reward = data.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, int | float)):
            raise OpenEnvError(f"reward must be a number or null, got {reward!r}", hint="fix the env's reward")
        observation = dict(data.get("observation") or {})
        metadata = data.get("metadata") or observation.get("metadata") or {}
        return cls(observation, None if reward is None else float(reward), bool(data.get("done")), dict(metadata))


class _Redirected(Exception):
    """The WebSocket handshake was answered with a redirect (not followed)."""


async def _refuse_redirect(session: Any, context: Any, params: Any) -> None:
    location = params.response.headers.get("Location", "?")
    raise _Redirected(f"the handshake was redirected to {location[:200]} (not followed)")


def _ws_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    if url.startswith("https://"):
        return "wss://" + url[len("https://") :] + "/ws"
    if url.startswith("http://"):
        return "ws://" + url[len("http://") :] + "/ws"
    return url + "/ws"


class OpenEnvSession:
    """One episode's WebSocket session (`async with OpenEnvSession(url) as s: await s.reset(seed=1)`)."""

    def __init__(self, base_url: str, timeout_s: float = 300.0, max_message_bytes: int = MAX_MESSAGE_BYTES) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_message_bytes = max_message_bytes
        self._http: Any = None
        self._ws: Any = None

    async def __aenter__(self) -> OpenEnvSession:
        import aiohttp

        trace = aiohttp.TraceConfig()
        trace.on_request_redirect.append(_refuse_redirect)
        self._http = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, connect=self.timeout_s), trace_configs=[trace]
        )
        url = _ws_url(self.base_url)
        try:
            self._ws = await asyncio.wait_for(
                self._http.ws_connect(url, max_msg_size=self.max_message_bytes, heartbeat=None, headers=auth_headers()),
                self.timeout_s,
            )
        except (aiohttp.ClientError, OSError, TimeoutError, _Redirected) as exc:
            await self._http.close()
            reason = "it did not complete the handshake in time" if isinstance(exc, TimeoutError) else str(exc)
            raise OpenEnvError(
                f"cannot open an OpenEnv session at {url}: {type(exc).__name__}: {reason}",
                hint="is the env server running (GET /health)? Redirects are not followed: use the final URL",
            ) from None
        return self

    async def __aexit__(self, *exc: Any) -> None:
        try:
            if self._ws is not None and not self._ws.closed:
                await self._ws.send_str(json.dumps({"type": "close"}))
                await self._ws.close()
        except Exception:  # noqa: BLE001 - closing a session the server already dropped is not an error
            pass
        finally:
            if self._http is not None:
                await self._http.close()

    async def reset(self, **kwargs: Any) -> StepResult:
        return StepResult.parse(await self._call({"type": "reset", "data": kwargs}))

    async def step(self, action: dict[str, Any]) -> StepResult:
        return StepResult.parse(await self._call({"type": "step", "data": action}))

    async def state(self) -> dict[str, Any]:
        data = await self._call({"type": "state"})
        return dict(data) if isinstance(data, dict) else {}

    async def _call(self, message: dict[str, Any]) -> Any:
        import aiohttp

        try:
            await self._ws.send_str(json.dumps(message))
            frame = await self._ws.receive(timeout=self.timeout_s)
        except TimeoutError:
            raise OpenEnvError(
                f"the env server did not answer {message['type']} within {self.timeout_s:g}s",
                hint="raise --env.timeout_s",
            ) from None
        except Exception as exc:  # noqa: BLE001 - a broken or malformed connection: this rollout's failure
            raise OpenEnvError(
                f"the env session broke during {message['type']}: {type(exc).__name__}: {exc}",
                hint="see the server's log",
            ) from None
        if frame.type != aiohttp.WSMsgType.TEXT:
            detail = f": {frame.data}" if frame.type == aiohttp.WSMsgType.ERROR else ""
            raise OpenEnvError(
                f"the env server closed the session during {message['type']} ({frame.type.name}{detail})",
                hint="see the env server's log (a message over the size cap closes the session too)",
            )
        try:
            answer = json.loads(frame.data)
        except json.JSONDecodeError:
            answer = None
        if not isinstance(answer, dict):
            raise OpenEnvError(
                f"the env server sent a reply that is not a JSON object: {frame.data[:200]!r}",
                hint="is it an OpenEnv server?",
            )
        if answer.get("type") == "error":
            data = answer.get("data") or {}
            code = data.get("code", "?")
            hint = "the env rejected the action or failed; see its log"
            if code == "CAPACITY_REACHED":
                hint = "the server takes fewer sessions at once: lower --env.max_sessions"
            raise OpenEnvError(
                f"env server error on {message['type']}: {data.get('message', 'unknown')} ({code})", hint=hint
            )
        return answer.get("data")


def fetch_schema(base_url: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """`GET /schema`: the action, observation and state JSON schemas (an EnvLoadError when unreachable)."""
    import httpx

    from atropos_cli.httpclient import ReplyTooLarge, bounded_get

    url = base_url.rstrip("/") + "/schema"
    try:
        response, body = bounded_get(url, timeout_s, MAX_SCHEMA_BYTES, auth_headers())
    except httpx.HTTPError as exc:
        raise EnvLoadError(
            f"cannot reach the OpenEnv server at {base_url}: {type(exc).__name__}: {exc}",
            hint="start it first (or name its package: openenv:PACKAGE starts one for you)",
        ) from None
    except ReplyTooLarge as exc:
        raise EnvLoadError(f"{url}: {exc}", hint="is this an OpenEnv server?") from None
    try:
        schema = json.loads(body)
    except ValueError:
        schema = None
    if response.status_code == 401:
        raise EnvLoadError(f"{url} requires an API key", hint=f"set {API_KEY_VAR} to the server's key")
    if response.status_code != 200 or not isinstance(schema, dict) or not isinstance(schema.get("action"), dict):
        raise EnvLoadError(
            f"{url} answered {response.status_code} without an action schema",
            hint="is this an OpenEnv server (openenv 0.10's create_app serves GET /schema)?",
        )
    return schema


def pick_action_field(action_schema: dict[str, Any], wanted: str | None) -> str:
    """The action field the model's text goes into: `wanted`, else the action's only string field."""
    properties = {k: v for k, v in (action_schema.get("properties") or {}).items() if k != "metadata"}
    required = [k for k in action_schema.get("required") or [] if k != "metadata"]
    strings = [k for k, v in properties.items() if isinstance(v, dict) and v.get("type") == "string"]
    if wanted:
        if wanted not in properties:
            raise EnvLoadError(
                f"the env's action has no field {wanted!r}", hint=f"its fields: {', '.join(properties) or 'none'}"
            )
        others = [k for k in required if k != wanted]
    else:
        candidates = [k for k in strings if k in required] or strings
        if len(candidates) != 1:
            raise EnvLoadError(
                "cannot tell which action field takes the model's text "
                f"(string fields: {', '.join(strings) or 'none'})",
                hint="name it: --env.action_field FIELD",
            )
        wanted = candidates[0]
        others = [k for k in required if k != wanted]
    if others:
        raise EnvLoadError(
            f"the env's action also requires {', '.join(others)}: a text reply alone cannot fill it",
            hint="this adapter sends one text field per step; wrap the env in a text-action env",
        )
    return wanted


def observation_messages(observation: dict[str, Any], text_field: str | None) -> list[Message] | str:
    """An observation as the model sees it: its `messages` (a chat) when it has them, else one text.

    The text is `text_field` when named, else `prompt`, else the observation's only string field, else the
    observation as JSON (without done/reward/metadata)."""
    if text_field:
        if text_field not in observation:
            raise OpenEnvError(
                f"the observation has no field {text_field!r}",
                hint=f"its fields: {', '.join(observation) or 'none'} (--env.observation_field)",
            )
        value = observation[text_field]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    messages = observation.get("messages")
    if isinstance(messages, list) and messages and all(_is_message(m) for m in messages):
        return [{"role": m["role"], "content": m["content"]} for m in messages]
    if isinstance(observation.get("prompt"), str):
        return str(observation["prompt"])
    fields = {k: v for k, v in observation.items() if k not in RESERVED_OBSERVATION_KEYS}
    strings = [v for v in fields.values() if isinstance(v, str)]
    if len(strings) == 1:
        return strings[0]
    return json.dumps(fields, ensure_ascii=False, sort_keys=True)


def _is_message(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("role"), str) and isinstance(value.get("content"), str)
