"""`--inference vllm`: launch, supervise and restart a vLLM OpenAI server that the env workers sample from.

Where it sits: `run.py` enters `VLLMServer(model, python, port)` (a context manager: the child process is
stopped on every exit path, Ctrl-C included) and passes `VLLMSync` to the loop as its after-step hook.
vLLM usually lives in its own venv (`--vllm-python /path/to/venv/bin/python`); we only speak HTTP to it.

Sync: every `every` steps the trainer writes OUT/checkpoints/step-N and the server is restarted on it,
under the same served model name, so env requests keep working. (vLLM's in-place weight-update endpoints
differ between versions and need dev mode; restart-from-checkpoint works with every version.) Every wait
has a timeout and an error that says what to check: the server's log is OUT/vllm.log.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from atropos_cli.errors import InferenceError
from atropos_cli.resources import resolve_model_path

__all__ = ["VLLMServer", "VLLMSync", "SERVED_NAME"]

SERVED_NAME = "policy"


class VLLMServer:
    def __init__(
        self,
        model: str,
        python: str | None,
        port: int,
        timeout: float,
        log_dir: Path | None = None,
        extra_args: list[str] | None = None,
    ):
        self.python = python or os.environ.get("ATROPOS_VLLM_PYTHON") or sys.executable
        self.model, self.port, self.timeout = resolve_model_path(model), port, timeout
        self.base_url = f"http://127.0.0.1:{port}/v1"
        self.served_name = SERVED_NAME
        self.log_path = (log_dir or Path(".")) / "vllm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.extra_args = list(extra_args or [])  # e.g. --gpu-memory-utilization 0.3 on a small CPU box

    def command(self, model: str) -> list[str]:
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--dtype",
            "bfloat16",
            *self.extra_args,
        ]

    def start(self, model: str | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        # own process group, so stop() ends vLLM's workers too and a Ctrl-C in our terminal reaches us first
        self.proc = subprocess.Popen(
            self.command(model or self.model), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        health = self.base_url.removesuffix("/v1") + "/health"
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise InferenceError(
                    f"vLLM exited with code {self.proc.returncode} while starting",
                    hint=f"see {self.log_path}; check --vllm-python {self.python!r} has vllm installed",
                )
            try:
                if httpx.get(health, timeout=2.0).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        self.stop()
        raise InferenceError(
            f"vLLM did not become healthy on port {self.port} within {self.timeout:.0f}s",
            hint=f"see {self.log_path}; a slow machine may need a longer --vllm-timeout",
        )

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)

    def restart(self, model: str) -> None:
        self.stop()
        self.start(model)
        self.restarts += 1

    def __enter__(self) -> VLLMServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class VLLMSync:
    """Checkpoint + restart every `every` steps; returns the step's sync metrics."""

    def __init__(self, server: VLLMServer, out: Path, every: int) -> None:
        self.server, self.out, self.every = server, out, max(1, every)

    def __call__(self, trainer: Any) -> dict[str, Any]:
        if trainer.step_count % self.every:
            return {}
        started = time.perf_counter()
        path = trainer.save(self.out)
        self.server.restart(str(path))
        return {"sync_s": time.perf_counter() - started, "synced_checkpoint": str(path)}
