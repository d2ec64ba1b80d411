"""Test helpers that ship with the package: a real OpenAI-compatible fake inference server and `free_port()`.

`FakeInferenceServer` (in `fake_server.py`) is what client, router, rollout and benchmark tests talk to over
real HTTP. It is imported lazily here so that `import atropos_cli.testing` does not pull in FastAPI/uvicorn.
"""

from __future__ import annotations

import socket
from typing import Any

__all__ = ["FakeInferenceServer", "free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now (the OS picks it; bind to it soon, another process could too)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def __getattr__(name: str) -> Any:
    if name == "FakeInferenceServer":
        from atropos_cli.testing.fake_server import FakeInferenceServer

        return FakeInferenceServer
    raise AttributeError(f"module 'atropos_cli.testing' has no attribute {name!r}")
