"""Run an ASGI app with uvicorn in a background thread on 127.0.0.1: the one helper tests and fakes share.
The server has the connection limits of every server we run (`httpserve.HttpLimits`).

The listening socket is bound (`httpserve.listen`, as every server's) before the thread starts (port 0: the OS
picks a free port and we hold it, so there is no race); a taken port is a `PortUnavailableError`.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from atropos_cli.httpserve import HttpLimits, WsLimits

__all__ = ["ThreadedServer"]


class ThreadedServer:
    """`with ThreadedServer(app) as server: httpx.get(server.url + "/health")`; stopped on exit."""

    def __init__(
        self, app: Any, host: str = "127.0.0.1", port: int = 0, *, lifespan: Literal["auto", "on", "off"] = "auto",
        limits: HttpLimits | None = None, ws: WsLimits | None = None,
    ) -> None:  # fmt: skip
        self.app = app
        self.limits = limits
        self.ws = ws
        self.parser = "auto"  # "h11": uvicorn's pure-Python parser even where httptools is installed
        self.host = host
        self.port = port
        self.lifespan = lifespan
        self._server: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self, timeout_s: float = 30.0) -> ThreadedServer:
        import uvicorn

        from atropos_cli.httpserve import listen, uvicorn_config

        sock = listen(self.host, self.port)
        self.port = int(sock.getsockname()[1])
        config = uvicorn_config(
            self.app, self.limits, self.parser, self.ws, log_level="warning", access_log=False, lifespan=self.lifespan,
            timeout_graceful_shutdown=2,
        )  # fmt: skip
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name=f"server-{self.port}", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def request_stop(self) -> None:
        """Ask the server to shut down without waiting (stop several at once, then `stop()` each)."""
        if self._server is not None:
            self._server.should_exit = True

    def stop(self) -> None:
        self.request_stop()
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None

    def __enter__(self) -> ThreadedServer:
        return self if self.running else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
