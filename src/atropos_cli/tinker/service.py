"""The Tinker service: sessions, training clients (slots), checkpoints on disk, and futures.

Every call that the SDK treats as a future (create_model, forward_backward, optim_step, save/load weights,
sample) gets a request id at once; training work runs in order on one worker thread (so a client's calls
apply in the order it sent them and two clients' calls never interleave inside one), sampling runs on the
samplers' own engines. `retrieve_future` waits a while for the result, then answers `try_again`.

Checkpoints live under the state directory, named by their `tinker://` path, so a restarted server (same
--state-dir) loads and samples from every path it handed out before.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import queue
import re
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from atropos_cli.errors import ApiRequestError
from atropos_cli.tinker import losses
from atropos_cli.tinker.errors import invalid, not_found
from atropos_cli.tinker.protowire import WireForwardBackward, write_forward_backward_output
from atropos_cli.tinker.replicas import Replicated
from atropos_cli.tinker.slots import Host, SlotSpec
from atropos_cli.tinker.wire import CreateModel, LoadWeights, OptimStep, Sample, SaveWeights

log = logging.getLogger(__name__)
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
SESSION_TIMEOUT_S = 120.0  # the SDK heartbeats every 10 s
WAIT_S = 20.0  # how long retrieve_future holds a request open before answering try_again
KEPT_FUTURES = 100_000  # answers kept for polls (a sampled batch is kilobytes)


@dataclass
class Future:
    event: asyncio.Event
    result: dict[str, Any] | bytes | None = None  # JSON, or protobuf bytes


@dataclass
class Run:
    """A training client: its model id, base model and slot spec."""

    model_id: str
    base_model: str
    spec: SlotSpec
    sampler_seq: int = 0
    snapshot_key: str = ""  # the sampler of its latest unnamed snapshot


@dataclass
class Settings:
    model_dir: str
    model_name: str
    state_dir: Path
    device: str = "cpu"
    max_slots: int = 8
    seed: int = 0  # the seeds of sampling requests that send none, in order
    # An unnamed snapshot (save_weights_and_get_sampling_client) overwrites the client's previous one in place:
    # its engine keeps its compiled step and CUDA graphs, and the older sampling client samples the new weights.
    # None: on CUDA only (a new engine costs a compile there; on CPU nothing).
    reuse_snapshots: bool | None = None
    dist: Any = None  # the process group of --nproc-per-node ranks (trainer.scale.distributed.Dist); None: one

    @property
    def reuses_snapshots(self) -> bool:
        return self.reuse_snapshots if self.reuse_snapshots is not None else self.device.startswith("cuda")


@dataclass
class Service:
    settings: Settings
    host: Host | Replicated = field(init=False)
    runs: dict[str, Run] = field(default_factory=dict)
    sessions: dict[str, float] = field(default_factory=dict)  # open session -> when it was last heard from
    futures: dict[str, Future] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from atropos_cli.tinker.sampling import Samplers

        host = Host(self.settings.model_dir, self.settings.device, self.settings.max_slots)
        dist = self.settings.dist
        self.host = Replicated(host, dist) if dist is not None and dist.world > 1 else host
        self.samplers = Samplers(self.host.tokenizer, self.settings.device, self.host.max_len, self.settings.seed)
        self.sampler_sessions: dict[str, str] = {}  # sampling session id -> sampler key
        self._jobs: queue.Queue[tuple[Callable[[], Any], concurrent.futures.Future[Any]] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="tinker-trainer", daemon=True)
        self._worker.start()
        self.settings.state_dir.mkdir(parents=True, exist_ok=True)

    # -- futures ---------------------------------------------------------------------------------------
    def _new_future(self) -> tuple[str, Future]:
        request_id = uuid.uuid4().hex
        future = Future(asyncio.Event())
        self.futures[request_id] = future
        while len(self.futures) > KEPT_FUTURES:  # the oldest answers go first (dicts keep insertion order)
            del self.futures[next(iter(self.futures))]
        return request_id, future

    def in_worker(self, job: Callable[[], Any]) -> Awaitable[Any]:
        """`job()` run on the training worker, after every job queued before it."""
        done: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self._jobs.put((job, done))
        return asyncio.wrap_future(done)

    def submit(self, job: Callable[[], dict[str, Any] | bytes], model_id: str | None = None) -> dict[str, Any]:
        """Queue `job` for the training worker; the SDK's UntypedAPIFuture."""
        return {**self.submit_async(lambda: self.in_worker(job)), "model_id": model_id}

    def submit_async(self, job: Callable[[], Awaitable[dict[str, Any] | bytes]]) -> dict[str, Any]:
        """Run `job` on the event loop; the SDK's UntypedAPIFuture."""
        request_id, future = self._new_future()

        async def run() -> None:
            future.result = await _outcome_async(job)
            future.event.set()

        task = asyncio.get_running_loop().create_task(run())
        future.task = task  # type: ignore[attr-defined]  # kept referenced until done
        return {"request_id": request_id}

    def _work(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                if isinstance(self.host, Replicated):
                    self.host.stop()
                return
            job, done = item
            try:
                done.set_result(job())
            except Exception as exc:  # the failure becomes the future's answer; the worker keeps serving
                done.set_exception(exc)

    async def retrieve(self, request_id: str) -> dict[str, Any] | bytes:
        future = self.futures.get(request_id)
        if future is None:
            raise not_found(f"no request {request_id!r} on this server", hint="a restart forgets pending requests")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(future.event.wait(), WAIT_S)
        if future.result is None:
            return {"type": "try_again", "request_id": request_id, "queue_state": "active"}
        return future.result  # kept: a poll whose answer was lost on the way is asked again

    async def aclose(self) -> None:
        self._jobs.put(None)
        await asyncio.get_running_loop().run_in_executor(None, self._worker.join, 30)
        await self.samplers.aclose()

    # -- sessions and models ---------------------------------------------------------------------------
    def create_session(self) -> str:
        session_id = uuid.uuid4().hex[:16]
        self.sessions[session_id] = time.monotonic()
        return session_id

    def heartbeat(self, session_id: str) -> bool:
        """False for a session this server does not have open (finished, expired, or before a restart)."""
        if session_id not in self.sessions:
            return False
        self.sessions[session_id] = time.monotonic()
        return True

    async def finish_session(self, session_id: str) -> None:
        """The session's training clients give their slots back (their saved checkpoints stay)."""
        self.sessions.pop(session_id, None)
        await self.in_worker(lambda: self._release(session_id))

    def _release(self, session_id: str) -> None:
        for model_id in [m for m in self.runs if m.startswith(session_id + ":train:")]:
            self.host.remove(model_id)
            self.runs.pop(model_id, None)

    def _expire_sessions(self) -> None:
        """Sessions silent for SESSION_TIMEOUT_S (their client died without finishing) close, freeing slots."""
        now = time.monotonic()
        for session_id in [s for s, seen in self.sessions.items() if now - seen > SESSION_TIMEOUT_S]:
            self.sessions.pop(session_id, None)
            self._release(session_id)

    def _base(self, name: str | None) -> str:
        """The served model's name; the SDK may name it by its directory too (the tokenizer lives there)."""
        if name not in (None, self.settings.model_name, self.settings.model_dir):
            raise invalid(
                f"base model {name!r} is not served here", hint=f"this server trains {self.settings.model_name!r}"
            )
        return self.settings.model_name

    def create_model(self, req: CreateModel) -> dict[str, Any]:
        base = self._base(req.base_model)
        lora = req.lora_config
        spec = (
            SlotSpec(rank=0, seed=0)
            if lora is None
            else SlotSpec(lora.rank, lora.seed or 0, lora.train_attn, lora.train_mlp)
        )
        model_id = f"{req.session_id}:train:{req.model_seq_id}"
        self.host.check_room(model_id, waiting=self._jobs.qsize())  # refused at once (4xx) when surely full

        def job() -> dict[str, Any]:
            self._expire_sessions()
            self.host.add(model_id, spec)
            self.runs[model_id] = Run(model_id, base, spec)
            return {"model_id": model_id, "type": "create_model"}

        return self.submit(job, model_id)

    def run(self, model_id: str) -> Run:
        run = self.runs.get(model_id)
        if run is None:
            raise not_found(
                f"no training client {model_id!r} on this server", hint="create it (or load its state) first"
            )
        return run

    def info(self, model_id: str) -> dict[str, Any]:
        run = self.run(model_id)
        return {
            "type": "get_info",
            "model_id": model_id,
            "model_data": {"arch": "llama", "model_name": run.base_model, "tokenizer_id": self.settings.model_dir},
            "is_lora": run.spec.rank > 0,
            "lora_rank": run.spec.rank or None,
            "model_name": run.base_model,
        }

    # -- training --------------------------------------------------------------------------------------
    def forward_backward(self, req: WireForwardBackward) -> dict[str, Any]:
        self.run(req.model_id)
        config = losses.check_loss(req.loss_fn, req.loss_fn_config)
        self.host._check(req.data, req.loss_fn)  # refused at once (4xx), before the request is queued

        def job() -> bytes:
            outputs, metrics = self.host.forward_backward(
                req.model_id, req.data, req.loss_fn, config, backward=not req.forward_only
            )
            return write_forward_backward_output(outputs, metrics)

        return self.submit(job, req.model_id)

    def optim_step(self, req: OptimStep) -> dict[str, Any]:
        self.run(req.model_id)
        if req.adam_params is None:
            raise invalid("optim_step needs adam_params", hint="only Adam is served (no Dimuon)")
        p = req.adam_params

        def job() -> dict[str, Any]:
            metrics = self.host.optim_step(
                req.model_id, p.learning_rate, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_clip_norm
            )
            return {"type": "optim_step", "metrics": metrics}

        return self.submit(job, req.model_id)

    # -- checkpoints -----------------------------------------------------------------------------------
    def _dir(self, path: str) -> tuple[Path, str, str]:
        """(directory, model id, kind) of a tinker:// checkpoint path, refused unless well-formed."""
        parts = path.removeprefix("tinker://").split("/") if path.startswith("tinker://") else []
        if len(parts) != 3 or parts[1] not in ("weights", "sampler_weights") or not NAME.match(parts[2]):
            raise invalid(f"checkpoint path {path!r} is not tinker://MODEL_ID/weights/NAME or .../sampler_weights/NAME")
        if not re.match(r"^[A-Za-z0-9]+:train:[0-9]+$", parts[0]):
            raise invalid(f"checkpoint path {path!r} names no training client of this server")
        return self.settings.state_dir / "runs" / parts[0].replace(":", "_") / parts[1] / parts[2], parts[0], parts[1]

    def _name(self, name: str | None, model_id: str, kind: str) -> str:
        if name is None:
            name = f"{kind}-{uuid.uuid4().hex[:8]}"
        if not NAME.match(name):
            raise invalid(f"checkpoint name {name!r} is not allowed", hint="letters, digits, '.', '_' and '-'")
        return f"tinker://{model_id}/{kind}/{name}"

    def save_state(self, req: SaveWeights) -> dict[str, Any]:
        run = self.run(req.model_id)
        path = self._name(req.path, req.model_id, "weights")
        directory, _, _ = self._dir(path)

        def job() -> dict[str, Any]:
            import torch

            state = {
                "trainable": self.host.trainable_state(run.model_id),
                "optimizer": self.host.optimizer_state(run.model_id),
            }
            directory.mkdir(parents=True, exist_ok=True)
            tmp = directory / "state.pt.tmp"
            torch.save(state, tmp)
            tmp.replace(directory / "state.pt")
            _write_meta(directory, run)
            return {"path": path, "type": "save_weights"}

        return self.submit(job, req.model_id)

    def load_state(self, req: LoadWeights) -> dict[str, Any]:
        directory, _, kind = self._dir(req.path)
        if kind != "weights" or not (directory / "state.pt").is_file():
            raise not_found(f"no training state at {req.path!r}", hint="load a path save_state returned")
        meta = json.loads((directory / "meta.json").read_text())
        spec = SlotSpec(**meta["spec"])
        if req.model_id is not None:
            model_id = req.model_id
            run = self.run(model_id)
            if run.spec.rank != spec.rank:
                raise invalid(f"{req.path!r} has LoRA rank {spec.rank}; this client has rank {run.spec.rank}")
        elif req.session_id is not None and req.model_seq_id is not None:
            model_id = f"{req.session_id}:train:{req.model_seq_id}"
            self._base(req.base_model or meta["base_model"])
        else:
            raise invalid("load_weights needs model_id, or session_id with model_seq_id")

        def job() -> dict[str, Any]:
            import torch

            if model_id not in self.runs:
                self.host.add(model_id, spec)
                self.runs[model_id] = Run(model_id, meta["base_model"], spec)
            state = torch.load(directory / "state.pt", map_location="cpu", weights_only=True)
            self.host.load_trainable(model_id, state["trainable"])
            self.host.load_optimizer(model_id, state["optimizer"] if req.optimizer else None)
            return {"path": req.path, "model_id": model_id, "type": "load_weights"}

        return self.submit(job, model_id)

    def save_for_sampler(self, req: SaveWeights) -> dict[str, Any]:
        run = self.run(req.model_id)
        refresh = False
        if req.path is None:  # an unnamed snapshot: served at once, kept in memory only
            run.sampler_seq += 1
            path, directory = None, None
            refresh = self.settings.reuses_snapshots and self.samplers.has(run.snapshot_key)
            key = run.snapshot_key if refresh else f"{req.model_id}/ephemeral/{run.sampler_seq}"
            run.snapshot_key = key
        else:
            path = self._name(req.path, req.model_id, "sampler_weights")
            directory = self._dir(path)[0]
            key = path

        def job() -> Any:
            model = self.host.sampler_model(self.host.merged_weights(run.model_id))
            if directory is not None:
                directory.mkdir(parents=True, exist_ok=True)
                model.save_pretrained(directory)
                _write_meta(directory, run)
            return model

        async def save_and_serve() -> dict[str, Any]:
            if refresh:  # the previous snapshot's engine takes the new weights in place (no rebuild)
                await self.samplers.refresh(key, await self.in_worker(lambda: self.host.merged_weights(run.model_id)))
            else:
                await self.samplers.add(key, await self.in_worker(job))
            if path is not None:
                return {"path": path, "type": "save_weights_for_sampler"}
            session = f"{req.model_id}:sample:{run.sampler_seq}"
            self.sampler_sessions[session] = key
            return {"sampling_session_id": session, "type": "save_weights_for_sampler"}

        return {**self.submit_async(save_and_serve), "model_id": req.model_id}

    # -- sampling --------------------------------------------------------------------------------------
    async def create_sampling_session(self, model_path: str | None, base_model: str | None) -> str:
        if model_path is None:
            self._base(base_model)
            key = f"base:{self.settings.model_name}"
            if not self.samplers.has(key):
                await self.samplers.add(key, self.host.sampler_model(None))
        else:
            key = await self._sampler_for_path(model_path)
        session = f"sample:{uuid.uuid4().hex[:16]}"
        self.sampler_sessions[session] = key
        return session

    async def _sampler_for_path(self, model_path: str) -> str:
        directory, _, kind = self._dir(model_path)
        if self.samplers.has(model_path):
            return model_path
        if kind != "sampler_weights" or not (directory / "config.json").is_file():
            raise not_found(
                f"no sampler weights at {model_path!r}", hint="use a path save_weights_for_sampler returned"
            )
        from transformers import AutoModelForCausalLM

        def load() -> Any:
            model = AutoModelForCausalLM.from_pretrained(directory)
            return model.to(self.host.base.device).eval()

        await self.samplers.add(model_path, await asyncio.to_thread(load))
        return model_path

    async def sample(self, req: Sample) -> dict[str, Any]:
        if req.sampling_session_id is not None:
            key = self.sampler_sessions.get(req.sampling_session_id)
            if key is None or not self.samplers.has(key):
                raise not_found(f"no sampling session {req.sampling_session_id!r}", hint="create a sampling client")
        elif req.model_path is not None:
            key = await self._sampler_for_path(req.model_path)
        else:
            key = self.sampler_sessions[await self.create_sampling_session(None, req.base_model)]
        req.prompt.tokens()  # a bad prompt is a 4xx now, not a failed future
        future = self.submit_async(lambda: self.samplers.sample(key, req))
        ids = [f"{future['request_id']}:{i}" for i in range(req.num_samples)]
        return {**future, "sample_sequence_ids": ids}


def _write_meta(directory: Path, run: Run) -> None:
    meta = {"base_model": run.base_model, "model_id": run.model_id, "spec": run.spec.__dict__}
    (directory / "meta.json").write_text(json.dumps(meta))


def _failure(exc: BaseException) -> dict[str, Any]:
    if isinstance(exc, ApiRequestError):
        return {"error": str(exc), "category": "user"}
    log.error("a request failed", exc_info=exc)  # a server fault: its traceback goes to the server's log
    return {"error": f"{type(exc).__name__}: {exc}", "category": "server"}


async def _outcome_async(job: Callable[[], Awaitable[Any]]) -> dict[str, Any] | bytes:
    try:
        return await job()
    except Exception as exc:  # the failure becomes the future's answer
        return _failure(exc)
