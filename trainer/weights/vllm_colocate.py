"""`--inference vllm-colocate`: vLLM's `LLM` engine inside the trainer's own process, on the trainer's device.

Where it sits: `run.py` builds a `ColocatedVLLM` on the trainer's model, gives its `backend` (a `ColocateBackend`:
the inference protocol of `inference/base.py`) to the env workers (`rollouts.EnvRollouts`), and passes
`sync.ColocateSync` to the loop as its after-step hook. No server, no port, no checkpoint on disk.
(`--inference vllm`, in vllm.py, is the other vLLM path: a server process in its own venv, weights through files.)

How weights get in (vLLM 0.32's API, read in its source): the engine core runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0, as TRL's colocate mode sets), so `LLM.collective_rpc("reload_weights",
kwargs={"weights_iterator": ...})` hands the trainer's tensors by reference to the worker's in-place reload
(vllm/model_executor/model_loader/reload/inplace.py). It runs the model's own `load_weights` on checkpoint names
(fused qkv / gate_up, a tied LM head) and each layer's post-load processing (the CPU build's packed weights),
copying into the existing kernel tensors, so captured CUDA graphs stay valid. A LoRA run hands its merged weights,
one at a time (`lora.iter_merged`). Then the prefix cache is reset: KV blocks of the old weights are never reused.

The probe check (`check_probe`): after each load, a fixed prompt's per-token logprobs under vLLM must equal the
trainer's own forward (`GRPOTrainer._logprobs`, the function the loss uses) within a tolerance on their mean
|difference|, else a `WeightSyncError` naming the mean and the largest difference. Weights that reach vLLM partly,
under the wrong names, or not at all are the most common silent failure of RL trainers; this catches them at the
step they happen.

Sleep mode (`--vllm-sleep-mode`): `llm.sleep(level=1)` once a step's groups are collected (weights offloaded to
host memory, KV cache freed, for the optimizer step), `llm.wake_up()` before the next load or sampling. vLLM
supports it on CUDA only; its CPU build refuses it, so it is checked before the engine starts.
Sampling: token ids and raw logprobs (vLLM's default `logprobs_mode`) come from vLLM's outputs, one request per
row, seeded as `--inference local` seeds rows (the request's seed + the choice's index).
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from atropos_cli.config import ServerConfig
from atropos_cli.errors import ConfigError, InferenceError, ModelLoadError
from atropos_cli.inference.batching import RequestBatcher
from atropos_cli.inference.local import LocalBackend, _Job, _Loaded
from atropos_cli.inference.sampler import RowRequest, RowResult
from atropos_cli.quiet import verbose
from atropos_cli.resources import resolve_model_path

from .lora import is_lora_model, iter_merged

__all__ = [
    "ColocatedVLLM",
    "ColocateBackend",
    "WeightSyncError",
    "ProbeGap",
    "require_vllm",
    "check_can_colocate",
    "check_probe",
    "default_tolerance",
    "trainer_weights",
    "trainer_logprobs",
    "PROBE_TEXT",
]

# A fixed probe: chat-like text and digits, the tokens the bundled envs sample.
PROBE_TEXT = "Question: What is 12 + 7? Answer: 12 + 7 = 19, since 12 + 8 = 20 and 20 - 1 = 19."
# Mean |logprob difference| per probe token allowed after a load. Measured on the CPU build with the shipped model:
# fp32 vLLM vs the fp32 trainer ~5e-6 (kernel order only); bf16 vs bf16 0.04-0.07 (rounding on both sides).
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.2}


class WeightSyncError(InferenceError):
    """vLLM does not compute what the trainer computes after a weight load."""


def require_vllm() -> None:
    """Fail fast (before any model loads) when `vllm` is not importable in this Python."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            f"--inference vllm-colocate needs vLLM in this Python ({sys.executable}), and it is not installed",
            hint="pip install vllm (or run vLLM from its own venv: --inference vllm --vllm-python PATH)",
        )


def default_tolerance(dtype: str) -> float:
    """The probe tolerance for an engine computing in `dtype` ("float32" or "bfloat16")."""
    return TOLERANCE[dtype]


@dataclass(frozen=True)
class ProbeGap:
    """How far vLLM's probe logprobs are from the trainer's: the mean and the largest |difference| per token."""

    mean: float
    max: float


def check_probe(engine: list[float], trainer: list[float], tolerance: float, step: int) -> ProbeGap:
    """Compare the probe's per-token logprobs; a `WeightSyncError` when their mean |difference| is over `tolerance`
    (or not a number, or the two sides scored different numbers of tokens). The mean, not the largest gap, is
    checked: in bf16 single tokens differ by up to ~0.7 nats from rounding alone (measured on the shipped model),
    while a weight that did not load moves every token."""
    if len(engine) != len(trainer) or not engine:
        raise WeightSyncError(
            f"weight sync check at step {step}: vLLM scored {len(engine)} probe tokens, the trainer {len(trainer)}",
            hint="vLLM and the trainer must use the same tokenizer (same --model)",
        )
    gaps = [abs(a - b) for a, b in zip(engine, trainer, strict=True)]
    gap = ProbeGap(mean=sum(gaps) / len(gaps), max=max(gaps))
    if math.isnan(gap.mean) or gap.mean > tolerance:
        raise WeightSyncError(
            f"weight sync check failed at step {step}: vLLM's logprobs on the probe prompt differ from the "
            f"trainer's by {gap.mean:.4g} on average, {gap.max:.4g} at most (tolerance {tolerance:g} on the "
            "average): vLLM is not sampling the trained weights",
            hint="some weights did not reach vLLM (a name or shape it does not load); run with --verbose to see "
            "vLLM's 'weights were not loaded' warning, or raise --vllm-probe-tolerance if the gap is numerical",
        )
    return gap


def trainer_weights(trainer: Any) -> Iterator[tuple[str, Any]]:
    """(checkpoint name, tensor) of the trained policy: a LoRA run's weights merged, one at a time, in fp32 (vLLM
    casts each once to its dtype; a bf16 merge would round the update away)."""
    if is_lora_model(trainer.model):
        return iter_merged(trainer.model, fp32=True)
    return iter(trainer.model.state_dict().items())


def trainer_logprobs(trainer: Any, ids: list[int]) -> list[float]:
    """Per-token logprobs of `ids[1:]` under the trainer's own forward (the loss's code path), dropout off."""
    import torch

    from ..step.batching import Sample

    n = len(ids) - 1
    sample = Sample(tokens=ids, trained=[True] * n, advantages=[0.0] * n, temperature=1.0, inference_logprobs=None)
    batch = trainer._micro_batches([sample])[0].to(trainer.device)
    model, training = trainer.model, trainer.model.training
    model.eval()
    try:
        with torch.no_grad():
            logp = trainer._logprobs(model, batch)
    finally:
        model.train(training)
    return logp[batch.loss_mask.bool()].tolist()


class ColocatedVLLM:
    """One `vllm.LLM` in this process: sampling, in-place weight loads, the probe, sleep/wake."""

    def __init__(
        self,
        model: str,
        tokenizer: Any,
        *,
        dtype: str,
        max_model_len: int,
        memory: float,
        sleep_mode: bool,
        seed: int,
        eager: bool,
    ) -> None:
        require_vllm()
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process: tensors by reference
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "INFO" if verbose() else "ERROR")  # read at vLLM's import
        from vllm import LLM
        from vllm.platforms import current_platform

        if sleep_mode and not current_platform.is_sleep_mode_available():
            raise ConfigError(
                "--vllm-sleep-mode: vLLM's sleep mode is not available on this platform "
                f"({current_platform.device_type})",
                hint="drop --vllm-sleep-mode (it frees GPU memory during the optimizer step; CUDA builds only)",
            )
        self.model, self.dtype, self.sleep_mode = resolve_model_path(model), dtype, sleep_mode
        self.max_model_len, self.asleep = max_model_len, False
        try:
            self.llm = LLM(
                model=self.model, dtype=dtype, max_model_len=max_model_len, gpu_memory_utilization=memory,
                enable_sleep_mode=sleep_mode, seed=seed, enforce_eager=eager,
            )  # fmt: skip
        except Exception as exc:  # vLLM raises many types (config, memory, unsupported model): one message
            raise ModelLoadError(
                f"vLLM could not start on {model!r}: {type(exc).__name__}: {str(exc)[:300]}",
                hint="if memory ran out, adjust --vllm-gpu-memory-utilization (on vLLM's CPU build it is the share of "
                "RAM for this whole process, the trainer included); vLLM's log: atropos --verbose",
            ) from None
        self.backend = ColocateBackend(self, tokenizer)

    def generate(self, prompts: list[list[int]], params: list[Any]) -> list[Any]:
        self.wake_up()
        inputs: list[Any] = [{"prompt_token_ids": ids} for ids in prompts]
        return self.llm.generate(inputs, params, use_tqdm=False)

    def load_weights(self, weights: Iterable[tuple[str, Any]]) -> int:
        """Load (checkpoint name, tensor) pairs into vLLM's model in place, then reset its prefix cache;
        returns how many tensors were handed over."""
        self.wake_up()
        count = 0

        def counted() -> Iterator[tuple[str, Any]]:
            nonlocal count
            for name, tensor in weights:
                count += 1
                yield name, tensor

        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": counted()})
        if not self.llm.reset_prefix_cache():
            raise InferenceError(
                "vLLM refused to reset its prefix cache after a weight load (requests still running)",
                hint="weights are loaded between steps only; report this with the run's log",
            )
        return count

    def probe_logprobs(self, ids: list[int]) -> list[float]:
        """vLLM's logprob of each of `ids[1:]` given the tokens before it (its prompt logprobs)."""
        from vllm import SamplingParams

        [output] = self.generate([ids], [SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=0.0)])
        return [output.prompt_logprobs[i][ids[i]].logprob for i in range(1, len(ids))]

    def check(self, trainer: Any, tolerance: float | None = None) -> ProbeGap:
        """The probe check after a load (see `check_probe`)."""
        ids = list(self.backend.tokenizer.encode(PROBE_TEXT))[: self.max_model_len]
        found = self.probe_logprobs(ids)
        self.llm.reset_prefix_cache()  # the probe's blocks are not the env's
        limit = tolerance if tolerance is not None else default_tolerance(self.dtype)
        return check_probe(found, trainer_logprobs(trainer, ids), limit, trainer.step_count)

    def sleep(self) -> None:
        if self.sleep_mode and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake_up(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    def sleeping_between(self, batches: Iterable[Any]) -> Iterator[Any]:
        """`batches` with the engine asleep while each one trains (a no-op without sleep mode)."""
        for batch in batches:
            self.sleep()
            yield batch

    def close(self) -> None:
        """Stop the engine core and drop the engine, so its memory can go back to the device."""
        engine = getattr(self, "llm", None)
        self.llm = None
        if engine is not None:
            shutdown = getattr(engine.llm_engine.engine_core, "shutdown", None)
            if shutdown is not None:
                shutdown()


class ColocateBackend(LocalBackend):
    """The env workers' inference backend over a `ColocatedVLLM`: the local backend's requests (chat template,
    validation, batching of concurrent calls, choices), sampled by vLLM instead of transformers."""

    def __init__(self, engine: ColocatedVLLM, tokenizer: Any, max_batch_size: int = 256) -> None:
        self.config = ServerConfig(server_type="local", model_name=engine.model)
        self.model_name, self.engine = engine.model, engine
        self._state = _Loaded(model=None, tokenizer=tokenizer, version=0, path=engine.model)
        self.device = "vllm"
        self._static = None
        self.generate_s = 0.0
        self._batcher: RequestBatcher[_Job, list[RowResult]] = RequestBatcher(
            self._run_jobs, lambda job: job.params.n, max_batch_size=max_batch_size, max_wait_s=0.002
        )

    @property
    def max_model_len(self) -> int:
        return self.engine.max_model_len

    def _sample(self, rows: list[RowRequest]) -> list[RowResult]:
        from vllm import SamplingParams

        params = [
            SamplingParams(
                temperature=r.temperature, top_p=r.top_p, max_tokens=r.max_new_tokens, stop=r.stop or None,
                seed=r.seed, logprobs=r.top_logprobs,
            )
            for r in rows
        ]  # fmt: skip
        outputs = self.engine.generate([r.prompt_ids for r in rows], params)
        return [_row_result(out.outputs[0], row.top_logprobs) for out, row in zip(outputs, rows, strict=True)]

    def reload(self, path: str) -> int:
        raise InferenceError(
            "the colocated vLLM engine takes weights from the trainer's memory, not from a checkpoint",
            hint="its weights are synced after every step (--sync-every)",
        )


def _row_result(completion: Any, top_k: int) -> RowResult:
    """vLLM's completion as the local engine's row: token ids, the sampled tokens' raw logprobs, top-k."""
    ids = list(completion.token_ids)
    steps = completion.logprobs or []
    top = None
    if top_k:
        top = [
            [(t, lp.logprob) for t, lp in sorted(step.items(), key=lambda kv: kv[1].rank) if lp.rank <= top_k]
            for step in steps
        ]
    return RowResult(
        token_ids=ids,
        logprobs=[step[t].logprob for step, t in zip(steps, ids, strict=True)],
        text=completion.text,
        finish_reason=completion.finish_reason or "length",
        top_logprobs=top,
    )


def engine_settings(trainer: Any, opts: Any) -> dict[str, Any]:
    """`ColocatedVLLM`'s keyword arguments for this trainer and these run options."""
    import torch

    on_cpu = str(trainer.device).startswith("cpu")
    return {
        "dtype": "float32" if trainer.precision.compute_dtype == torch.float32 else "bfloat16",
        "max_model_len": trainer.config.max_len,
        "memory": opts.vllm_gpu_memory_utilization,
        "sleep_mode": opts.vllm_sleep_mode,
        "seed": trainer.config.seed,
        "eager": on_cpu,  # CUDA graphs on GPUs; the CPU build has no graphs and compiles slowly
    }


def check_can_colocate(nproc_per_node: int = 1) -> None:
    """Before anything is written or loaded: one process (vLLM is not sharded with the trainer), vLLM importable."""
    world = max(nproc_per_node, int(os.environ.get("WORLD_SIZE", "1") or 1))
    if world > 1:
        raise ConfigError(
            f"--inference vllm-colocate runs in one process on one device, not in {world} processes",
            hint="train on one device, or run vLLM yourself and pass --inference external --openai.base_url URL",
        )
    require_vllm()


def _check_one_device(device: str) -> None:
    """vLLM takes the process's current device, in one process: refuse what would put it elsewhere."""
    if device.startswith("cuda:") and device != "cuda:0":
        raise ConfigError(
            f"--inference vllm-colocate puts vLLM on the current CUDA device, not on --device {device}",
            hint=f"select the card with CUDA_VISIBLE_DEVICES={device.split(':')[1]} and --device cuda",
        )
    check_can_colocate()


def start_colocated(trainer: Any, opts: Any, on_event: Any = lambda _: None) -> ColocatedVLLM:
    """The engine for this run, with the trainer's weights loaded and checked (a resumed run starts there)."""
    _check_one_device(str(trainer.device))
    started = time.perf_counter()
    engine = ColocatedVLLM(trainer.config.model, trainer.tokenizer, **engine_settings(trainer, opts))
    engine.load_weights(trainer_weights(trainer))
    gap = engine.check(trainer, opts.vllm_probe_tolerance)
    on_event(
        f"vLLM colocated ({engine.dtype}, {time.perf_counter() - started:.0f}s to start): weights synced from memory "
        f"every {opts.sync_every} step(s); probe logprobs match the trainer's within {gap.mean:.1e} on average"
    )
    return engine
