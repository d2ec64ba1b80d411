"""atroposlib.envs.server_handling.proxy_client: `ProxyManagedServer`, a ManagedServer session living in the
ManagedServer proxy (managed_server_proxy), and `create_proxy_session(proxy_url, ...)`.

`ServerManager(..., proxy_url=URL)` or `ATROPOS_PROXY_URL` makes `managed_server()` hand one of these out,
as in Atropos' main. `chat_completion(**kwargs)` posts to the session (tool calls included in the answer);
`get_url()` is the session's OpenAI base URL for other programs; `get_state()` gives the tracked nodes
(refreshed after each call here; Atropos' client leaves them empty until `fetch_state()`); `cleanup()`
ends the session. `completion()` is not offered (the proxy speaks chat only), as in Atropos. A proxy error
is an InferenceError with the proxy's message.
"""

from __future__ import annotations

import contextlib
from typing import Any

from atropos_cli.compat.atroposlib.envs.server_handling.managed_server import SequenceNode
from atropos_cli.errors import InferenceError

__all__ = ["ProxyManagedServer", "create_proxy_session"]


async def _call(method: str, url: str, body: dict[str, Any] | None = None, timeout: float = 300) -> dict[str, Any]:
    import aiohttp

    try:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout)) as session,
            session.request(method, url, json=body) as response,
        ):
            data = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        raise InferenceError(
            f"ManagedServer proxy at {url} did not answer: {exc}", hint="is the proxy running?"
        ) from exc
    if response.status >= 400:
        message = (data.get("error") or {}).get("message", str(data)) if isinstance(data, dict) else str(data)
        raise InferenceError(f"ManagedServer proxy error {response.status}: {message}", hint=f"request: {method} {url}")
    return data if isinstance(data, dict) else {}


class ProxyManagedServer:
    def __init__(self, proxy_url: str, session_uuid: str, model_name: str = "unknown", base_url: str | None = None):
        self.proxy_url = proxy_url.rstrip("/")
        self.session_uuid = session_uuid
        self.model_name = model_name
        self.base_url = base_url
        self._cached_nodes: list[SequenceNode] | None = None

    def get_url(self) -> str:
        return f"{self.proxy_url}/{self.session_uuid}/v1"

    async def chat_completion(self, **kwargs: Any) -> Any:
        from openai.types.chat import ChatCompletion

        body: dict[str, Any] = {
            "messages": [dict(m) for m in kwargs.get("messages", [])],
            "max_tokens": kwargs.get("max_tokens", 1024),
            "temperature": kwargs.get("temperature", 1.0),
            "n": kwargs.get("n", 1),
        }
        for key in ("stop", "tools"):
            if kwargs.get(key):
                body[key] = kwargs[key]
        if kwargs.get("tool_choice") is not None:
            body["tool_choice"] = kwargs["tool_choice"]
        data = await _call("POST", f"{self.proxy_url}/{self.session_uuid}/v1/chat/completions", body)
        await self.fetch_state()
        return ChatCompletion.model_validate(data)

    async def completion(self, **kwargs: Any) -> Any:
        raise NotImplementedError("ProxyManagedServer.completion() is not supported: use chat_completion()")

    def get_state(self) -> dict[str, Any]:
        return {"nodes": list(self._cached_nodes or [])}

    async def fetch_state(self) -> dict[str, Any]:
        data = await _call("GET", f"{self.proxy_url}/{self.session_uuid}/nodes", timeout=30)
        self._cached_nodes = [SequenceNode(**node) for node in data.get("nodes", [])]
        return {"nodes": list(self._cached_nodes)}

    def reset(self) -> None:
        self._cached_nodes = None

    async def cleanup(self) -> None:
        with contextlib.suppress(InferenceError):  # the session (or the proxy) is gone: nothing left to free
            await _call("DELETE", f"{self.proxy_url}/{self.session_uuid}", timeout=30)

    async def __aenter__(self) -> ProxyManagedServer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.cleanup()


async def create_proxy_session(
    proxy_url: str,
    base_url: str | None = None,
    tool_parser: str = "hermes",
    track_tree: bool = False,
    model_name: str = "unknown",
) -> ProxyManagedServer:
    body = {"tool_parser": tool_parser, "track_tree": track_tree, "base_url": base_url}
    data = await _call("POST", f"{proxy_url.rstrip('/')}/sessions/create", body, timeout=30)
    return ProxyManagedServer(proxy_url, data["uuid"], data.get("model_name", model_name), data.get("base_url"))
