"""`--inference vllm`: launch and supervise a vLLM OpenAI server, and sync the trainer's weights into it.

Where it sits: `run.py` enters `VLLMServer(...)` (a context manager: the child process is stopped on every exit
path, Ctrl-C included) and passes `VLLMSync` to the loop as its after-step hook. vLLM usually lives in its own
venv (`--vllm-python /path/to/venv/bin/python`); we only speak HTTP to it. Its log is OUT/vllm.log.

Sync modes (`--vllm-sync`), every `every` steps after the trainer writes OUT/checkpoints/step-N:
- `reload`: pause generation (mode=wait), have every worker reload the checkpoint in place (`/collective_rpc
  reload_weights`), reset the prefix cache (KV computed by the old weights must not be reused), set the weight
  version to the step, resume. Same process, no restart: ~0.1 s on the shipped model. Needs vLLM's dev
  endpoints, which we switch on in the child's env (VLLM_SERVER_DEV_MODE=1; bound to 127.0.0.1, and vLLM loads
  our `httpguard.LoopbackGuard` with `--middleware`, so a browser page, DNS rebinding included, cannot call them).
- `restart`: stop the server and start it on the checkpoint, under the same served name (every version).
- `auto` (default): `reload` when the server answers GET /is_paused, else `restart`. One exception, measured on
  vLLM 0.32's CPU backend: a model with tied word embeddings keeps its old LM head after an in-place reload
  (the CPU kernels pack a copy of it that reload never refreshes), so there `auto` restarts and `reload` is
  refused. Untied models reload exactly (served logprobs equal a restart's, tested); GPU builds do not pack
  weights this way, so the rule applies to CPU servers only (not tested on a GPU here).
With LoRA (`trainer.is_lora`) the base is served as `policy-base` and the adapter as `policy` (the name the env
workers request); each sync writes OUT/adapters/step-N and replaces the adapter in place through
`/v1/load_lora_adapter` (`load_inplace`), from a new path each time so vLLM drops its cached KV for it.
If a reload fails, the error names the step, the endpoint, the HTTP status and the saved checkpoint, and we
always try /resume so the server is not left paused.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import httpx

from atropos_cli import httpguard
from atropos_cli.errors import ConfigError, InferenceError
from atropos_cli.resources import resolve_model_path

from .vllm_endpoints import EndpointError, VLLMEndpoints

__all__ = ["VLLMServer", "VLLMSync", "SERVED_NAME", "BASE_NAME", "SyncMode", "vllm_lora_rank"]

SERVED_NAME = "policy"  # what the env workers request: the full model, or the LoRA adapter on the base
BASE_NAME = "policy-base"  # with LoRA, the base model's own name
SyncMode = Literal["reload", "restart", "auto"]
# vLLM 0.32's --max-lora-rank accepts only these (vllm/config/lora.py MaxLoRARanks)
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
_KEEP_ADAPTERS = 2  # the adapter being served and the one before it
GUARD = "atropos_cli.httpguard.LoopbackGuard"  # vLLM's --middleware: loopback Host and Origin only


def vllm_lora_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds an adapter of rank `rank`."""
    for allowed in VLLM_LORA_RANKS:
        if allowed >= rank:
            return allowed
    raise ConfigError(f"LoRA rank {rank!r} is above vLLM's largest --max-lora-rank", hint="use lora_r <= 512")


class VLLMServer:
    def __init__(
        self,
        model: str,
        python: str | None,
        port: int,
        timeout: float,
        log_dir: Path | None = None,
        extra_args: list[str] | None = None,
        lora_adapter: Path | None = None,
        lora_rank: int = 16,
    ):
        self.python = python or os.environ.get("ATROPOS_VLLM_PYTHON") or sys.executable
        self.model, self.port, self.timeout = resolve_model_path(model), port, timeout
        self.root_url = f"http://127.0.0.1:{port}"
        self.base_url = self.root_url + "/v1"
        self.served_name = SERVED_NAME
        self.log_path = (log_dir or Path(".")) / "vllm.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self.extra_args = list(extra_args or [])  # e.g. --gpu-memory-utilization 0.3 on a small CPU box
        self.lora_adapter = lora_adapter  # set: serve the base as BASE_NAME and this adapter as SERVED_NAME
        self.lora_rank = vllm_lora_rank(lora_rank)

    @property
    def is_lora(self) -> bool:
        return self.lora_adapter is not None

    def command(self, model: str) -> list[str]:
        lora = []
        if self.lora_adapter is not None:
            lora = ["--enable-lora", "--max-lora-rank", str(self.lora_rank)]
            lora += ["--lora-modules", f"{SERVED_NAME}={self.lora_adapter}"]
        return [
            self.python,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--served-model-name",
            BASE_NAME if self.is_lora else self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--enforce-eager",
            "--dtype",
            "bfloat16",
            "--middleware",
            GUARD,
            *lora,
            *self.extra_args,
        ]

    def guard_dir(self) -> Path:
        """A directory holding only a link to our package, first on the child's PYTHONPATH: vLLM (in its own
        venv) imports `GUARD` from it, so a DNS-rebinding page cannot reach the dev endpoints (which can
        reload weights) or the generation routes. `atropos_cli/__init__` imports nothing; the guard needs only
        starlette, which vLLM has."""
        folder = self.log_path.parent / ".vllm-guard"
        folder.mkdir(parents=True, exist_ok=True)
        link = folder / "atropos_cli"
        target = Path(httpguard.__file__).resolve().parent  # the atropos_cli package directory
        if not (link.is_symlink() and link.resolve() == target):
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(target, target_is_directory=True)
        return folder

    def child_env(self) -> dict[str, str]:
        """Our env plus the switches for the weight-update endpoints and the path to our Host/Origin guard (the
        child's env only, never ours)."""
        path = os.pathsep.join(p for p in (str(self.guard_dir()), os.environ.get("PYTHONPATH", "")) if p)
        env = {**os.environ, "VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": path}
        if self.is_lora:
            env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
        return env

    def start(self, model: str | None = None) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = self.log_path.open("ab")
        # own process group, so stop() ends vLLM's workers too and a Ctrl-C in our terminal reaches us first
        self.proc = subprocess.Popen(
            self.command(model or self.model),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=self.child_env(),
        )
        log.close()
        self._wait_healthy()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                raise InferenceError(
                    f"vLLM exited with code {self.proc.returncode} while starting",
                    hint=f"see {self.log_path}; check --vllm-python {self.python!r} has vllm installed",
                )
            try:
                if httpx.get(self.root_url + "/health", timeout=2.0).status_code == 200:
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
    """After-step hook: every `every` steps, put the trainer's weights into the vLLM server (see the modes above).

    The mode is settled here, before any training step: `auto` probes the server once, and `reload` is refused
    where it cannot work (no dev endpoints) or would serve stale weights (the CPU caveat below)."""

    def __init__(self, server: VLLMServer, out: Path, every: int, mode: SyncMode = "auto") -> None:
        self.server, self.out, self.every = server, out, max(1, every)
        self.endpoints = VLLMEndpoints(server.root_url, server.timeout)
        self.dev_mode = self.endpoints.has_dev_mode()
        self.reason = self._why_not_reload() if not server.is_lora else None
        if mode == "reload" and self.reason:
            raise InferenceError(
                f"--vllm-sync reload: {self.reason}",
                hint="use --vllm-sync restart (or auto, which picks restart here)",
            )
        self.mode: Literal["reload", "restart"] = "restart" if mode == "restart" or self.reason else "reload"

    def _why_not_reload(self) -> str | None:
        if not self.dev_mode:
            return (
                f"the vLLM server on port {self.server.port} has no weight-reload endpoints (GET /is_paused is not "
                "found; they need vLLM >= 0.11 started with VLLM_SERVER_DEV_MODE=1)"
            )
        # vLLM 0.32's CPU backend packs a private copy of each linear weight at load time; an in-place reload
        # re-packs the layers it loads, but a tied LM head loads nothing (it shares the embedding), so it keeps
        # sampling from the step-0 head (measured: answers differ from a restart on the same checkpoint).
        if _ties_embeddings(self.server.model) and self.endpoints.device() == "cpu":
            return (
                "vLLM's CPU backend keeps a stale LM head after an in-place reload of a model with tied word "
                f"embeddings ({self.server.model!r} ties them)"
            )
        return None

    def describe(self) -> str:
        """One line for the console: how weights will reach vLLM, and why when it is not the default choice."""
        if self.server.is_lora:
            return f"vLLM weight sync: LoRA adapter {SERVED_NAME!r} replaced in place every {self.every} step(s)"
        line = f"vLLM weight sync: {self.mode} every {self.every} step(s)"
        return line + (f" ({self.reason})" if self.reason else "")

    def __call__(self, trainer: Any) -> dict[str, Any]:
        step = trainer.step_count
        if step % self.every:
            return {}
        started = time.perf_counter()
        if getattr(trainer, "is_lora", False) and self.server.is_lora:
            path, mode = self._sync_adapter(trainer, step), "lora"
        else:
            path, mode = trainer.save(self.out), self.mode
            if mode == "reload":
                self._reload(path, step)
            else:
                self.server.restart(str(path))
                if self.dev_mode:  # a fresh server reports version "default"; say which step it serves
                    self._set_version(step, path)
        return {
            "sync_s": time.perf_counter() - started,
            "sync_mode": mode,
            "weight_version": step,
            "synced_checkpoint": str(path),
        }

    def _reload(self, path: Path, step: int) -> None:
        """pause -> reload in place -> reset prefix cache -> set version -> resume (resume on every path)."""
        try:
            self.endpoints.pause()
            self.endpoints.reload_weights(str(Path(path).resolve()))
            self.endpoints.reset_prefix_cache()
            self.endpoints.update_weight_version(str(step))
        except EndpointError as exc:
            self._resume_quietly()
            raise self._failure(exc, step, path) from None
        try:
            self.endpoints.resume()
        except EndpointError as exc:
            raise self._failure(exc, step, path) from None

    def _sync_adapter(self, trainer: Any, step: int) -> Path:
        # a new path per step: vLLM keeps prefix-cache blocks of an adapter reloaded from the same path
        path = trainer.save_adapter(self.out / "adapters" / f"step-{step}")
        try:
            self.endpoints.load_lora(SERVED_NAME, str(Path(path).resolve()))
            if self.dev_mode:
                self.endpoints.reset_prefix_cache()
                self.endpoints.update_weight_version(str(step))
        except EndpointError as exc:
            raise self._failure(exc, step, path) from None
        _prune_adapters(self.out / "adapters", keep=_KEEP_ADAPTERS)
        return Path(path)

    def _set_version(self, step: int, path: Path) -> None:
        try:
            self.endpoints.update_weight_version(str(step))
        except EndpointError as exc:
            raise self._failure(exc, step, path) from None

    def _resume_quietly(self) -> None:
        # the first error is the one to report; a failed /resume here only means the server is gone too
        with contextlib.suppress(EndpointError):
            self.endpoints.resume()

    def _failure(self, exc: EndpointError, step: int, path: Path) -> InferenceError:
        status = f"HTTP {exc.status}" if exc.status is not None else "no response"
        return InferenceError(
            f"weight sync of step {step} failed at {exc.endpoint} ({status}): {exc.detail[:200]!r}; "
            f"the weights are saved at {str(path)!r}",
            hint=f"see {self.server.log_path} (a failed reload can stop vLLM's engine); continue with --resume, "
            "or use --vllm-sync restart",
        )


def _ties_embeddings(model: str) -> bool:
    """Whether the model's config ties the LM head to the embeddings (transformers' default: yes)."""
    config = Path(model) / "config.json"
    if not config.is_file():  # a hub id: not looked up offline; assume the default
        return True
    data = json.loads(config.read_text())
    return bool(data.get("tie_word_embeddings", (data.get("text_config") or {}).get("tie_word_embeddings", True)))


def _prune_adapters(root: Path, keep: int) -> None:
    steps = sorted((int(p.name.split("-")[-1]), p) for p in root.glob("step-*") if p.name[5:].isdigit())
    for _, old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
