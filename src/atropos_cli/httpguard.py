"""What every HTTP server we run (`atropos api`, `atropos inference`, the fake inference server) checks before a
request reaches a route: browser cross-site requests are refused, and with an API key every request needs it.

`BrowserGuard` (pure ASGI middleware) answers 403 to a request a web page in the user's browser made:
`Sec-Fetch-Site: cross-site` or `same-site` (every current browser sends it), or an `Origin` header that is not a
loopback address (older browsers; they send Origin on every cross-origin POST); and 415 to a POST/PUT/PATCH/DELETE
with a body that is not
`Content-Type: application/json` (gzip-encoded JSON included): a page can send `text/plain` without a CORS
preflight, but not JSON. Programs (Atropos' clients, the `openai` package, httpx, curl with `-H
'Content-Type: application/json'`) send none of the browser headers and JSON bodies, so they pass.

`BearerAuth` answers 401 unless `Authorization: Bearer <key>` matches (constant-time compare).

Both take `render(status, message, hint) -> Response`, so each server answers in its own error shape.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from urllib.parse import urlsplit

from starlette.responses import Response
from starlette.types import ASGIApp, Receive, Scope, Send

__all__ = ["BrowserGuard", "BearerAuth", "Render", "is_loopback_origin", "LOOPBACK_HOSTS"]

Render = Callable[[int, str, str | None], Response]
LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
_BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


def is_loopback_origin(origin: str) -> bool:
    host = urlsplit(origin).hostname if origin != "null" else None
    return host is not None and (host in LOOPBACK_HOSTS or host.startswith("127."))


def _refusal(scope: Scope) -> tuple[int, str, str] | None:
    """(status, message, hint) when the request must be refused, else None."""
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
    site = headers.get("sec-fetch-site", "").lower()
    if site in ("cross-site", "same-site"):
        return 403, f"cross-site browser request refused (Sec-Fetch-Site: {site})", "call this server from a program"
    origin = headers.get("origin")
    if origin is not None and not is_loopback_origin(origin):
        return 403, f"request from origin {origin[:100]!r} refused", "only programs and loopback pages may call it"
    has_body = headers.get("content-length", "0") != "0" or "transfer-encoding" in headers
    if scope["method"] in _BODY_METHODS and has_body:
        media = headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            return (
                415,
                f"request body must be Content-Type: application/json, got {media or 'none'!r}",
                "send JSON with Content-Type: application/json (gzip: add Content-Encoding: gzip)",
            )
    return None


class BrowserGuard:
    def __init__(self, app: ASGIApp, render: Render, on_reject: Callable[[str], None] | None = None) -> None:
        self.app, self.render, self.on_reject = app, render, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        refusal = _refusal(scope) if scope["type"] == "http" else None
        if refusal is None:
            await self.app(scope, receive, send)
            return
        status, message, hint = refusal
        if self.on_reject:
            self.on_reject("cross_site" if status == 403 else "content_type")
        await self.render(status, message, hint)(scope, receive, send)


class BearerAuth:
    """Every request needs `Authorization: Bearer <key>` (a pure ASGI middleware: cheaper than a dependency)."""

    def __init__(
        self, app: ASGIApp, api_key: str, render: Render, hint: str, on_reject: Callable[[str], None] | None = None
    ) -> None:
        self.app, self.key, self.render, self.hint, self.on_reject = app, api_key.encode(), render, hint, on_reject

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        if scheme.lower() == b"bearer" and secrets.compare_digest(token.strip(), self.key):
            await self.app(scope, receive, send)
            return
        if self.on_reject:
            self.on_reject("unauthorized")
        message = "missing or wrong bearer token" if header else "this server requires a bearer token"
        response = self.render(401, message, self.hint)
        response.headers["WWW-Authenticate"] = "Bearer"
        await response(scope, receive, send)
