"""A policy no rank ever holds whole: built on the meta device, sharded, then each rank fills only its shard.

Where it sits: a many-rank `GRPOTrainer` (and `benchmarks/bench_fsdp.py`) builds the policy with `empty_policy`
(a model directory or hub id) or `empty_from_config` (random weights of a shape): every parameter is a meta
tensor (a shape, no memory), buffers are real (RoPE's inv_freq is computed as usual, on the CPU). LoRA wraps it
as it is; FSDP2 shards it (`fsdp.shard`: the meta shards stay meta); then `materialise` allocates each rank's
shards on its device and fills them:

- from a checkpoint: each rank reads its rows of each tensor from the safetensors files (`slices.py`), so a
  30.5B model (122 GB in fp32) costs each of 4 ranks its 30 GB share, never the whole;
- random (a shape without a checkpoint): each parameter is drawn whole on the device, as transformers'
  `_init_weights` draws it, with a seed of its own (the same on every rank), and each rank keeps its rows: the
  model is the same on any number of ranks, one tensor at a time in memory;
- LoRA adapters: lora_A as peft draws it (Kaiming-uniform, a = sqrt 5), lora_B zeros, so the adapted model
  computes exactly its base model until the first step.

Tied weights (an LM head that is the input embedding) stay one parameter through all of this: it is filled
once, under its first name, as `save_pretrained` stores it. Without ranks (`materialise` on a model that was not
sharded: a replicated run) every rank reads or draws the whole model.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from atropos_cli.errors import ModelLoadError

__all__ = [
    "params_on_meta",
    "empty_from_config",
    "empty_policy",
    "is_empty",
    "fill_if_empty",
    "materialise",
    "model_directory",
]


@contextlib.contextmanager
def params_on_meta() -> Iterator[None]:
    """Every parameter registered inside goes to the meta device; buffers stay where they are made (the CPU), so
    values computed at construction (RoPE frequencies, embedding scales) are real. Not thread-safe: it patches
    `nn.Module.register_parameter` for the duration."""
    import torch

    register = torch.nn.Module.register_parameter

    def on_meta(module: Any, name: str, param: Any) -> None:
        if param is not None and not param.is_meta:
            param = type(param)(param.to("meta"), requires_grad=param.requires_grad)
        register(module, name, param)

    torch.nn.Module.register_parameter = on_meta  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register  # type: ignore[method-assign]


def empty_from_config(config: Any, **kwargs: Any) -> Any:
    """A causal LM of `config` with fp32 meta parameters and real buffers."""
    import torch
    from transformers import AutoModelForCausalLM

    with params_on_meta():
        return AutoModelForCausalLM.from_config(config, dtype=torch.float32, **kwargs)


def model_directory(name: str) -> Path:
    """The local directory of a shipped name, a path, or a hub id (its config and safetensors downloaded, or
    taken from the hub cache)."""
    from atropos_cli.resources import resolve_model_path

    path = Path(resolve_model_path(name))
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(name, allow_patterns=["*.json", "*.safetensors"]))
    except Exception as exc:  # the hub's errors (offline, unknown id, no access) are many kinds
        raise ModelLoadError(f"cannot load model {name!r}: {exc}", hint="pass a saved model directory") from None


def empty_policy(name: str) -> tuple[Any, Any, Path]:
    """(meta-built fp32 model, tokenizer, the directory its weights are read from) of a shipped name, a
    directory or a hub id."""
    from transformers import AutoConfig

    from atropos_cli.inference.tokenizer import load_tokenizer

    directory = model_directory(name)
    tokenizer = load_tokenizer(name)
    try:
        config = AutoConfig.from_pretrained(directory)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"cannot load model {name!r}: {exc}", hint="pass a saved model directory") from None
    model = empty_from_config(config)
    model.config.name_or_path = str(directory)
    if (directory / "generation_config.json").is_file():  # as from_pretrained reads it (checkpoints carry it on)
        from transformers import GenerationConfig

        model.generation_config = GenerationConfig.from_pretrained(directory)
    return model, tokenizer, directory


def is_empty(model: Any) -> bool:
    """Whether any parameter of `model` is still a meta tensor (built by this module, not yet materialised)."""
    return any(p.is_meta for p in model.parameters())


def fill_if_empty(model: Any, device: str, checkpoint: Path | None, seed: int) -> None:
    """`materialise` a module still on the meta device; a model already real (loaded whole) or a view of another
    model's weights (a LoRA run's reference) is left as it is."""
    import torch

    if isinstance(model, torch.nn.Module) and is_empty(model):
        materialise(model, device, checkpoint, seed)


def materialise(model: Any, device: str, checkpoint: Path | None, seed: int) -> None:
    """Allocate this rank's part of every meta parameter of `model` (FSDP-sharded or whole) on `device` and fill
    it from `checkpoint` (rows of its safetensors) or at random (`seed`). Parameters and buffers that were
    already real keep their values."""
    import torch

    from .slices import CheckpointSlices

    kept = {name: _local(t).detach().clone() for name, t in _tensors(model) if not t.is_meta}
    shared = _shared_parameters(model)
    model.to_empty(device=device)  # FSDP's modules re-register their shards (fully_shard's _apply)
    for module, leaf, first in shared():  # a plain module's to_empty makes a new parameter per use: tie again
        setattr(module, leaf, first)
    reader = CheckpointSlices(checkpoint) if checkpoint is not None else None
    prefix, inner = _transformers_model(model)
    seen: set[int] = set()
    with torch.no_grad():
        for name, tensor in _tensors(model):
            if name in kept:
                _local(tensor).copy_(kept[name])
        for index, (module_name, module) in enumerate(inner.named_modules()):
            drawn: dict[str, Any] | None = None  # the module's parameters drawn whole (random weights)
            for leaf, param in list(module.named_parameters(recurse=False)):
                name = f"{module_name}.{leaf}" if module_name else leaf
                if id(param) in seen or prefix + name in kept:
                    continue
                seen.add(id(param))  # a tied weight: filled once, under its first name
                local, lo, hi = _rows(param)
                if hi <= lo:
                    continue  # this rank holds no row of it (fewer rows than ranks)
                if ".lora_" in name:
                    local.copy_(_lora_init(name, param.shape, device, seed + index)[lo:hi])
                elif reader is not None:
                    local.copy_(_checked(reader.rows(name.replace(".base_layer.", "."), lo, hi), local, name))
                else:
                    drawn = drawn if drawn is not None else _drawn(inner, module, device, seed + index)
                    local.copy_(drawn[leaf][lo:hi])
    if reader is not None:
        reader.close()


def _tensors(model: Any) -> Iterator[tuple[str, Any]]:
    yield from model.named_parameters(remove_duplicate=False)
    yield from model.named_buffers(remove_duplicate=False)


def _shared_parameters(model: Any) -> Any:
    """A function that lists (module, name, parameter) for each second use of a parameter (a tied LM head),
    with the parameter its first use holds then, where that is another object: after `to_empty` of a plain
    module (FSDP's DTensor parameters keep one object, and nothing is listed)."""
    uses: dict[int, list[tuple[Any, str]]] = {}
    for module in model.modules():
        for leaf, param in module._parameters.items():
            if param is not None:
                uses.setdefault(id(param), []).append((module, leaf))
    tied = [places for places in uses.values() if len(places) > 1]

    def untied() -> list[tuple[Any, str, Any]]:
        out = []
        for (owner, name), *others in tied:
            first = owner._parameters[name]
            out += [(m, leaf, first) for m, leaf in others if m._parameters[leaf] is not first]
        return out

    return untied


def _transformers_model(model: Any) -> tuple[str, Any]:
    """(its name prefix, the transformers model) inside `model`: an FSDP root, a peft wrapper or itself."""
    from transformers import PreTrainedModel

    for name, module in model.named_modules():
        if isinstance(module, PreTrainedModel):
            return (f"{name}." if name else ""), module
    raise ModelLoadError(f"no transformers model inside {type(model).__name__}", hint="report this as a bug")


def _local(tensor: Any) -> Any:
    """A sharded parameter's local shard (written in place), or the tensor itself."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _rows(param: Any) -> tuple[Any, int, int]:
    """(the tensor this rank fills, first row, end row) of `param` along dim 0: FSDP2's Shard(0) gives rank r the
    r-th chunk of ceil(rows / ranks) rows (the last ones may be short or empty)."""
    from torch.distributed.tensor import DTensor, Shard

    if not isinstance(param, DTensor):
        return param, 0, param.shape[0] if param.dim() else 1
    if list(param.placements) != [Shard(0)]:
        raise ModelLoadError(f"unexpected sharding {param.placements} of a parameter", hint="report this as a bug")
    rows, world = param.shape[0], param.device_mesh.size()
    chunk = math.ceil(rows / world)
    lo = min(param.device_mesh.get_local_rank() * chunk, rows)
    hi = min(lo + chunk, rows)
    local = param.to_local()
    if local.shape[0] != hi - lo:
        raise ModelLoadError(f"a shard of {hi - lo} rows holds {local.shape[0]}", hint="report this as a bug")
    return local, lo, hi


def _checked(rows: Any, local: Any, name: str) -> Any:
    if rows.shape != local.shape:
        raise ModelLoadError(
            f"the checkpoint's {name!r} has rows of shape {tuple(rows.shape[1:])}, the model {tuple(local.shape[1:])}",
            hint="the model directory's config.json does not describe its weights",
        )
    return rows


def _drawn(inner: Any, module: Any, device: str, seed: int) -> dict[str, Any]:
    """`module`'s parameters, whole and fp32, drawn as transformers' `_init_weights` draws them: on a shallow copy
    of the module whose parameters are whole tensors (the module itself holds shards). Zeros where the model's
    `_init_weights` draws nothing."""
    import torch

    double = copy.copy(module)
    double._parameters = {
        k: None if p is None else torch.nn.Parameter(torch.zeros(p.shape, device=device), requires_grad=False)
        for k, p in module._parameters.items()  # (a DTensor's shape is the whole tensor's)
    }
    double._buffers = {k: None if b is None else b.clone() for k, b in module._buffers.items()}
    with _seeded(seed, device):
        inner._init_weights(double)
    return {k: p.detach() for k, p in double._parameters.items() if p is not None}


def _lora_init(name: str, shape: Any, device: str, seed: int) -> Any:
    """peft's default adapter init: lora_A Kaiming-uniform (a = sqrt 5, nn.Linear's own), lora_B zeros."""
    import torch

    whole = torch.zeros(shape, dtype=torch.float32, device=device)
    if ".lora_A" in name:
        with _seeded(seed, device):
            torch.nn.init.kaiming_uniform_(whole, a=math.sqrt(5))
    return whole


@contextlib.contextmanager
def _seeded(seed: int, device: str) -> Iterator[None]:
    """torch's generators seeded for one draw, restored afterwards (the trainer's own sequence is untouched)."""
    import torch

    devices = [torch.device(device).index or 0] if device.startswith("cuda") else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield
