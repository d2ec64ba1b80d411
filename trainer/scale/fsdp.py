"""Sharding the policy over the ranks with PyTorch's FSDP2 (`fully_shard`), and the optimizer that goes with it.

Where it sits: `GRPOTrainer` calls `shard(...)` when the run has more than one process (or resumes a sharded
checkpoint) and uses `ShardedPrecision` in place of `precision.Precision`.

What is sharded, and how:
- each decoder layer is its own FSDP unit (parameters all-gathered just before the layer runs, freed after),
  the rest (embeddings, final norm, LM head) is the root unit;
- the root is `LogprobModule`, a thin module around the HF model whose forward is the trainer's log-prob
  computation (body -> trained positions -> chunked fp32 LM-head log-probs): the LM head's weight is used
  outside the HF model's own forward, so the root must be the module the trainer calls;
- `MixedPrecisionPolicy`: bf16 compute on CUDA (fp32 on CPU), fp32 gradient reduce-scatter; the sharded
  trained parameters stay fp32 and are AdamW's master weights (no second copy as in single-GPU bf16-pure);
  frozen ones (a LoRA run's base weights, a KL reference) are sharded in bf16 when the compute is bf16: they
  never update, and nothing but the bf16 all-gather reads them;
- a policy built on the meta device (`meta_init.py`: the many-rank default) is sharded as it is, then each
  rank fills its own shards (`meta_init.materialise`);
- gradients are reduced once per step (`set_requires_gradient_sync(False)` on every micro-batch but the
  last). Each rank's loss is its exact share of the step's loss, so the one-process gradient is the SUM over
  ranks; FSDP averages, so the trainer scales each rank's backward by the world size (`GRPOTrainer.step`;
  a custom divide factor would need NCCL's PreMulSum, which gloo lacks).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from atropos_cli.errors import ModelLoadError

from ..weights import lora

# Whether layers re-gather their weights for the backward (True: ZeRO-3 memory) or keep them gathered from the
# forward (False: fewer gathers, more memory); benchmarks/bench_fsdp.py compares them.
RESHARD_LAYERS: bool | None = None  # None: the rule in `_reshard_layers`
KEEP_GATHERED_FRACTION = 1 / 8  # layers stay gathered when the whole bf16 model is under this much of a GPU

__all__ = [
    "LogprobModule",
    "shard",
    "ShardedPrecision",
    "full_tensor",
    "full_weights",
    "decoder_layers",
    "reshard_layers",
    "gathered_bytes",
]


class LogprobModule(torch.nn.Module):
    """The FSDP root: `forward(mb, reference)` runs `compute(model, mb)` (the policy's log-probs), or with
    `reference=True` the LoRA reference view of the same sharded weights."""

    def __init__(self, model: Any, compute: Callable[[Any, Any], Any], reference: Any = None) -> None:
        super().__init__()
        self.model = model
        self._compute = compute
        self._reference = reference  # a lora.ReferenceView of `model` (not a submodule: no second registration)

    def forward(self, mb: Any, reference: bool = False) -> Any:
        # a fresh tensor, not a view: FSDP hooks the root's output for its backward
        return self._compute(self._reference if reference else self.model, mb).clone()


def decoder_layers(model: Any) -> list[Any]:
    """The transformer blocks of a *ForCausalLM (through a peft wrapper too)."""
    inner = lora.unwrap(model)
    body = getattr(inner, getattr(inner, "base_model_prefix", "model"), None)
    layers = getattr(body, "layers", None)
    if layers is None:
        raise ModelLoadError(
            f"cannot find the decoder layers of {type(inner).__name__!r} to shard",
            hint="multi-GPU training supports standard *ForCausalLM models (Llama, Qwen2, Mistral, ...)",
        )
    return list(layers)


def shard(model: Any, compute: Callable[[Any, Any], Any], mesh: Any, mixed: bool, reference: Any = None) -> Any:
    """FSDP2 over `mesh`: one unit per decoder layer + the `LogprobModule` root; returns the root."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    param_dtype = torch.bfloat16 if mixed else None
    if mixed:  # frozen weights: bf16 shards (half the memory; the all-gather casts to bf16 anyway)
        for param in model.parameters():
            if not param.requires_grad:
                param.data = param.data.to(torch.bfloat16)
    layer_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32)
    reshard = reshard_layers(model, mesh.size(), mesh.device_type)
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=mesh, mp_policy=layer_policy, reshard_after_forward=reshard)
    root = LogprobModule(model, compute, reference)
    # the root's inputs are a micro-batch whose fp32 tensors (temperatures, advantages) must stay fp32
    root_policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=torch.float32, cast_forward_inputs=False)
    fully_shard(root, mesh=mesh, mp_policy=root_policy, reshard_after_forward=False)
    return root


def reshard_layers(model: Any, world: int, device_type: str) -> bool:
    """Re-gather each layer's weights for the backward (ZeRO-3) or keep them from the forward: keeping them saves
    one all-gather per layer and micro-batch (measured +17% tokens/s on 4 GPUs, 0.5B shape) at the cost of one
    layer-sized bf16 copy per layer, so it is done when the whole bf16 model is a small part of the GPU (0.5-3B on
    an 80 GB card; a 7B model reshards). One rank saves no memory by resharding, so it never does."""
    if RESHARD_LAYERS is not None:
        return RESHARD_LAYERS
    if world == 1:
        return False
    if device_type != "cuda":
        return True
    bf16_bytes = 2 * sum(p.numel() for p in model.parameters())
    from ..config import gpu_budget_bytes

    gpu_bytes = gpu_budget_bytes("cuda")
    return bf16_bytes > KEEP_GATHERED_FRACTION * gpu_bytes


def gathered_bytes(model: Any, world: int, device_type: str) -> int:
    """Bytes of gathered (unsharded) weights a rank holds at its peak: every layer's bf16 copy when layers stay
    gathered; else the root's (embeddings, final norm, LM head: gathered for the whole step) plus two layers in
    flight (the one running and the one prefetched) and the fp32 gradient of one layer's trained weights before
    its reduce-scatter."""
    total = sum(p.numel() for p in model.parameters())
    if not reshard_layers(model, world, device_type):
        return 2 * total
    layers = [list(layer.parameters()) for layer in decoder_layers(model)]
    in_layers = sum(p.numel() for params in layers for p in params)
    largest = max((sum(p.numel() for p in params) for params in layers), default=0)
    trained = max((sum(p.numel() for p in params if p.requires_grad) for params in layers), default=0)
    return 2 * (total - in_layers) + 2 * 2 * largest + 4 * trained


def full_tensor(tensor: Any) -> Any:
    """The whole tensor of a sharded (DTensor) parameter: an all-gather every rank must join; else itself."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def full_weights(model: Any) -> Iterator[tuple[str, Any]]:
    """(key, whole tensor) of every weight and buffer under the plain HF names (a LoRA model: merged, fp32).
    Sharded or not; with shards each tensor is gathered in turn, so every rank must iterate to the end."""
    items = lora.iter_merged(model, fp32=True) if lora.is_lora_model(model) else model.state_dict().items()
    # a tied weight (the LM head = the embedding) comes once, under its first name, as save_pretrained writes it:
    # named_parameters() lists a shared parameter once (the same on every rank, so the gathers stay in step)
    inner = lora.unwrap(model)
    named = {n.replace(".base_layer.", ".") for n, _ in (*inner.named_parameters(), *inner.named_buffers())}
    for key, tensor in items:
        if key in named:
            yield key, full_tensor(tensor)


class ShardedPrecision:
    """AdamW on the sharded fp32 parameters; the same interface as `precision.Precision`."""

    master = None

    def __init__(self, model: Any, mixed: bool, device: str, lr: float, betas: Any, weight_decay: float) -> None:
        self.mixed = mixed
        self.params = [p for p in model.parameters() if p.requires_grad]
        cuda = device.startswith("cuda")
        options: dict[str, Any] = {"fused": True} if cuda else {"foreach": True}
        self.optimizer = torch.optim.AdamW(self.params, lr=lr, betas=betas, weight_decay=weight_decay, **options)

    @property
    def compute_dtype(self) -> Any:
        return torch.bfloat16 if self.mixed else torch.float32

    def autocast(self, device: str) -> Any:
        return contextlib.nullcontext()  # FSDP casts the gathered parameters itself

    def after_backward(self) -> None:
        pass

    def last_backward(self) -> None:
        pass  # FSDP reduce-scatters inside its own backward hooks

    def step(self, grad_clip: float) -> Any:
        """Clip by the global gradient norm (over every rank's shards), update, zero; returns that norm."""
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, grad_clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return full_tensor(grad_norm)

    def grad_sink(self, param: Any) -> None:
        return None  # gradients go through autograd, so FSDP reduce-scatters them

    def sync_from_model(self) -> None:
        pass
