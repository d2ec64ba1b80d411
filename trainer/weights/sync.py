"""Weight sync: after each optimizer step, make the inference engine sample from the new weights.

Where it sits: `grpo.train(..., after_step=sync)` calls one of these after every optimizer step, before the
next batch is pulled. Each returns a small dict of metrics (merged into the step's metrics).

- `LocalSync` (`--inference local`): copies the trainer's fp32 master weights (a LoRA run: the merged ones) in
  place into the in-process engine's model (`LocalBackend.model`), every step; the next groups are sampled
  from exactly the weights just trained: on-policy, no files, no restart.
- `CheckpointSync` (`--inference external`): every `every` steps writes OUT/checkpoints/step-N for a server
  the user runs; if that server has `POST /reload_weights` (`atropos inference` does), it is asked to load it.
- `VLLMSync` (`--inference vllm`, in vllm.py): in-place reload through vLLM's endpoints, adapter swap (LoRA)
  or restart from the checkpoint, every k steps.
- `ColocateSync` (`--inference vllm-colocate`): every k steps, the trainer's tensors (a LoRA run: merged) go from
  memory into the vLLM engine running in this process (vllm_colocate.py), its prefix cache is reset, and the
  probe check compares vLLM's logprobs with the trainer's forward: a desync stops the run with an error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from atropos_cli.errors import AtroposError

from ..scale.fsdp import full_weights
from .lora import is_lora_model, merged_keys

__all__ = ["LocalSync", "CheckpointSync", "ColocateSync", "copy_weights"]


def copy_weights(source: Any, target: Any) -> int:
    """Copy every parameter and buffer of `source` into `target` in place (dtype/device converted).

    A LoRA `source` (a peft model) gives its merged weights under the plain key names, so `target` stays a
    plain transformers model that samples exactly what the trained policy computes."""
    import torch

    lora = is_lora_model(source)
    src = set(merged_keys(source)) if lora else source.state_dict()
    dst = target.state_dict()
    missing = [k for k in dst if k not in src]
    if missing:
        raise AtroposError(
            f"inference model has {len(missing)} tensors the trainer lacks, e.g. {missing[0]!r}",
            hint="train and serve the same model (same --model)",
        )
    # a LoRA source merges one weight at a time, a sharded one gathers one weight at a time (fsdp.full_weights):
    # no second full copy of the model exists during the sync
    with torch.no_grad():
        for key, tensor in full_weights(source):
            if key in dst:
                dst[key].copy_(tensor)
    return len(dst)


class LocalSync:
    """In-place copy into the in-process engine's model, every step."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self._seen: dict[str, float] = {}

    def __call__(self, trainer: Any) -> dict[str, Any]:
        started = time.perf_counter()
        model = getattr(self.backend, "model", None)
        if model is None:  # LocalBackend keeps its model in the state it swaps atomically on reload()
            model = getattr(getattr(self.backend, "_state", None), "model", None)
        if model is None:
            raise AtroposError(
                "the local inference backend exposes no .model to sync weights into",
                hint="use --inference local with a transformers model, or --inference vllm/external",
            )
        copy_weights(trainer.model, model)
        metrics: dict[str, Any] = {"sync_s": time.perf_counter() - started}
        # since the last step: the engine's sampling seconds, its batches (one when the step's rollouts came
        # together; a batch split after a failure counts too) and the static engines it built (a build is a
        # compile: a loop that builds engines after its first steps is paying compiles every step)
        batcher = getattr(self.backend, "batcher", None)
        counters = {
            "generate_s": getattr(self.backend, "generate_s", 0.0),
            "engine_batches": getattr(batcher, "batches_run", 0) + getattr(batcher, "batches_split", 0),
            "engine_builds": getattr(self.backend, "engine_builds", 0),
        }
        for name, total in counters.items():
            metrics[name] = total - self._seen.get(name, 0)
            self._seen[name] = total
        return metrics


class ColocateSync:
    """Load into the in-process vLLM engine (a `vllm_colocate.ColocatedVLLM`) from memory and check the probe,
    every `every` steps; `tolerance` None is the engine dtype's default."""

    def __init__(self, engine: Any, every: int = 1, tolerance: float | None = None) -> None:
        self.engine, self.every, self.tolerance = engine, max(1, every), tolerance
        self._generated = 0.0

    def __call__(self, trainer: Any) -> dict[str, Any]:
        from .vllm_colocate import trainer_weights

        generate_s = self.engine.backend.generate_s  # the engine's sampling time since the last step
        metrics: dict[str, Any] = {"generate_s": generate_s - self._generated}
        self._generated = generate_s
        if trainer.step_count % self.every:
            return metrics
        started = time.perf_counter()
        self.engine.load_weights(trainer_weights(trainer))
        gap = self.engine.check(trainer, self.tolerance)
        metrics.update(probe_gap_mean=gap.mean, probe_gap_max=gap.max)
        metrics.update(sync_s=time.perf_counter() - started, weight_version=trainer.step_count)
        return metrics


class CheckpointSync:
    """Writes a checkpoint every `every` steps for an external server, and asks it to load the checkpoint
    when it has a `POST /reload_weights` endpoint (`atropos inference` does); otherwise we only write files."""

    def __init__(
        self, out: Path, every: int, server_url: str | None = None, api_key: str = "", timeout: float = 120.0
    ) -> None:
        self.out, self.every, self.timeout = out, max(1, every), timeout
        # the key the env's clients use for that server (--openai.api_key) also authorises the reload
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.reload_url = server_url.rstrip("/").removesuffix("/v1") + "/reload_weights" if server_url else None

    def __call__(self, trainer: Any) -> dict[str, Any]:
        if trainer.step_count % self.every:
            return {}
        started = time.perf_counter()
        path = trainer.save(self.out)
        metrics: dict[str, Any] = {"synced_checkpoint": str(path)}
        if self.reload_url:
            metrics["reloaded_version"] = self._reload(path)
        metrics["sync_s"] = time.perf_counter() - started
        return metrics

    def _reload(self, path: Path) -> int | None:
        import httpx

        if self.reload_url is None:
            return None
        try:
            response = httpx.post(
                self.reload_url, json={"path": str(path.resolve())}, headers=self.headers, timeout=self.timeout
            )
        except httpx.TransportError as exc:
            raise AtroposError(
                f"cannot reach {self.reload_url!r} to load the new weights ({type(exc).__name__})",
                hint="is the inference server still running? the checkpoint is saved at " + str(path),
            ) from None
        if response.status_code == 404:  # a server without the endpoint (plain vLLM, an API): files only
            self.reload_url = None
            return None
        if response.status_code >= 400:
            raise AtroposError(
                f"{self.reload_url} refused the new weights: HTTP {response.status_code} {response.text[:200]!r}",
                hint="check that the inference server was started on the same model (its log says why)",
            )
        return response.json().get("version")
