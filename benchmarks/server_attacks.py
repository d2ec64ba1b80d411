"""Server and client attacks: what a hostile client does to our servers, and a hostile server to our clients.

Runs each probe against real servers on 127.0.0.1 (the `atropos export openenv` app, the trajectory API) and
hostile stdlib servers for the clients, and prints a markdown table (benchmarks/results/server_attacks.md).
Bounded: every probe has a deadline; the bodies and replies are just over each limit.

    python benchmarks/server_attacks.py
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from atropos_cli.adapters.openenv.wire import OpenEnvSession, fetch_schema
from atropos_cli.api.app import create_app
from atropos_cli.api.service import ApiSettings
from atropos_cli.httpserve import WsLimits
from atropos_cli.runs.openenv_app import MAX_BODY_BYTES, create_openenv_app
from atropos_cli.runs.openenv_export import build_exported_env
from atropos_cli.testing.threaded import ThreadedServer

IDLE_SOCKETS = 200  # idle WebSockets that answer pings (the 2-core container: fewer than the 1,000 first tried)


@contextmanager
def export_server() -> Iterator[str]:
    limits = WsLimits()
    app = create_openenv_app(build_exported_env("arithmetic", ["--env.max_token_length", "16"], None), limits=limits)
    with ThreadedServer(app, lifespan="on", ws=limits).start() as server:
        yield server.url


def _raw(url: str, request: bytes) -> str:
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        return conn.recv(4096).split(b"\r\n", 1)[0].decode()


def _ws(url: str) -> Any:
    return connect(url.replace("http://", "ws://") + "/ws", open_timeout=10, close_timeout=1)


def _close_code(ws: Any) -> str:
    try:
        while True:
            ws.recv(timeout=10)
    except ConnectionClosed as exc:
        return f"closed {exc.rcvd.code if exc.rcvd else '?'}"
    except TimeoutError:
        return "still open after 10 s"


def idle_sockets(url: str) -> str:
    held = []
    try:
        for _ in range(IDLE_SOCKETS):
            held.append(_ws(url))  # the client library answers pings by itself
        started = time.perf_counter()
        with _ws(url) as fresh:
            fresh.send('{"type": "reset", "data": {}}')
            answer = fresh.recv(timeout=10)
        open_now = sum(1 for ws in held if ws.protocol.state.name == "OPEN")
        return (
            f"{IDLE_SOCKETS} idle sockets held; a new client served in {time.perf_counter() - started:.2f} s "
            f"({'observation' in answer}); {IDLE_SOCKETS - open_now} idlest evicted"
        )
    finally:
        for ws in held:
            ws.close()


def big_body(url: str) -> str:
    body = b'{"pad": "' + b"x" * MAX_BODY_BYTES + b'"}'
    answer = httpx.post(url + "/reset", content=body, headers={"Content-Type": "application/json"})
    return f"{len(body)} bytes: {answer.status_code}"


def far_seed(url: str) -> str:
    with _ws(url) as ws:
        started = time.perf_counter()
        ws.send('{"type": "reset", "data": {"seed": 100000}}')
        answer = ws.recv(timeout=30)
    return f"{'refused' if 'EXECUTION_ERROR' in answer else 'served'} in {time.perf_counter() - started:.3f} s"


def malformed_frame(url: str) -> str:
    port = int(url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(
            b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
            b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        conn.recv(4096)
        conn.sendall(b"\x8f\x80\x00\x00\x00\x00")  # reserved opcode
        frame = conn.recv(4096)
    with _ws(url) as ws:
        ws.send(b"\x00binary")
        binary = _close_code(ws)
    healthy = httpx.get(url + "/health").status_code
    closed = frame[:1] == b"\x88"
    return f"reserved opcode: close frame {closed}; binary frame: {binary}; /health {healthy}"


def handshakes(url: str) -> str:
    upgrade = (
        "GET /ws HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    )
    cross = _raw(url, (upgrade + "Host: 127.0.0.1\r\nSec-Fetch-Site: cross-site\r\n\r\n").encode())
    foreign = _raw(url, (upgrade + "Host: attacker.example\r\n\r\n").encode())
    return f"cross-site without Origin: {cross}; foreign Host: {foreign}"


def duplicate_host(url: str) -> str:
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: attacker.example\r\nConnection: close\r\n\r\n"
    return _raw(url, request)


def policy_versions() -> str:
    results = []
    with ThreadedServer(create_app(ApiSettings(max_staleness=1, stale_mode="drop"))).start() as api:
        reg = {
            "wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 64, "checkpoint_dir": "c",
            "save_checkpoint_interval": 0, "starting_step": 5, "num_steps": 100,
        }  # fmt: skip
        httpx.post(api.url + "/register", json=reg).raise_for_status()
        for label, version, per_token in (
            ("true", True, None), ('"3"', "3", None), ("-10**7", -(10**7), None), ("per token -10**9", 5, -(10**9)),
            ("10**9 (ahead)", 10**9, None), ("per token 0 under group 5", 5, 0),
        ):  # fmt: skip
            meta: dict[str, Any] = {"policy_version": version}
            if per_token is not None:
                meta["rollouts"] = [{"policy_versions": [per_token, 5]}] * 2
            group = {"tokens": [[1, 2, 3]] * 2, "masks": [[-100, 2, 3]] * 2, "scores": [0.0, 1.0], "meta": meta}
            answer = httpx.post(api.url + "/scored_data", json=group)
            status = answer.json().get("status") if answer.status_code == 200 else ""
            results.append(f"{label}: {answer.status_code} {status}".strip())
    return "; ".join(results)


@contextmanager
def hostile(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


class Endless(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        try:
            for _ in range(1 << 16):  # up to 2 GiB, 32 KiB at a time, as long as the client reads
                self.wfile.write(b" " * 32768)
        except OSError:
            return

    def log_message(self, *args: Any) -> None:
        pass


class Drip(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", "1000000")
        self.end_headers()
        try:
            for _ in range(600):  # 1 byte every 0.5 s, for 5 minutes at most
                self.wfile.write(b" ")
                self.wfile.flush()
                time.sleep(0.5)
        except OSError:
            return

    def log_message(self, *args: Any) -> None:
        pass


def _timed(call: Callable[[], Any]) -> str:
    started = time.perf_counter()
    try:
        call()
        outcome = "no error"
    except Exception as exc:  # noqa: BLE001 - the probe reports what the client raised
        outcome = f"{type(exc).__name__}: {str(exc)[:90]}"
    return f"{outcome} ({time.perf_counter() - started:.1f} s)"


def redirect(target: str) -> str:
    class Redirect(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", target.replace("127.0.0.1", "localhost") + self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    async def play(url: str) -> None:
        async with OpenEnvSession(url, timeout_s=5) as session:
            await session.reset()

    with hostile(Redirect) as url:
        return _timed(lambda: asyncio.run(play(url)))


def main() -> None:
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # sockets held open outside a with block
    rows: list[tuple[str, str]] = []
    with export_server() as url:
        rows.append((f"{IDLE_SOCKETS} idle WebSockets answering pings, then one more client", idle_sockets(url)))
        rows.append((f"POST /reset with a body just over {MAX_BODY_BYTES} bytes", big_body(url)))
        rows.append(("reset(seed=100000) on a fresh server", far_seed(url)))
        rows.append(("malformed and binary WebSocket frames", malformed_frame(url)))
        rows.append(("WebSocket handshakes a browser page could make", handshakes(url)))
        rows.append(("duplicate Host headers", duplicate_host(url)))
        rows.append(("openenv client: WebSocket handshake redirected to another host", redirect(url)))
    rows.append(("policy versions posted to the API (step 5, --max-staleness 1 --stale-mode drop)", policy_versions()))
    with hostile(Endless) as url:
        rows.append(("openenv client: GET /schema answered with endless bytes", _timed(lambda: fetch_schema(url))))
    with hostile(Drip) as url:
        rows.append(("openenv client: /schema dripped 1 byte every 0.5 s (timeout_s 3)",
                     _timed(lambda: fetch_schema(url, timeout_s=3.0))))  # fmt: skip
    print("| attack | result |\n|---|---|")
    for name, got in rows:
        print(f"| {name} | {got.replace('|', '/')} |")


if __name__ == "__main__":
    main()
