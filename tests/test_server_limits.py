"""The limits every server we run holds a hostile client to, and every client we ship holds a hostile server to
(`httpguard`, `httpserve`, `httpclient`, the OpenEnv export and client). Real servers on 127.0.0.1, free ports;
bodies and replies just over each limit, never huge ones; waits are bounded by deadlines."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from fastapi import FastAPI, WebSocket
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from atropos_cli.adapters.openenv.wire import OpenEnvError, OpenEnvSession, fetch_schema
from atropos_cli.errors import EnvLoadError
from atropos_cli.httpserve import WsLimits
from atropos_cli.runs.openenv_app import MAX_BODY_BYTES, create_openenv_app
from atropos_cli.runs.openenv_export import MAX_AHEAD, MAX_KEPT, build_exported_env
from atropos_cli.testing.threaded import ThreadedServer

RESET = '{"type": "reset", "data": {}}'


@contextmanager
def exported(limits: WsLimits | None = None) -> Iterator[str]:
    app = create_openenv_app(build_exported_env("arithmetic", ["--env.max_token_length", "16"], None), limits=limits)
    with ThreadedServer(app, lifespan="on", ws=limits).start() as server:
        yield server.url


def _ws(url: str, **kwargs: Any) -> Any:
    return connect(url.replace("http://", "ws://") + "/ws", open_timeout=10, close_timeout=2, **kwargs)


def _closed_code(ws: Any) -> int | None:
    """The close code the server sent, waiting (bounded) for it."""
    try:
        ws.recv(timeout=10)
    except ConnectionClosed as exc:
        return exc.rcvd.code if exc.rcvd else None
    except TimeoutError:
        return None
    return _closed_code(ws)


def _raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        return conn.recv(4096)


def test_a_post_just_over_the_body_limit_is_413_by_length_and_by_stream():
    with exported() as url:
        small = httpx.post(url + "/reset", json={})
        big = b'{"seed": 0, "pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
        by_length = httpx.post(url + "/reset", content=big, headers={"Content-Type": "application/json"})

        def chunks() -> Iterator[bytes]:  # no Content-Length: counted as it streams
            yield big[: len(big) // 2]
            yield big[len(big) // 2 :]

        by_stream = httpx.post(url + "/reset", content=chunks(), headers={"Content-Type": "application/json"})
        healthy = httpx.get(url + "/health").status_code
    assert small.status_code == 200
    assert by_length.status_code == 413 and "over" in by_length.json()["detail"]
    assert by_stream.status_code == 413
    assert healthy == 200


def test_idle_websockets_are_evicted_idlest_first_when_the_sessions_are_full():
    with exported(WsLimits(max_ws_sessions=2)) as url:
        first, second = _ws(url), _ws(url)
        first.send(RESET)
        first.recv(timeout=10)
        second.send(RESET)  # second is now the more recently active one
        second.recv(timeout=10)
        first.send('{"type": "state"}')
        first.recv(timeout=10)  # ... and now first is: second is the idlest
        with _ws(url) as third:
            third.send(RESET)
            assert third.recv(timeout=10)
            assert _closed_code(second) == 1013
            first.send('{"type": "state"}')
            assert first.recv(timeout=10)  # the active one kept its session
        first.close()


def test_a_silent_websocket_is_closed_after_the_idle_limit():
    with exported(WsLimits(ws_idle_s=0.3)) as url, _ws(url) as ws:
        assert _closed_code(ws) == 1001


def test_binary_oversized_or_malformed_frames_end_only_that_session():
    with exported(WsLimits(ws_max_message_bytes=4096)) as url:
        with _ws(url) as ws:
            ws.send(b"\x00\x01")
            assert _closed_code(ws) == 1003
        with _ws(url) as ws:
            ws.send("x" * 5000)
            assert _closed_code(ws) == 1009
        port = int(url.rsplit(":", 1)[1])
        with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:  # a frame no client would send
            conn.sendall(
                b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            assert b"101" in conn.recv(4096)
            conn.sendall(b"\x8f\x80\x00\x00\x00\x00")  # reserved opcode 0xF, masked, empty
            conn.settimeout(10)
            assert conn.recv(4096)[:1] == b"\x88"  # a close frame back, not a hang
        with _ws(url) as ws:
            ws.send(RESET)
            assert "observation" in ws.recv(timeout=10)  # the server serves on


UPGRADE = (
    "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
)


@pytest.mark.parametrize(
    "headers",
    [
        {"Host": "attacker.example"},
        {"Host": "127.0.0.1", "Sec-Fetch-Site": "cross-site"},  # a browser page's handshake, Origin left out
        {"Host": "127.0.0.1", "Origin": "http://attacker.example"},
        {"Host": "127.0.0.1\r\nHost: 127.0.0.1"},
    ],
)
def test_the_websocket_handshake_has_the_same_host_and_origin_rules_as_http(headers: dict[str, str]):
    with exported() as url:
        port = int(url.rsplit(":", 1)[1])
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        assert _raw(port, (UPGRADE + head + "\r\n").encode()).split(b" ")[1] in (b"403", b"400")
        assert _raw(port, (UPGRADE + "Host: 127.0.0.1\r\n\r\n").encode()).split(b" ")[1] == b"101"


def test_duplicate_host_headers_are_refused_on_every_server(fake_server):
    from atropos_cli.api.app import create_app
    from atropos_cli.api.service import ApiSettings
    from atropos_cli.httpserve import GuardedHandler, GuardedHTTPServer

    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"
    with ThreadedServer(create_app(ApiSettings())).start() as api:
        assert _raw(api.port, request).startswith(b"HTTP/1.1 400")
    with exported() as url:
        assert _raw(int(url.rsplit(":", 1)[1]), request).startswith(b"HTTP/1.1 400")
    inference = fake_server(rule="arithmetic")
    assert _raw(int(inference.base_url.split(":")[2].split("/")[0]), request).startswith(b"HTTP/1.1 400")

    class Page(GuardedHandler):  # what `atropos view --serve` runs
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

    view = GuardedHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=view.serve_forever, daemon=True).start()
    try:
        assert _raw(view.server_address[1], request).startswith(b"HTTP/1.0 400")
        assert _raw(view.server_address[1], request.replace(b"Host: attacker.example\r\n", b"")).startswith(
            b"HTTP/1.0 200"
        )
    finally:
        view.shutdown()
        view.server_close()


def test_seeds_cannot_make_the_export_server_keep_unbounded_items(monkeypatch):
    from atropos_cli.runs import openenv_export

    monkeypatch.setattr(openenv_export, "MAX_KEPT", 50)  # the total cap, small enough to reach here
    with exported() as url, _ws(url) as ws:
        ws.send(json.dumps({"type": "reset", "data": {"seed": MAX_AHEAD + 5}}))
        ahead = ws.recv(timeout=10)
        ws.send('{"type": "reset", "data": {"seed": 49}}')
        within = ws.recv(timeout=10)
        ws.send('{"type": "reset", "data": {"seed": 50}}')
        beyond = ws.recv(timeout=10)
    assert "EXECUTION_ERROR" in ahead and "only 0 are drawn so far" in ahead  # refused before drawing any
    assert '"observation"' in within
    assert "EXECUTION_ERROR" in beyond and "keeps the first 50" in beyond
    assert MAX_KEPT == 20_000


# --- clients -----------------------------------------------------------------------------------------------


@contextmanager
def hostile_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class _Drip(BaseHTTPRequestHandler):
    stop = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "100000")
        self.end_headers()
        while not self.stop.wait(0.1):  # one byte at a time, forever (until the test ends)
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return

    def log_message(self, *args: Any) -> None:
        pass


class _Huge(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()  # no Content-Length: the cap must bind as it streams
        try:
            for _ in range(64):  # 2 MiB, over the 1 MiB cap
                self.wfile.write(b" " * 32768)
        except OSError:
            return

    def log_message(self, *args: Any) -> None:
        pass


class _Redirect(BaseHTTPRequestHandler):
    target = ""

    def do_GET(self) -> None:
        self.send_response(302)
        self.send_header("Location", self.target + self.path)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


def test_the_schema_read_has_a_total_deadline_and_a_size_cap():
    _Drip.stop = threading.Event()
    try:
        with hostile_http(_Drip) as url, pytest.raises(EnvLoadError) as slow:
            fetch_schema(url, timeout_s=0.5)  # each byte comes within httpx's per-read timeout
        assert "ReadTimeout" in str(slow.value)
    finally:
        _Drip.stop.set()
    with hostile_http(_Huge) as url, pytest.raises(EnvLoadError) as huge:
        fetch_schema(url)
    assert "over the 1048576 bytes" in str(huge.value)


def test_no_redirect_is_followed_to_another_host():
    with exported() as target:
        _Redirect.target = target.replace("127.0.0.1", "localhost")  # another host name, a working server
        with hostile_http(_Redirect) as url:
            with pytest.raises(EnvLoadError) as schema:
                fetch_schema(url)
            with pytest.raises(OpenEnvError) as ws:
                asyncio.run(_open(url))
    assert "302" in str(schema.value)
    assert "redirected" in str(ws.value)


async def _open(url: str) -> None:
    async with OpenEnvSession(url, timeout_s=5) as session:
        await session.reset()


@pytest.mark.parametrize("reply", [b"[1, 2]", b"not json", b"\x00binary"])
def test_a_malformed_reply_is_one_openenv_error(reply: bytes):
    app = FastAPI()

    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:
        await socket.accept()
        await socket.receive_text()
        if reply.startswith(b"\x00"):
            await socket.send_bytes(reply)
        else:
            await socket.send_text(reply.decode())
        await socket.receive()

    with ThreadedServer(app).start() as server, pytest.raises(OpenEnvError) as error:
        asyncio.run(_open(server.url))
    assert "not a JSON object" in str(error.value) or "BINARY" in str(error.value)


def test_the_api_client_has_a_total_deadline_and_a_size_cap(monkeypatch):
    from atropos_cli.api import client as api_client
    from atropos_cli.errors import ApiUnavailableError

    async def call(url: str) -> None:
        async with api_client.ApiClient(url, timeout_s=0.5, max_wait_s=0.0) as client:
            await client.status()

    _Drip.stop = threading.Event()
    try:
        with hostile_http(_Drip) as url, pytest.raises(ApiUnavailableError) as slow:
            asyncio.run(call(url))
        assert "ReadTimeout" in str(slow.value)
    finally:
        _Drip.stop.set()
    monkeypatch.setattr(api_client, "MAX_REPLY_BYTES", 1 << 20)
    with hostile_http(_Huge) as url, pytest.raises(ApiUnavailableError) as huge:
        asyncio.run(call(url))
    assert "over the 1048576 bytes" in str(huge.value)


class _DripPost(_Drip):
    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.do_GET()


def test_the_model_client_has_a_total_deadline_and_a_size_cap(monkeypatch):
    from atropos_cli.config import ServerConfig
    from atropos_cli.errors import BadResponseError, RetryableError
    from atropos_cli.inference import openai_compat
    from atropos_cli.inference.base import SamplingParams

    async def chat(url: str) -> None:
        backend = openai_compat.OpenAICompatBackend(ServerConfig(base_url=url, model_name="m", timeout=0.5))
        try:
            await backend.chat([{"role": "user", "content": "hi"}], SamplingParams())
        finally:
            await backend.aclose()

    class _HugePost(_Huge):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.do_GET()

    _Drip.stop = threading.Event()
    try:
        with hostile_http(_DripPost) as url, pytest.raises(RetryableError) as slow:
            asyncio.run(chat(url + "/v1"))  # each byte within the 0.5 s read timeout
        assert "timed out" in str(slow.value)
    finally:
        _Drip.stop.set()
    monkeypatch.setattr(openai_compat, "MAX_REPLY_BYTES", 1 << 20)
    with hostile_http(_HugePost) as url, pytest.raises(BadResponseError) as huge:
        asyncio.run(chat(url + "/v1"))
    assert "over the 1048576 bytes" in str(huge.value)


@pytest.mark.parametrize("parser", ["auto", "h11"])
def test_a_full_server_evicts_its_idlest_keep_alive_connection(parser: str):
    from atropos_cli.api.app import create_app
    from atropos_cli.api.service import ApiSettings
    from atropos_cli.httpserve import HttpLimits

    request = b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
    server = ThreadedServer(create_app(ApiSettings()), limits=HttpLimits(max_connections=2, keep_alive_s=60))
    server.parser = parser
    with server.start():
        first = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        second = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        try:
            for conn in (first, second):  # both answered, then idle on keep-alive: first is the idlest
                conn.sendall(request)
                assert conn.recv(4096).startswith(b"HTTP/1.1 200")
            assert _raw(server.port, request.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")).startswith(
                b"HTTP/1.1 200"
            )  # a third client is served, not refused
            assert first.recv(4096) == b""  # evicted
            second.sendall(request)
            assert second.recv(4096).startswith(b"HTTP/1.1 200")
        finally:
            first.close()
            second.close()
