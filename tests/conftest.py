"""Shared fixtures. Keep each one small and documented; append new ones at the end.

- `fake_server(**kwargs)`: start a real OpenAI-compatible `FakeInferenceServer` on 127.0.0.1 (a free port);
  every server started through it is stopped when the test ends.
- `free_port()`: a port nobody listens on (import it from `atropos_cli.testing`).
- `cuda`: the GPU suite's device ("cuda"); a test that takes it is skipped without CUDA and is part of
  `pytest -m gpu` (marked `gpu` automatically). `two_cudas`: the same, for checks that need 2 GPUs.
  docs/testing.md says how to run the suite.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from atropos_cli.testing import free_port

__all__ = ["free_port"]


@pytest.fixture
def fake_server() -> Iterator[Callable[..., Any]]:
    """Factory: `srv = fake_server(rule="arithmetic", latency_s=0.1)`; `srv.base_url` ends in /v1."""
    from atropos_cli.testing.fake_server import FakeInferenceServer

    started: list[FakeInferenceServer] = []

    def start(*args: Any, **kwargs: Any) -> FakeInferenceServer:
        server = FakeInferenceServer(*args, **kwargs).start()
        started.append(server)
        return server

    yield start
    for server in started:  # shut down in parallel: each one takes a few uvicorn ticks
        server.request_stop()
    for server in started:
        server.stop()


@pytest.fixture
def trajectory_api() -> Iterator[Callable[..., Any]]:
    """Factory: `api = trajectory_api(api_key="k")` runs our `atropos api` app (in memory) on 127.0.0.1 in a
    thread; `api.url` is its base URL. Every server started through it is stopped when the test ends."""
    from atropos_cli.api.app import create_app
    from atropos_cli.api.service import ApiSettings
    from atropos_cli.testing.threaded import ThreadedServer

    started: list[ThreadedServer] = []

    def start(**settings: Any) -> ThreadedServer:
        server = ThreadedServer(create_app(ApiSettings(**settings)), lifespan="on").start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


def _cuda_count() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture
def cuda() -> str:
    """The CUDA device for a GPU-suite test; skips where there is none."""
    if _cuda_count() < 1:
        pytest.skip("needs a CUDA device (the GPU suite: pytest -m gpu tests/gpu)")
    return "cuda"


@pytest.fixture
def two_cudas() -> list[str]:
    """Two CUDA devices for a multi-GPU check; skips with fewer."""
    if _cuda_count() < 2:
        pytest.skip(f"needs 2 CUDA devices, this machine has {_cuda_count()}")
    return ["cuda:0", "cuda:1"]


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that takes `cuda` or `two_cudas` is in the GPU suite: marked `gpu` before `-m` selects."""
    for item in items:
        if {"cuda", "two_cudas"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True, scope="session")
def _compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Compiles of the tests' engines go to a session directory, never the user's cache (compile_cache.py)."""
    import os

    os.environ.setdefault("ATROPOS_COMPILE_CACHE", str(tmp_path_factory.mktemp("compile-cache")))
    yield
