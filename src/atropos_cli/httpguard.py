"""What every HTTP server we run (`atropos api`, `atropos inference`, the fake inference server, `atropos view
--serve`) checks before a request reaches a route: the `Host` it was sent to, browser cross-site requests, and
with an API key every request needs it.

`HostPolicy` answers DNS rebinding: a page on `attacker.example` whose name is re-pointed at 127.0.0.1 reaches
our port from the browser as a same-origin request (no Origin, no Sec-Fetch-Site: cross-site), but its `Host`
header still says `attacker.example`. A request is served only when its Host is a loopback name or address
(`localhost`, `127.0.0.0/8`, `::1`), the address the server is bound to (any IP literal when bound to
`0.0.0.0`/`::`: a rebound page always has a name), or a name the user allowed (`--allowed-host NAME`, `*` for
any). A request without Host (HTTP/1.0 programs) is not a browser's and passes.

`BrowserGuard` (pure ASGI middleware) answers 403 to a Host the policy refuses and to a request a web page in
the user's browser made: `Sec-Fetch-Site: cross-site` or `same-site` (every current browser sends it), or an
`Origin` header whose host is not exactly a loopback name or address, nor an allowed name (the URL is parsed:
`http://127.0.0.1.attacker.example` is not loopback); and 415 to a POST/PUT/PATCH/DELETE with a body that is
not `Content-Type: application/json` (gzip-encoded JSON included): a page can send `text/plain` without a
CORS preflight, but not JSON. Programs (Atropos' clients, the `openai` package, httpx, curl with `-H
'Content-Type: application/json'`) send none of the browser headers and JSON bodies, so they pass.
`refusal(method, headers, policy)` is the same check for servers that are not ASGI (`view --serve`), and
`LoopbackGuard` the guard of a server we launch but do not build (vLLM's `--middleware`).

`BearerAuth` answers 401 unless `Authorization: Bearer <key>` matches (constant-time compare).

Both take `render(status, message, hint) -> Response`, so each server answers in its own error shape.
"""

from __future__ import annotations

import contextlib
import ipaddress
import secrets
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = [
    "BodyLimit", "BrowserGuard", "BearerAuth", "HostPolicy", "LoopbackGuard", "Render", "refusal", "is_loopback_name",
]  # fmt: skip

Render = Callable[[int, str, str | None], Response]
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
_UNSPECIFIED = {"0.0.0.0", "::", ""}


def _ip(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        return None


def _normal(name: str) -> str:
    return name.strip().lower().removesuffix(".").removeprefix("[").removesuffix("]")


def is_loopback_name(name: str) -> bool:
    """`localhost` or a loopback address (127.0.0.0/8, ::1), compared exactly: `127.0.0.1.evil.example` is not."""
    name = _normal(name)
    address = _ip(name)
    return name == "localhost" or (address is not None and address.is_loopback)


def _host_of(header: str) -> str | None:
    """The name in a Host header (`name`, `name:port`, `[v6]:port`); None when it is not one."""
    header = header.strip()
    if header.startswith("["):
        close = header.find("]")
        rest = header[close + 1 :] if close > 0 else "x"
        return header[1:close] if close > 0 and (not rest or (rest[0] == ":" and rest[1:].isdigit())) else None
    name, colon, port = header.rpartition(":")
    if not colon:
        name = port
    elif not port.isdigit():
        return None
    return name or None


class HostPolicy:
    """Which `Host` values (and Origin hosts) a server answers: loopback, its bound address, allowed names."""

    def __init__(self, bound: str = "127.0.0.1", allowed: Iterable[str] = ()) -> None:
        self.bound = _normal(bound)
        self.allowed = {_normal(a) for a in allowed if a.strip()}
        self.any_host = "*" in self.allowed

    def allows_host(self, header: str | None) -> bool:
        if header is None or self.any_host:
            return True
        name = _host_of(header)
        if name is None:
            return False
        name = _normal(name)
        if is_loopback_name(name) or name == self.bound or name in self.allowed:
            return True
        return self.bound in _UNSPECIFIED and _ip(name) is not None

    def allows_origin(self, origin: str) -> bool:
        try:
            host = urlsplit(origin).hostname if origin != "null" else None
        except ValueError:
            return False
        return host is not None and (is_loopback_name(host) or _normal(host) in self.allowed)


def refusal(
    method: str,
    headers: Mapping[str, str],
    policy: HostPolicy,
    host_count: int = 1,
    body_types: tuple[str, ...] = ("application/json",),
) -> tuple[int, str, str, str] | None:
    """(status, message, hint, metrics reason) when the request must be refused, else None. `headers` has
    lower-case names; `host_count` is how many Host headers the request carried (more than one is refused: a
    proxy and this server could each read another); a body must be one of `body_types` (none a browser form
    can send cross-site without a preflight)."""
    if host_count > 1:
        return 400, f"request has {host_count} Host headers", "send exactly one Host header", "bad_host"
    host = headers.get("host")
    if not policy.allows_host(host):
        return (
            403, f"Host {str(host)[:100]!r} is not this server's name (a DNS-rebinding page sends its own)",
            "call it as 127.0.0.1 or localhost, or start it with --allowed-host NAME", "bad_host",
        )  # fmt: skip
    site = headers.get("sec-fetch-site", "").lower()
    if site in ("cross-site", "same-site"):
        return (
            403, f"cross-site browser request refused (Sec-Fetch-Site: {site})", "call this server from a program",
            "cross_site",
        )  # fmt: skip
    origin = headers.get("origin")
    if origin is not None and not policy.allows_origin(origin):
        return (
            403, f"request from origin {origin[:100]!r} refused", "only programs and loopback pages may call it",
            "cross_site",
        )  # fmt: skip
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    if method in _BODY_METHODS and has_body:
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in body_types:
            return (
                415,
                f"request body must be Content-Type: {' or '.join(body_types)}, got {media or 'none'!r}",
                "send JSON with Content-Type: application/json (gzip: add Content-Encoding: gzip)",
                "content_type",
            )
    return None


class BrowserGuard:
    def __init__(
        self, app: ASGIApp, render: Render, on_reject: Callable[[str], None] | None = None,
        hosts: HostPolicy | None = None, body_types: tuple[str, ...] = ("application/json",),
    ) -> None:  # fmt: skip
        self.app, self.render, self.on_reject = app, render, on_reject
        self.hosts = hosts or HostPolicy()
        self.body_types = body_types

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        names = [k.decode("latin-1").lower() for k, _ in scope["headers"]]
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        method = scope.get("method", "GET")  # a WebSocket handshake is a GET, held to the same rules
        refused = refusal(method, headers, self.hosts, names.count("host"), self.body_types)
        if refused is None:
            await self.app(scope, receive, send)
            return
        status, message, hint, reason = refused
        if self.on_reject:
            self.on_reject(reason)
        await _answer(scope, receive, send, self.render(status, message, hint))


async def _answer(scope: Scope, receive: Receive, send: Send, response: Response) -> None:
    """Send a refusal: the response itself over HTTP; a WebSocket handshake is closed before it opens (the
    server answers it 403)."""
    if scope["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008})
        return
    await response(scope, receive, send)


def _openai_error(status: int, message: str, hint: str | None = None) -> Response:
    from starlette.responses import JSONResponse

    text = message + (f" (hint: {hint})" if hint else "")
    return JSONResponse({"error": {"message": text, "type": "invalid_request_error", "code": status}}, status)


class LoopbackGuard(BrowserGuard):
    """`BrowserGuard` for a server we launch but do not build, bound to 127.0.0.1: the vLLM server of `atropos
    train --inference vllm` loads it with `--middleware atropos_cli.httpguard.LoopbackGuard` (vLLM calls
    `app.add_middleware(cls)` without arguments). Errors in OpenAI's shape; needs only starlette."""

    def __init__(self, app: ASGIApp) -> None:
        super().__init__(app, render=_openai_error)


class BearerAuth:
    """Every request needs `Authorization: Bearer <key>` (a pure ASGI middleware: cheaper than a dependency), or,
    with `key_header` (a lower-case header name such as `b"x-api-key"`), the key alone in that header."""

    def __init__(
        self, app: ASGIApp, api_key: str, render: Render, hint: str, on_reject: Callable[[str], None] | None = None,
        key_header: bytes | None = None,
    ) -> None:  # fmt: skip
        self.app, self.key, self.render, self.hint, self.on_reject = app, api_key.encode(), render, hint, on_reject
        self.key_header = key_header

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        header = headers.get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        keyed = headers.get(self.key_header, b"") if self.key_header else b""
        if (scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self.key)) or (
            keyed and secrets.compare_digest(keyed.strip(), self.key)
        ):
            await self.app(scope, receive, send)
            return
        if self.on_reject:
            self.on_reject("unauthorized")
        what = "key" if self.key_header else "bearer token"
        message = f"missing or wrong {what}" if header or keyed else f"this server requires a {what}"
        response = self.render(401, message, self.hint)
        response.headers["WWW-Authenticate"] = "Bearer"
        await _answer(scope, receive, send, response)


class BodyLimit:
    """A request body over `max_bytes` is answered 413 (by its Content-Length before any of it is read, or as
    it streams in): for apps that read bodies through the framework (`atropos export openenv`). Pure ASGI."""

    def __init__(self, app: ASGIApp, max_bytes: int, render: Render) -> None:
        self.app, self.max_bytes, self.render = app, max_bytes, render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen, too_large, started = 0, False, False

        async def counted() -> Any:
            nonlocal seen, too_large
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                too_large = too_large or seen > self.max_bytes
                if too_large:
                    raise _TooLarge
            return message

        async def forwarded(message: Any) -> None:
            nonlocal started
            if too_large:
                return  # the app's answer to a body cut short (FastAPI: a 400) gives way to the 413
            started = started or message["type"] == "http.response.start"
            await send(message)

        with contextlib.suppress(_TooLarge):
            await self.app(scope, counted, forwarded)
        if too_large and not started:
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        hint = f"send at most {self.max_bytes} bytes"
        await self.render(413, f"request body is over {self.max_bytes} bytes", hint)(scope, receive, send)


class _TooLarge(Exception):
    pass
