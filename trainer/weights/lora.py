"""LoRA for the GRPO trainer (`atropos train --lora-r N`), through peft: wrap, reference view, merge, save, load.

Where it sits: `GRPOTrainer.__init__` calls `check_lora` and `wrap` when `lora_r > 0`; only the adapter's
lora_A/lora_B matrices then require grad, so `Precision` and AdamW see nothing else. The KL reference is the
same model with its adapter switched off (`ReferenceView`): no second copy of the weights. Anything that leaves
the trainer as a full model (checkpoints, the in-process engine's weights) gets the MERGED weights
W + B·A·(alpha/r) under the base model's own key names (`merged_state_dict`), computed without touching the
training model; the adapter alone goes to `step-N/adapter/` (peft's layout, which vLLM's LoRA loader and
`PeftModel.from_pretrained` read) and is what `--resume` reloads.

peft is imported only inside the functions that need it (as torch is).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from atropos_cli.errors import ConfigError

__all__ = [
    "ALL_LINEAR",
    "ADAPTER_DIR",
    "ADAPTER",
    "check_lora",
    "wrap",
    "describe",
    "is_lora_model",
    "unwrap",
    "ReferenceView",
    "merged_keys",
    "iter_merged",
    "merged_state_dict",
    "save_merged",
    "save_adapter",
    "load_adapter",
]

ALL_LINEAR = "all-linear"  # peft's shorthand: every nn.Linear except the LM head
ADAPTER_DIR = "adapter"  # step-N/adapter/: adapter_config.json + adapter_model.safetensors
ADAPTER = "default"  # peft's name for the one adapter we train


def check_lora(r: int, alpha: int | None, dropout: float, target_modules: str) -> None:
    """Refuse bad LoRA values before any model loads (the target names are checked against the model in `wrap`)."""
    if r < 0:
        raise ConfigError(f"--lora-r must be >= 0, got {r!r}", hint="0 turns LoRA off; 8, 16 or 64 are usual ranks")
    if alpha is not None and alpha <= 0:
        raise ConfigError(f"--lora-alpha must be > 0, got {alpha!r}", hint="leave it out for the default 2 * r")
    if not 0.0 <= dropout < 1.0:
        raise ConfigError(f"--lora-dropout must be in [0, 1), got {dropout!r}", hint="0.0 (the default) or 0.05")
    if not _targets(target_modules):
        raise ConfigError(
            f"--lora-target-modules is empty: {target_modules!r}",
            hint=f"{ALL_LINEAR!r} or a comma list such as 'q_proj,k_proj,v_proj,o_proj'",
        )


def _targets(spec: str) -> list[str]:
    return [name.strip() for name in spec.split(",") if name.strip()]


def _linear_names(model: Any) -> dict[str, Any]:
    """Full module name -> module, for every nn.Linear of the model."""
    import torch

    return {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}


def _resolve_targets(model: Any, spec: str) -> str | list[str]:
    """peft's target_modules for `spec`; each name must match a Linear that is not the LM head."""
    names = _targets(spec)
    head = model.get_output_embeddings()
    # the LM head is left out: the trainer's chunked log-probs read its plain weight, never an adapter on it
    linear = [n for n, m in _linear_names(model).items() if m is not head]
    if names == [ALL_LINEAR]:
        # a mixture of experts: the nn.Linear modules by name (attention projections, a shared expert's MLP), as
        # peft's shorthand would also put adapters on the experts' grouped weights and the router (peft's
        # ParamWrapper, which swaps parameters in during the forward: not something FSDP's sharded parameters or
        # the compiled layers follow)
        return sorted({n.split(".")[-1] for n in linear}) if _has_experts(model) else ALL_LINEAR
    for target in names:
        # peft's own rule: a target matches a module whose name is it or ends with "." + it
        if not any(n == target or n.endswith("." + target) for n in linear):
            leaves = sorted({n.split(".")[-1] for n in linear})
            raise ConfigError(
                f"unknown LoRA target module {target!r} for {type(model).__name__} (the LM head is never one)",
                hint=f"{ALL_LINEAR!r} or a comma list of: {', '.join(leaves)}",
            )
    return names


def _has_experts(model: Any) -> bool:
    config = model.config
    return bool(getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None))


def wrap(model: Any, r: int, alpha: int | None, dropout: float, target_modules: str) -> Any:
    """The policy as a peft model whose only trainable parameters are the adapter's (lora_B starts at zero,
    so the wrapped model computes exactly what the base model does until the first step)."""
    from peft import LoraConfig, get_peft_model

    check_lora(r, alpha, dropout, target_modules)
    config = LoraConfig(
        r=r,
        lora_alpha=alpha if alpha is not None else 2 * r,
        lora_dropout=dropout,
        target_modules=_resolve_targets(model, target_modules),
        bias="none",
        task_type="CAUSAL_LM",
    )
    with warnings.catch_warnings():
        # peft 0.21 calls transformers 5's deprecated `is_gradient_checkpointing`; harmless, and our test suite
        # turns warnings into errors
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
        return get_peft_model(model, config)


def describe(model: Any) -> str:
    """One line for the run's log: rank, alpha and how few parameters train (targets: adapter_config.json)."""
    config = model.peft_config[ADAPTER]
    trainable, total = model.get_nb_trainable_parameters()
    share = f"{trainable:,} of {total:,} parameters ({trainable / total:.2%})"
    return f"LoRA r={config.r}, alpha {config.lora_alpha}: training {share}"


def is_lora_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def unwrap(model: Any) -> Any:
    """The transformers model inside a peft wrapper (its layers hold the adapters); any other model as is."""
    return model.get_base_model() if is_lora_model(model) else model


class ReferenceView:
    """The KL reference of a LoRA run: the policy with its adapter switched off (the frozen base model).

    `grpo._body_and_head` recognises it and returns a body that runs under `disable_adapter()`, so the
    reference log-probs cost one extra forward and no extra weights."""

    def __init__(self, peft_model: Any) -> None:
        self.peft_model = peft_model

    def disabled(self) -> AbstractContextManager[Any]:
        return self.peft_model.disable_adapter()

    def wrap_body(self, body: Any) -> Any:
        def forward(*args: Any, **kwargs: Any) -> Any:
            with self.disabled():
                return body(*args, **kwargs)

        return forward


def _lora_layers(inner: Any, adapter: str = ADAPTER) -> dict[str, Any]:
    from peft.tuners.lora import LoraLayer

    return {name: m for name, m in inner.named_modules() if isinstance(m, LoraLayer) and adapter in m.lora_A}


def merged_keys(model: Any) -> list[str]:
    """The keys `iter_merged` yields, without computing anything."""
    return [k.replace(".base_layer.", ".") for k in unwrap(model).state_dict() if ".lora_" not in k]


def iter_merged(model: Any, fp32: bool = False, adapter: str = ADAPTER) -> Iterator[tuple[str, Any]]:
    """(key, tensor) of the base model with every adapter folded in (W + B·A·scaling), under the plain key names
    (no `base_model.model.` prefix, no `.base_layer`, no lora_* tensors). One merged weight exists at a time, so
    a sync into the inference engine needs no second copy of the model; the training model is untouched.

    Merged weights come in the base weights' dtype, or in fp32 with `fp32=True`: a bf16 base (bf16-pure) plus a
    small update rounds back to the base weight, so a caller with its own dtype should cast only once."""
    import torch

    inner = unwrap(model)
    layers = _lora_layers(inner, adapter)
    for key, tensor in inner.state_dict().items():
        if ".lora_" in key:
            continue
        clean = key.replace(".base_layer.", ".")
        module, _, leaf = clean.rpartition(".")
        if leaf == "weight" and module in layers:
            with torch.no_grad():
                delta = layers[module].get_delta_weight(adapter)
                merged = tensor.float() + delta.float()
                tensor = merged if fp32 else merged.to(tensor.dtype)
        yield clean, tensor


def merged_state_dict(model: Any, device: str | None = None) -> dict[str, Any]:
    """`iter_merged` as a dict, each tensor moved to `device` if given (the checkpoint writer asks for cpu)."""
    return {key: tensor if device is None else tensor.to(device) for key, tensor in iter_merged(model)}


def save_merged(model: Any, path: Path) -> None:
    """A full model directory (config + merged safetensors) that any HF tool or vLLM loads without peft."""
    unwrap(model).save_pretrained(path, state_dict=merged_state_dict(model, device="cpu"))


def save_adapter(model: Any, path: Path) -> Path:
    """Only the adapter (adapter_config.json + adapter_model.safetensors) in `path`."""
    path.mkdir(parents=True, exist_ok=True)
    # embeddings are never targeted (check in `_resolve_targets`); False also skips peft's hub lookup of the
    # base config, which an offline run would wait on
    model.save_pretrained(path, save_embedding_layers=False)
    return path


def save_adapter_tensors(model: Any, tensors: dict[str, Any], path: Path) -> Path:
    """`save_adapter` from gathered tensors (`model.state_dict()` keys, e.g. the whole tensors of a sharded
    model) instead of the model's own: the same adapter_config.json + adapter_model.safetensors."""
    from peft.utils import get_peft_model_state_dict
    from safetensors.torch import save_file

    path.mkdir(parents=True, exist_ok=True)
    weights = get_peft_model_state_dict(model, state_dict=tensors, adapter_name=ADAPTER, save_embedding_layers=False)
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "adapter_model.safetensors"))
    model.peft_config[ADAPTER].save_pretrained(str(path))
    return path


def load_adapter(model: Any, path: Path) -> None:
    """Load adapter weights saved by `save_adapter` into the wrapped policy, refusing a partial match."""
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    weights = path / "adapter_model.safetensors"
    if not weights.is_file():
        raise ConfigError(
            f"no adapter weights at {str(weights)!r}",
            hint="resume a LoRA run from its own --out (its checkpoints hold step-N/adapter/)",
        )
    device = next(model.parameters()).device
    result = set_peft_model_state_dict(model, load_file(weights, device=str(device)), adapter_name=ADAPTER)
    # peft annotates the result as a bare namedtuple; it is torch's _IncompatibleKeys
    missing = [k for k in result.missing_keys if ".lora_" in k]  # type: ignore[attr-defined]
    unexpected = list(result.unexpected_keys)  # type: ignore[attr-defined]
    if missing or unexpected:
        bad = (missing or unexpected)[0]
        raise ConfigError(
            f"adapter at {str(path)!r} does not fit the model: {bad!r}",
            hint="resume with the --model and --lora-* flags of the original run",
        )
