"""How every uvicorn server we run (`atropos api`, `atropos inference`, the fake inference server) holds against
slow or hostile clients: the limits on a connection before a request reaches the app.

uvicorn alone waits forever for a request's headers (a half-open connection, or one byte every few seconds:
slowloris), accepts any number of headers of any size with httptools, and takes connections until the process
runs out of file descriptors. `HttpLimits` adds, on uvicorn's own HTTP protocols (httptools when installed,
else h11):

- a header deadline: from the moment a connection opens, or a new request's first byte arrives, its request
  line and headers must be complete within `header_timeout_s`, and then its body within `body_timeout_s`,
  else the connection is closed (the time the app takes to answer is not limited);
- `max_header_bytes` (request line + headers) and `max_headers`: past either, 431 and the connection closes;
- idle keep-alive connections close after `keep_alive_s` (uvicorn's `timeout_keep_alive`);
- at most `max_connections` open connections: one more closes the idlest keep-alive connection (between
  requests) to make room, or is itself closed at once when every connection is busy (never a hang);
  the soft file-descriptor limit is raised to the hard one, and the cap lowered below it if need be, so the
  cap, not EMFILE, is what binds.

`listen(host, port)` is the one place a server binds its port: a port already taken is a `PortUnavailableError`
(`error:`/`hint:` lines, exit 1) before the server says it is serving. `uvicorn_config(app, limits, ...)` builds
the `uvicorn.Config`; `serve(app, listener, limits)` runs it on that socket in the foreground (the CLI).
uvicorn is imported inside the functions: `atropos --help` never loads it.
`GuardedHTTPServer` / `GuardedHandler` give the stdlib server of `atropos view --serve` the same guard
(`httpguard.refusal`), header deadline and connection cap.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from atropos_cli.errors import PortUnavailableError
from atropos_cli.httpguard import HostPolicy, refusal

__all__ = [
    "HttpLimits", "LIMIT_FLAGS", "SessionLimits", "WsLimits", "WsSessions", "listen", "uvicorn_config", "serve",
    "protocol_class", "GuardedHTTPServer", "GuardedHandler",
]  # fmt: skip

LIMIT_FLAGS = {
    "header_timeout_s": "--header-timeout",
    "body_timeout_s": "--body-timeout",
    "keep_alive_s": "--keep-alive",
    "ws_idle_s": "--ws-idle",
    "session_idle_s": "--session-idle",
}


class HttpLimits(BaseModel):
    """Per-connection limits of a server (the CLI's --header-timeout, --max-connections, ...)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    header_timeout_s: float = Field(default=10.0, gt=0)
    """Seconds a request's line and headers may take to arrive; then the connection is closed."""
    body_timeout_s: float = Field(default=60.0, gt=0)
    """Seconds a request's body may take to arrive once its headers are in; then the connection is closed."""
    keep_alive_s: int = Field(default=5, ge=1)
    """Seconds an idle keep-alive connection stays open between requests."""
    max_header_bytes: int = Field(default=65_536, ge=1024)
    """Largest request line + headers (bytes); past it 431."""
    max_headers: int = Field(default=100, ge=8)
    """Most header lines in one request; past it 431."""
    max_connections: int = Field(default=1000, ge=1)
    """Most open connections; one more closes the idlest keep-alive one, or itself when all are busy."""


class WsLimits(BaseModel):
    """The WebSocket limits of a server that has WebSockets (`atropos export openenv`: --ws-max-message-bytes,
    --ws-idle, --max-ws-sessions)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    ws_max_message_bytes: int = Field(default=1_048_576, ge=1024)
    """Largest WebSocket message (or frame) a client may send; past it the connection closes (1009)."""
    ws_idle_s: float = Field(default=300.0, gt=0)
    """Seconds a WebSocket session may stay without a message from its client (pings do not count); then it
    is closed (1001)."""
    max_ws_sessions: int = Field(default=64, ge=1)
    """Most WebSocket sessions open at once; one more evicts the idlest (closed 1013, "try again later")."""


class SessionLimits(BaseModel):
    """The sessions of a server whose clients hold sessions over plain HTTP (`atropos export ors`:
    --max-sessions, --session-idle)."""

    model_config = ConfigDict(use_attribute_docstrings=True, extra="forbid")

    max_sessions: int = Field(default=256, ge=1)
    """Most sessions open at once; one more ends the idlest."""
    session_idle_s: float = Field(default=900.0, gt=0)
    """Seconds a session may go without a request (ORS servers reap at 900); then it is ended."""


class _Refused(Exception):
    """Why a request's head was refused (431), raised from the parser's callbacks."""


def _raise_fd_limit(wanted: int) -> int:
    """Raise the soft RLIMIT_NOFILE towards the hard one; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, wanted + 1024)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return soft


def protocol_class(limits: HttpLimits, parser: str = "auto") -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol (`parser` "auto": httptools if installed, else h11) with `limits` enforced."""
    if parser == "h11":
        return _h11_class(limits)
    try:
        import httptools  # noqa: F401
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol as Base
    except ImportError:
        return _h11_class(limits)
    return _httptools_class(Base, limits)


def _refusal_bytes(message: str) -> bytes:
    body = message.encode()
    head = "HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    return head.encode() + f"content-length: {len(body)}\r\nconnection: close\r\n\r\n".encode() + body


class _Deadline:
    """The mixin both protocols share: the head and body deadlines and the connection cap."""

    limits: HttpLimits
    transport: Any
    loop: Any
    connections: set[Any]
    _timer: asyncio.TimerHandle | None = None
    _timer_phase: str | None = None
    _refused: str | None = None

    def _phase(self) -> str | None:
        """ "head" while a request's line and headers are arriving, "body" while its body is, else None (the
        app is answering, or the connection is idle between requests: uvicorn's keep-alive timer's job)."""
        raise NotImplementedError

    _active_at = 0.0  # when this connection last received bytes

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)  # type: ignore[misc]
        self._active_at = time.monotonic()  # uvloop's loop.time() has 1 ms steps: ties
        if len(self.connections) > self.limits.max_connections:
            idle = [c for c in self.connections if c is not self and isinstance(c, _Deadline) and c._idle()]
            if not idle:
                transport.close()
                return
            min(idle, key=lambda c: c._active_at).transport.close()  # the idlest keep-alive connection gives way
        self._sync_timer()

    def _between_requests(self) -> bool:
        """No byte of a request is in (a new connection, or a keep-alive one after its last answer)."""
        raise NotImplementedError

    def _idle(self) -> bool:
        """Nothing being read, no answer being written: a connection that only holds its slot."""
        cycle = getattr(self, "cycle", None)
        done = cycle is None or cycle.response_complete
        return done and self._between_requests() and not self.transport.is_closing()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)  # type: ignore[misc]

    def data_received(self, data: bytes) -> None:
        if self._refused is not None:
            return  # the 431 is on its way and the connection closing: read nothing more
        self._active_at = time.monotonic()  # uvloop's loop.time() has 1 ms steps: ties
        super().data_received(data)  # type: ignore[misc]
        self._sync_timer()

    def send_400_response(self, msg: str) -> None:
        if self._refused is None:
            super().send_400_response(msg)  # type: ignore[misc]
            return
        if not self.transport.is_closing():
            self.transport.write(_refusal_bytes(self._refused))
            self.transport.close()

    def _refuse(self, message: str) -> None:
        self._refused = message

    def _sync_timer(self) -> None:
        """One deadline per phase: started when the phase begins, kept while it lasts, dropped when it ends."""
        phase = None if self.transport.is_closing() else self._phase()
        if phase == self._timer_phase:
            return
        self._disarm()
        if phase is not None:
            seconds = self.limits.header_timeout_s if phase == "head" else self.limits.body_timeout_s
            self._timer, self._timer_phase = self.loop.call_later(seconds, self._expire), phase

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_phase = None

    def _expire(self) -> None:
        phase = self._timer_phase
        self._timer = self._timer_phase = None
        if phase is not None and self._phase() == phase and not self.transport.is_closing():
            self.transport.close()


def _httptools_class(base: type[Any], limits: HttpLimits) -> type[asyncio.Protocol]:
    import httptools

    class Protocol(_Deadline, base):  # type: ignore[misc, valid-type]
        _reading: str | None = "head"
        _head_bytes = 0
        _head_count = 0

        def _phase(self) -> str | None:
            return self._reading

        def _between_requests(self) -> bool:
            return self._reading is None or (self._reading == "head" and self._head_bytes == 0)

        def on_message_begin(self) -> None:
            self._reading, self._head_bytes, self._head_count = "head", 0, 0
            super().on_message_begin()

        def _grow(self, size: int, count: int = 0) -> None:
            self._head_bytes += size
            self._head_count += count
            if self._head_bytes > limits.max_header_bytes:
                self._refuse(f"request headers are over {limits.max_header_bytes} bytes")
            elif self._head_count > limits.max_headers:
                self._refuse(f"request has more than {limits.max_headers} headers")
            if self._refused is not None:
                raise httptools.HttpParserCallbackError(self._refused)

        def on_url(self, url: bytes) -> None:
            self._grow(len(url))
            super().on_url(url)

        def on_header(self, name: bytes, value: bytes) -> None:
            self._grow(len(name) + len(value) + 4, 1)
            super().on_header(name, value)

        def on_headers_complete(self) -> None:
            self._reading = "body"
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            self._reading = None
            super().on_message_complete()

    Protocol.limits = limits
    return Protocol


def _h11_class(limits: HttpLimits) -> type[asyncio.Protocol]:
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class _CountingConnection:
        """h11's connection, refusing a request with too many header lines (its size is h11's own limit)."""

        def __init__(self, conn: Any, owner: Any) -> None:
            self._conn, self._owner = conn, owner

        def next_event(self) -> Any:
            event = self._conn.next_event()
            if isinstance(event, h11.Request) and len(event.headers) > limits.max_headers:
                self._owner._refuse(f"request has more than {limits.max_headers} headers")
                raise h11.RemoteProtocolError("too many headers", 431)
            return event

        def __getattr__(self, name: str) -> Any:
            return getattr(self._conn, name)

    class Protocol(_Deadline, H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = _CountingConnection(self.conn, self)  # type: ignore[assignment]

        def _between_requests(self) -> bool:
            return self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]

        def _phase(self) -> str | None:
            state = self.conn.their_state
            return "head" if state is h11.IDLE else "body" if state is h11.SEND_BODY else None

    Protocol.limits = limits
    return Protocol


def uvicorn_config(
    app: Any, limits: HttpLimits | None = None, parser: str = "auto", ws: WsLimits | None = None, **kwargs: Any
) -> Any:
    """A `uvicorn.Config` for `app` with `limits` (default `HttpLimits()`) on `parser` ("auto", "h11") and the
    WebSocket message cap of `ws` (default `WsLimits()`); `kwargs` go to uvicorn as they are."""
    import uvicorn

    limits = limits or HttpLimits()
    ws = ws or WsLimits()
    soft = _raise_fd_limit(limits.max_connections)
    if soft != resource.RLIM_INFINITY and limits.max_connections > soft - 64:
        # the cap must bind before EMFILE does: keep 64 descriptors for the store, the model and the logs
        limits = limits.model_copy(update={"max_connections": max(8, soft - 64)})
    return uvicorn.Config(
        app,
        http=protocol_class(limits, parser),
        h11_max_incomplete_event_size=limits.max_header_bytes,
        timeout_keep_alive=limits.keep_alive_s,
        ws_max_size=ws.ws_max_message_bytes,
        ws_max_queue=4,
        **kwargs,
    )


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port and listening (port 0: any free port, read it from `getsockname()`).
    Every server we run binds here, so a taken port reads the same everywhere. `IPPROTO_TCP`: asyncio sets
    TCP_NODELAY only on sockets whose proto says TCP (else keep-alive answers wait ~40 ms on Nagle)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is free; a listened one is not
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        raise PortUnavailableError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}",
            hint="pick another --port (or --port 0 for any free port), or stop what holds it",
        ) from None
    return sock


def serve(app: Any, listener: socket.socket, limits: HttpLimits | None = None, log_level: str = "warning") -> None:
    """Run `app` on `listener` (from `listen`) in the foreground with `limits` (`uvicorn.run` plus the limits)."""
    import uvicorn

    host, port = listener.getsockname()[:2]
    uvicorn.Server(uvicorn_config(app, limits, host=host, port=port, log_level=log_level)).run(sockets=[listener])


class GuardedHTTPServer(ThreadingHTTPServer):
    """The stdlib threaded server (`atropos view --serve`) with the same guard and limits as the uvicorn ones:
    `httpguard.refusal` on every request, the header deadline and the connection cap of `limits`; the stdlib
    itself refuses a header line over 64 KiB or more than 100 headers with 431. Handlers subclass
    `GuardedHandler`."""

    daemon_threads = True

    def __init__(
        self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler], limits: HttpLimits | None = None,
        hosts: HostPolicy | None = None,
    ) -> None:  # fmt: skip
        self.limits = limits or HttpLimits()
        self.hosts = hosts or HostPolicy(address[0])
        self._open, self._open_lock = 0, threading.Lock()
        super().__init__(address, handler, bind_and_activate=False)
        self.socket.close()
        self.socket = listen(*address)  # a taken port fails as every server's does
        self.server_address = self.socket.getsockname()
        self.server_name, self.server_port = address[0], int(self.server_address[1])

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            full = self._open >= self.limits.max_connections
            self._open += 0 if full else 1
        if full:
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._open_lock:
                self._open -= 1


class GuardedHandler(BaseHTTPRequestHandler):
    """Closes the connection when a request's head is not in within the deadline; refuses what `httpguard`
    refuses (a foreign Host, a cross-site page) before `do_GET` runs."""

    server: GuardedHTTPServer

    def handle_one_request(self) -> None:
        timer = threading.Timer(self.server.limits.header_timeout_s, self._expire)
        timer.daemon = True
        self._timer = timer
        timer.start()
        try:
            super().handle_one_request()
        finally:
            timer.cancel()

    def _expire(self) -> None:
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def parse_request(self) -> bool:
        ok = super().parse_request()
        self._timer.cancel()
        if not ok:
            return False
        headers = {name.lower(): value for name, value in self.headers.items()}
        hosts = len(self.headers.get_all("host") or [])
        refused = refusal(self.command or "GET", headers, self.server.hosts, hosts)
        if refused is not None:
            self.send_error(refused[0], refused[1], refused[2])
            return False
        return True


class WsSessions:
    """The WebSocket sessions of one server, held to `limits` (`WsLimits`): at most `max_ws_sessions` at once (a new one
    evicts the idlest, so idle clients that answer pings can never lock others out), and a session without a
    client message for `ws_idle_s` is closed. `receive(socket)` is the one way a server reads a message:
    text only (a binary or malformed frame ends the session with a clear close reason, never an exception)."""

    def __init__(self, limits: WsLimits | None = None) -> None:
        self.limits = limits or WsLimits()
        self._last: dict[Any, float] = {}  # socket -> when its client last sent a message
        self.evicted = 0

    async def admit(self, socket: Any) -> None:
        """Accept `socket`, first closing the idlest session when the table is full."""
        while len(self._last) >= self.limits.max_ws_sessions:
            idlest = min(self._last, key=self._last.__getitem__)
            self._last.pop(idlest)
            self.evicted += 1
            with contextlib.suppress(Exception):
                await idlest.close(code=1013, reason="evicted: the server's WebSocket sessions are full")
        await socket.accept()
        self._last[socket] = time.monotonic()

    def release(self, socket: Any) -> None:
        self._last.pop(socket, None)

    async def receive(self, socket: Any) -> str | None:
        """The client's next text message; None when the session is over (disconnected, evicted, idle past
        `ws_idle_s`, or a frame that is not text: each closed with its reason)."""
        try:
            message = await asyncio.wait_for(socket.receive(), self.limits.ws_idle_s)
        except TimeoutError:
            await self._close(socket, 1001, f"idle for {self.limits.ws_idle_s:g}s")
            return None
        except Exception:  # noqa: BLE001 - a malformed frame or a broken connection ends this session only
            await self._close(socket, 1002, "malformed frame")
            return None
        if socket not in self._last or message.get("type") == "websocket.disconnect":
            return None
        if message.get("text") is None:
            await self._close(socket, 1003, "only text frames (JSON) are understood")
            return None
        self._last[socket] = time.monotonic()
        return str(message["text"])

    async def _close(self, socket: Any, code: int, reason: str) -> None:
        self.release(socket)
        with contextlib.suppress(Exception):
            await socket.close(code=code, reason=reason)
