"""Every server we run refuses a DNS-rebinding request (a foreign Host), parses Origin exactly, and holds
against slow and oversized requests: `atropos api`, `atropos inference` (the fake backend: the same app),
`atropos view --serve`; the uvicorn ones with both HTTP parsers (httptools and h11)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import httpx
import pytest

from atropos_cli.api.app import create_app as create_api
from atropos_cli.api.service import ApiSettings
from atropos_cli.httpguard import HostPolicy, is_loopback_name
from atropos_cli.httpserve import HttpLimits, protocol_class
from atropos_cli.testing.fake_server import FakeInferenceServer, build_app
from atropos_cli.testing.threaded import ThreadedServer

FOREIGN = "attacker.example"
FAST = HttpLimits(header_timeout_s=1.0, body_timeout_s=1.5, keep_alive_s=1, max_connections=8)


@contextmanager
def _view_server(tmp_path: Path, limits: HttpLimits = FAST) -> Iterator[str]:
    from atropos_cli.cli.view import _ViewServer

    (tmp_path / "groups.jsonl").write_text("")
    server = _ViewServer(("127.0.0.1", 0), [str(tmp_path)], tmp_path / "index.html", None, [])
    server.limits = limits
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _servers(tmp_path: Path, h11: bool = False) -> Iterator[dict[str, str]]:
    """The api and the inference app (fake backend) on uvicorn with FAST limits, plus view --serve."""
    fake = FakeInferenceServer()
    urls: dict[str, str] = {}
    started: list[ThreadedServer] = []
    try:
        for name, app, path in (
            ("api", create_api(ApiSettings()), "/health"),
            ("inference", build_app(fake), "/health"),
        ):
            server = ThreadedServer(app, limits=FAST)
            server.parser = "h11" if h11 else "auto"
            started.append(server.start())
            urls[name] = server.url + path
        with _view_server(tmp_path) as view:
            urls["view"] = view + "/"
            yield urls
    finally:
        for server in started:
            server.stop()


def _closed_within(sock: socket.socket, deadline_s: float) -> bool:
    """True when the server closes `sock` (recv gives b'' or a reset) within deadline_s."""
    sock.settimeout(deadline_s)
    end = time.monotonic() + deadline_s
    try:
        while time.monotonic() < end:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    return False


def _raw(url: str, head: bytes) -> bytes:
    """Send a raw request head to url's server and return everything it answers until it closes."""
    port = int(url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        with suppress(ConnectionResetError, BrokenPipeError):
            sock.sendall(head)
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def test_loopback_names_are_exact() -> None:
    assert is_loopback_name("127.0.0.1") and is_loopback_name("127.5.6.7") and is_loopback_name("[::1]")
    assert is_loopback_name("LOCALHOST.")
    for name in ("127.0.0.1.attacker.example", "127.attacker.example", "localhost.attacker.example", "10.0.0.1"):
        assert not is_loopback_name(name), name
    policy = HostPolicy("127.0.0.1")
    assert policy.allows_host("127.0.0.1:8000") and policy.allows_host("localhost") and policy.allows_host(None)
    assert not policy.allows_host("attacker.example:8000") and not policy.allows_host("127.0.0.1.attacker.example")
    assert not policy.allows_host("localhost:8000:junk")
    assert not policy.allows_origin("http://127.0.0.1.attacker.example:8000")
    assert policy.allows_origin("http://localhost:3000") and not policy.allows_origin("null")
    assert HostPolicy("0.0.0.0").allows_host("192.168.1.20:9001") and not HostPolicy("0.0.0.0").allows_host(FOREIGN)
    assert HostPolicy("127.0.0.1", ["gpu-box"]).allows_host("gpu-box:8000")
    assert HostPolicy("127.0.0.1", ["*"]).allows_host(FOREIGN)


@pytest.mark.parametrize("h11", [False, True], ids=["httptools", "h11"])
def test_rebinding_and_foreign_origins_are_refused_by_every_server(tmp_path: Path, h11: bool) -> None:
    with _servers(tmp_path, h11) as urls:
        for name, url in urls.items():
            assert httpx.get(url).status_code == 200, name
            assert httpx.get(url, headers={"Host": "localhost"}).status_code == 200, name
            rebound = httpx.get(url, headers={"Host": f"{FOREIGN}:8000"})
            assert rebound.status_code == 403, (name, rebound.text)
            assert "Host" in rebound.text, name
            tricky = httpx.get(url, headers={"Origin": "http://127.0.0.1.attacker.example"})
            assert tricky.status_code == 403, (name, tricky.text)
            assert httpx.get(url, headers={"Origin": "http://127.0.0.1:5173"}).status_code == 200, name
        # the rebinding page's writes: reset, weights swap
        api_root = urls["api"].removesuffix("/health")
        reset = httpx.get(api_root + "/reset_data", headers={"Host": FOREIGN})
        assert reset.status_code == 403 and "Reset successful" not in reset.text
        reload = httpx.post(
            urls["inference"].removesuffix("/health") + "/reload_weights", json={"path": str(tmp_path)},
            headers={"Host": FOREIGN},
        )  # fmt: skip
        assert reload.status_code == 403


@pytest.mark.parametrize("h11", [False, True], ids=["httptools", "h11"])
def test_slow_and_oversized_heads_are_cut_off(tmp_path: Path, h11: bool) -> None:
    with _servers(tmp_path, h11) as urls:
        for name, url in urls.items():
            port = int(url.split(":")[2].split("/")[0])
            # half-open: connected, nothing sent
            idle = socket.create_connection(("127.0.0.1", port))
            # slowloris: a head that trickles in, one header every 0.3 s, never finished
            slow = socket.create_connection(("127.0.0.1", port))
            slow.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            stop = threading.Event()

            def trickle(sock: socket.socket = slow, stop: threading.Event = stop) -> None:
                while not stop.wait(0.3):
                    try:
                        sock.sendall(b"X-a: b\r\n")
                    except OSError:
                        return

            feeder = threading.Thread(target=trickle, daemon=True)
            feeder.start()
            # an idle keep-alive connection after one complete request
            kept = socket.create_connection(("127.0.0.1", port))
            path = url.split(str(port), 1)[1]
            kept.sendall(b"GET " + path.encode() + b" HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            try:
                assert _closed_within(kept, 8), f"{name}: an idle keep-alive connection stayed open"
                assert _closed_within(idle, 8), f"{name}: a half-open connection stayed open"
                assert _closed_within(slow, 8), f"{name}: a slowloris head stayed open"
            finally:
                stop.set()
                kept.close()
                idle.close()
                slow.close()
            huge = _raw(url, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-big: " + b"a" * 1_000_000 + b"\r\n\r\n")
            assert huge.split(b" ", 2)[1] in (b"400", b"431"), (name, huge[:200])
            many = b"".join(b"X-%d: v\r\n" % i for i in range(5000))
            flood = _raw(url, b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n" + many + b"\r\n")
            assert flood.split(b" ", 2)[1] in (b"400", b"431"), (name, flood[:200])
            assert httpx.get(url).status_code == 200, f"{name} stopped answering"


def test_a_slow_body_is_cut_off_but_a_slow_answer_is_not(tmp_path: Path) -> None:
    fake = FakeInferenceServer(latency_s=2.5)  # the app takes longer than both deadlines to answer
    with ThreadedServer(build_app(fake), limits=FAST) as server:
        chat = {"model": "m", "messages": [{"role": "user", "content": "What is 1 + 1?"}]}
        assert httpx.post(server.url + "/v1/chat/completions", json=chat, timeout=30).status_code == 200
        slow = socket.create_connection(("127.0.0.1", server.port))
        slow.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100000\r\n\r\n{"
        )
        stop = threading.Event()

        def trickle() -> None:
            while not stop.wait(0.3):
                try:
                    slow.sendall(b" ")
                except OSError:
                    return

        threading.Thread(target=trickle, daemon=True).start()
        try:
            assert _closed_within(slow, 8), "a body trickling in stayed open"
        finally:
            stop.set()
            slow.close()


def test_the_connection_cap_keeps_real_clients_served(tmp_path: Path) -> None:
    limits = HttpLimits(header_timeout_s=30, max_connections=4)
    with ThreadedServer(create_api(ApiSettings()), limits=limits) as server:
        held = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(4)]
        try:
            request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
            held[1].sendall(request + b"GET /health HTTP/1.1\r\n")  # answered, then mid-request: never evicted
            for sock in held[1:]:  # answered (so read by the server) after held[0] opened: held[0] is the idlest
                if sock is not held[1]:
                    sock.sendall(request)
                assert sock.recv(4096).startswith(b"HTTP/1.1 200")
            extra = socket.create_connection(("127.0.0.1", server.port))
            assert _closed_within(held[0], 5), "the idlest connection was not evicted for a new one"
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            assert extra.recv(4096).startswith(b"HTTP/1.1 200")  # the new client is served
            extra.close()
            for sock in held[2:]:  # every slot mid-request: none may be evicted, so one more is refused
                sock.sendall(b"GET /health HTTP/1.1\r\n")
            last = socket.create_connection(("127.0.0.1", server.port))
            last.sendall(request + b"GET /health HTTP/1.1\r\n")  # answered, then mid-request itself
            assert last.recv(4096).startswith(b"HTTP/1.1 200")  # the server has read every byte sent so far
            late = socket.create_connection(("127.0.0.1", server.port))
            assert _closed_within(late, 5), "a connection past --max-connections was kept while all were busy"
            for sock in (last, late):
                sock.close()
        finally:
            for sock in held:
                sock.close()
        deadline = time.monotonic() + 10
        while True:  # the held ones are gone once the server has seen them close
            try:
                if httpx.get(server.url + "/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server never served again"


def test_h11_is_the_fallback_parser() -> None:
    from uvicorn.protocols.http.h11_impl import H11Protocol

    assert not issubclass(protocol_class(FAST), H11Protocol)  # httptools is installed (the api extra)


FAKE_VLLM = """
import argparse, importlib
import uvicorn
from fastapi import FastAPI

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int)
parser.add_argument("--middleware", action="append", default=[])
known, _ = parser.parse_known_args()
app = FastAPI()
loaded = []


@app.get("/health")
def health():
    return {"middleware": loaded}


@app.post("/collective_rpc")
def collective_rpc():
    return {"reloaded": True}


for path in known.middleware:  # what vLLM's api_server does with --middleware
    module, name = path.rsplit(".", 1)
    imported = importlib.import_module(module)
    loaded.append(imported.__file__)
    app.add_middleware(getattr(imported, name))
uvicorn.run(app, host=known.host, port=known.port, log_level="warning")
"""


def test_the_vllm_server_we_launch_loads_the_guard(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from atropos_cli.trainer.weights.vllm import VLLMServer

    module = tmp_path / "fakevllm" / "vllm" / "entrypoints" / "openai" / "api_server.py"
    module.parent.mkdir(parents=True)
    module.write_text(FAKE_VLLM)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "fakevllm"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = VLLMServer("atropos-tiny-arith", sys.executable, port, 60, tmp_path / "run")
    server.start()
    try:
        loaded = httpx.get(server.root_url + "/health").json()["middleware"]
        assert loaded and loaded[0].startswith(str(tmp_path / "run" / ".vllm-guard")), loaded
        rebound = httpx.post(server.root_url + "/collective_rpc", json={}, headers={"Host": FOREIGN})
        assert rebound.status_code == 403 and "Host" in rebound.json()["error"]["message"]
        page = httpx.post(server.root_url + "/collective_rpc", json={}, headers={"Origin": "http://evil.example"})
        assert page.status_code == 403
        assert httpx.post(server.root_url + "/collective_rpc", json={}).json() == {"reloaded": True}
    finally:
        server.stop()
