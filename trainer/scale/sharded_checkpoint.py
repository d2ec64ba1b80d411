"""Checkpoints of a many-GPU run: resumable sharded state (torch.distributed.checkpoint) plus, at every save, the
consolidated Hugging Face directory that vLLM and `atropos inference` load.

Where it sits: `GRPOTrainer.save`/`.resume` call these when the trainer is sharded (fsdp.py). Layout of
OUT/checkpoints/step-N (the same place and name as a one-process checkpoint):

    config.json, model.safetensors, tokenizer files   rank 0, gathered (LoRA: merged; adapter/ beside it)
    trainer_state.json                                step, data cursor, world size, config
    sharded/                                          DCP: every rank's shards of the weights and AdamW moments
    sharded/rng-<rank>.pt                             each rank's RNG state (restored on the same world size)

Resharding: DCP stores each tensor with its global shape, so `load_sharded` fills whatever shards the loading
run has: resuming on another world size (1 included) needs no conversion step. A one-process checkpoint
(no sharded/) resumed by a sharded run loads its full weights and `optimizer.pt` moments by parameter name.
The directory is written under a temporary name and renamed by rank 0 once every rank is done.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from atropos_cli.errors import ConfigError

from ..checkpoint import CHECKPOINTS, begin_checkpoint, finish_checkpoint, read_trainer_state, temporary_dir
from ..weights import lora
from .distributed import Dist
from .fsdp import full_tensor, full_weights

__all__ = ["SHARDED", "save_sharded", "load_sharded", "is_sharded"]

SHARDED = "sharded"


def is_sharded(checkpoint: Path | None) -> bool:
    return checkpoint is not None and (checkpoint / SHARDED / ".metadata").is_file()


def save_sharded(out: Path, step: int, trainer: Any, state: dict[str, Any], keep: int, dist: Dist) -> Path:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    tmp = temporary_dir(out, step)
    if dist.is_main:
        (begin_checkpoint(out, step) / SHARDED).mkdir()
    dist.barrier()
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    # the trainers' group: a disaggregated run's engine ranks (async_loop.py) take no part
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / SHARDED), process_group=dist.group)
    torch.save(_rng_state(), tmp / SHARDED / f"rng-{dist.rank}.pt")
    _save_consolidated(tmp, trainer, dist)  # every rank joins the gathers; rank 0 writes
    if dist.is_main:
        finish_checkpoint(out, step, tmp, {"world_size": dist.world, **state}, keep)
    dist.barrier()
    return out / CHECKPOINTS / f"step-{step}"


def _save_consolidated(path: Path, trainer: Any, dist: Dist) -> None:
    """The full weights (LoRA: merged) in the compute dtype, as a plain HF model directory, from rank 0."""
    dtype = trainer.precision.compute_dtype
    full: dict[str, Any] = {}
    for key, tensor in full_weights(trainer.model):
        if dist.is_main:
            full[key] = tensor.detach().to("cpu", dtype if tensor.is_floating_point() else tensor.dtype)
    adapter: dict[str, Any] = {}
    if trainer.is_lora:  # the adapter alone too, as `save_adapter` writes it (what --resume of a plain run reads)
        for key, tensor in trainer.model.state_dict().items():
            if ".lora_" in key:
                value = full_tensor(tensor)
                if dist.is_main:
                    adapter[key] = value.detach().cpu()
    if not dist.is_main:
        return
    lora.unwrap(trainer.model).save_pretrained(path, state_dict=full)
    if trainer.tokenizer is not None:
        trainer.tokenizer.save_pretrained(path)
    if adapter:
        lora.save_adapter_tensors(trainer.model, adapter, path / lora.ADAPTER_DIR)


def load_sharded(checkpoint: Path, trainer: Any, dist: Dist) -> dict[str, Any]:
    """Fill the trainer's shards from `checkpoint` (any world size wrote it); returns its trainer_state."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    meta = read_trainer_state(checkpoint)
    if not is_sharded(checkpoint):
        _load_full(checkpoint, trainer)
        return meta
    model_sd, optim_sd = get_state_dict(trainer.model, trainer.optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=str(checkpoint / SHARDED), process_group=dist.group)
    set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    rng = checkpoint / SHARDED / f"rng-{dist.rank}.pt"
    if meta.get("world_size") == dist.world and rng.is_file():  # the same ranks: continue their random streams
        _set_rng_state(torch.load(rng, weights_only=False))
    return meta


def _load_full(checkpoint: Path, trainer: Any) -> None:
    """A one-process checkpoint into a sharded trainer: full weights and optimizer.pt, matched by name."""
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    if trainer.is_lora:
        raise ConfigError(
            f"{checkpoint} is a one-process LoRA checkpoint: a sharded run resumes only sharded LoRA checkpoints",
            hint="resume it with one process, or start the many-GPU run from its merged weights (--model DIR)",
        )
    options = StateDictOptions(full_state_dict=True, strict=False)
    weights: dict[str, Any] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        weights.update(load_file(file))
    set_model_state_dict(trainer.model, {k: v.float() for k, v in weights.items()}, options=options)
    saved_optimizer = checkpoint / "optimizer.pt"
    if saved_optimizer.is_file():
        saved = torch.load(saved_optimizer, map_location="cpu", weights_only=True)
        names = [n for n, p in trainer.model.named_parameters() if p.requires_grad]
        full: dict[str, Any] = {
            "state": {names[int(i)]: v for i, v in saved["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]],
        }
        set_optimizer_state_dict(trainer.model, trainer.optimizer, full, options=options)


def _rng_state() -> dict[str, Any]:
    import random

    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    import random

    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
