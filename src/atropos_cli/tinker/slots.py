"""The training slots on one base model: each training client's LoRA adapter (or its own full copy of the
weights) and its own AdamW state. Only the service's one worker thread calls in, one request at a time, so a
request sees exactly its slot's adapter active and never another client's.

LoRA slots are peft adapters on one shared peft model (`activate` switches the active one before each
request); a full fine-tuning slot (rank 0) owns a copy of the base weights. The log-probs of the target tokens
come from the trainer's chunked fp32 log-softmax (`trainer.step.logprobs`), on the model's device.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from atropos_cli.tinker import losses
from atropos_cli.tinker.errors import full, invalid
from atropos_cli.tinker.protowire import WireDatum

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
MICRO_TOKENS = 16384  # padded tokens per forward of forward_backward


@dataclass
class SlotSpec:
    """What a training client asked for (kept in its checkpoints: a restart rebuilds the slot from it)."""

    rank: int  # 0: full fine-tuning
    seed: int = 0
    train_attn: bool = True
    train_mlp: bool = True


@dataclass
class Slot:
    name: str
    spec: SlotSpec
    model: Any  # the shared peft model (LoRA) or the slot's own copy (full)
    params: list[Any]
    optimizer: Any = None
    pending: int = 0  # datums whose gradients are waiting for optim_step
    steps: int = 0
    extra: dict[str, Any] = field(default_factory=dict)


class Host:
    """The base model (loaded once) and the slots on it."""

    def __init__(self, model_dir: str, device: str, max_slots: int) -> None:
        from atropos_cli.inference.local import load_model

        loaded = load_model(model_dir, device, "float32" if device == "cpu" else "auto")
        self.base, self.tokenizer, self.model_dir = loaded.model, loaded.tokenizer, model_dir
        self.base.eval()
        self.max_slots = max_slots
        self.peft: Any = None  # the shared peft model, once a LoRA slot exists
        self.slots: dict[str, Slot] = {}
        self.vocab = int(self.base.config.vocab_size)
        self.max_len = int(getattr(self.base.config, "max_position_embeddings", 0) or 1 << 30)

    # -- slots -----------------------------------------------------------------------------------------
    def _targets(self, spec: SlotSpec) -> list[str]:
        leaves = (ATTN if spec.train_attn else ()) + (MLP if spec.train_mlp else ())
        found = {n.rsplit(".", 1)[-1] for n, _ in self.base.named_modules()}
        targets = [leaf for leaf in leaves if leaf in found]
        if not targets:
            raise invalid("the LoRA config trains no layer of this model", hint="set train_attn or train_mlp")
        return targets

    def check_room(self, name: str, waiting: int = 0) -> None:
        """Refuse a new slot past the limit (`waiting`: queued jobs that may free slots first: then the job that
        adds it decides)."""
        if name not in self.slots and len(self.slots) >= self.max_slots and not waiting:
            raise full(
                f"all {self.max_slots} training slots are taken",
                hint="close a ServiceClient (its session gives its clients' slots back), or raise --max-slots",
            )

    def add(self, name: str, spec: SlotSpec) -> Slot:
        import torch

        if name in self.slots:
            return self.slots[name]
        self.check_room(name)
        torch.manual_seed(spec.seed)
        if spec.rank == 0:
            inner = self.peft.get_base_model() if self.peft is not None else self.base
            model = _plain_copy(self.base, inner)
            model.load_state_dict(_without_adapters(inner), strict=True)
            model.train()
            params = [p for p in model.parameters()]
            for p in params:
                p.requires_grad_(True)
        else:
            from peft import LoraConfig

            config = LoraConfig(
                r=spec.rank,
                lora_alpha=2 * spec.rank,
                target_modules=self._targets(spec),
                bias="none",
                task_type="CAUSAL_LM",
            )
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
                if self.peft is None:
                    from peft import get_peft_model

                    self.peft = get_peft_model(self.base, config, adapter_name=name)
                else:
                    self.peft.add_adapter(name, config)
            model = self.peft
            params = [p for n, p in model.named_parameters() if f".{name}." in n and "lora_" in n]
        slot = Slot(name, spec, model, params)
        self.slots[name] = slot
        return slot

    def remove(self, name: str) -> None:
        slot = self.slots.pop(name, None)
        if slot is None or slot.spec.rank == 0:
            return
        others = [s.name for s in self.slots.values() if s.spec.rank > 0]
        if others:
            self.peft.set_adapter(others[0])  # peft keeps a deleted active adapter's name otherwise
            self.peft.delete_adapter(name)
        else:  # its last adapter: the base model goes back to plain layers
            self.base = self.peft.unload()
            self.peft = None

    def get(self, name: str) -> Slot:
        slot = self.slots.get(name)
        if slot is None:
            raise invalid(f"model {name!r} is not loaded on this server", hint="create a training client first")
        return slot

    def _activate(self, slot: Slot) -> None:
        if slot.spec.rank > 0:
            self.peft.set_adapter(slot.name)
            for p in slot.params:  # set_adapter freezes the others and unfreezes this one
                p.requires_grad_(True)

    # -- forward / backward ----------------------------------------------------------------------------
    def _check(self, data: list[WireDatum], loss: str) -> None:
        if not data:
            raise invalid("forward_backward got no data", hint="send at least one Datum")
        for i, datum in enumerate(data):
            n = len(datum.tokens)
            if n == 0:
                raise invalid(f"datum {i}: its model input has no tokens")
            if n > self.max_len:
                raise invalid(f"datum {i}: {n} tokens, over the model's context of {self.max_len}")
            if min(datum.tokens) < 0 or max(datum.tokens) >= self.vocab:
                raise invalid(f"datum {i}: a token id is outside the vocabulary (0..{self.vocab - 1})")
            losses.check_inputs(loss, n, datum.loss_fn_inputs, i)
            targets = datum.loss_fn_inputs["target_tokens"]
            if targets.min() < 0 or targets.max() >= self.vocab:
                raise invalid(f"datum {i}: a target token is outside the vocabulary (0..{self.vocab - 1})")

    def _batch_logprobs(self, slot: Slot, batch: list[WireDatum]) -> list[Any]:
        """Each datum's target log-probs from one forward over the batch (right-padded: causal attention keeps
        the padding out of every real position, and padded positions are dropped before the head)."""
        import torch

        from atropos_cli.trainer.step.logprobs import flat_token_logprobs

        inner = slot.model.get_base_model() if slot.spec.rank > 0 else slot.model
        device = next(inner.parameters()).device
        lengths = [len(d.tokens) for d in batch]
        ids = torch.zeros((len(batch), max(lengths)), dtype=torch.long, device=device)
        real = torch.zeros_like(ids, dtype=torch.bool)
        for row, datum in enumerate(batch):
            ids[row, : lengths[row]] = torch.as_tensor(datum.tokens, device=device)
            real[row, : lengths[row]] = True
        hidden = getattr(inner, inner.base_model_prefix)(input_ids=ids).last_hidden_state[real]
        targets = torch.as_tensor(np.concatenate([d.loss_fn_inputs["target_tokens"] for d in batch]), device=device)
        logp = flat_token_logprobs(hidden, inner.get_output_embeddings().weight, targets)
        return list(torch.split(logp, lengths))

    def _micro_batches(self, data: list[WireDatum]) -> list[list[WireDatum]]:
        """Consecutive datums in groups of at most MICRO_TOKENS padded tokens (one datum alone may exceed it)."""
        batches: list[list[WireDatum]] = [[]]
        for datum in data:
            widest = max([len(d.tokens) for d in batches[-1]] + [len(datum.tokens)])
            if batches[-1] and widest * (len(batches[-1]) + 1) > MICRO_TOKENS:
                batches.append([])
            batches[-1].append(datum)
        return batches

    def forward_backward(
        self, name: str, data: list[WireDatum], loss: str, config: dict[str, float], backward: bool
    ) -> tuple[list[dict[str, np.ndarray]], dict[str, float]]:
        """Each datum's target log-probs (and, for cross entropy, its per-token loss), the summed loss; with
        `backward`, the gradients added to the slot's (until optim_step)."""
        import torch

        slot = self.get(name)
        self._check(data, loss)
        self._activate(slot)
        outputs, total = [], 0.0
        with torch.set_grad_enabled(backward):
            for batch in self._micro_batches(data):
                batch_loss = None
                for datum, logp in zip(batch, self._batch_logprobs(slot, batch), strict=True):
                    inputs = {
                        k: torch.as_tensor(v, dtype=torch.float32, device=logp.device)
                        for k, v in datum.loss_fn_inputs.items()
                        if k != "target_tokens"
                    }
                    value = losses.datum_loss(loss, logp, inputs, config)
                    batch_loss = value if batch_loss is None else batch_loss + value
                    total += float(value.detach())
                    out = {"logprobs": logp.detach().float().cpu().numpy()}
                    if loss == "cross_entropy":
                        out["elementwise_loss"] = (-(logp * inputs["weights"])).detach().float().cpu().numpy()
                    outputs.append(out)
                if backward and batch_loss is not None:
                    batch_loss.backward()
        if backward:
            slot.pending += len(data)
        return outputs, {"loss:sum": total}

    def optim_step(
        self, name: str, lr: float, beta1: float, beta2: float, eps: float, wd: float, clip: float
    ) -> dict[str, float]:
        import torch

        slot = self.get(name)
        if slot.optimizer is None:
            slot.optimizer = torch.optim.AdamW(slot.params, lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
        for group in slot.optimizer.param_groups:
            group.update(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
        grads = [p for p in slot.params if p.grad is not None]
        norm = float(torch.nn.utils.clip_grad_norm_(grads, clip if clip > 0 else float("inf"))) if grads else 0.0
        slot.optimizer.step()
        slot.optimizer.zero_grad(set_to_none=True)
        slot.steps += 1
        slot.pending = 0
        return {"grad_norm:mean": norm, "learning_rate:mean": lr}

    # -- weights ---------------------------------------------------------------------------------------
    def trainable_state(self, name: str) -> dict[str, Any]:
        """The slot's trained tensors on the CPU, keyed by their parameter names (the adapter's, or all)."""
        slot = self.get(name)
        names = {id(p): n for n, p in slot.model.named_parameters()}
        return {names[id(p)].replace(f".{name}.", ".SLOT."): p.detach().cpu().clone() for p in slot.params}

    def load_trainable(self, name: str, state: dict[str, Any]) -> None:
        import torch

        slot = self.get(name)
        names = {
            n.replace(f".{name}.", ".SLOT."): p
            for n, p in slot.model.named_parameters()
            if any(p is q for q in slot.params)
        }
        missing = sorted(set(names) - set(state))
        if missing or len(state) != len(names):
            raise invalid(
                f"the checkpoint does not fit this training client ({len(missing)} tensors missing)",
                hint="load a checkpoint saved by a client with the same base model and LoRA rank",
            )
        with torch.no_grad():
            for key, param in names.items():
                param.copy_(state[key].to(param.device, param.dtype))

    def optimizer_state(self, name: str) -> dict[str, Any] | None:
        slot = self.get(name)
        return None if slot.optimizer is None else slot.optimizer.state_dict()

    def load_optimizer(self, name: str, state: dict[str, Any] | None) -> None:
        import torch

        slot = self.get(name)
        if state is None:
            slot.optimizer = None
            return
        slot.optimizer = torch.optim.AdamW(slot.params)
        slot.optimizer.load_state_dict(state)

    def merged_weights(self, name: str) -> dict[str, Any]:
        """The full model's weights as the slot computes them (adapters folded in), on the model's device."""
        slot = self.get(name)
        if slot.spec.rank == 0:
            return {k: v.detach().clone() for k, v in slot.model.state_dict().items()}
        from atropos_cli.trainer.weights.lora import iter_merged

        return {key: tensor.detach().clone() for key, tensor in iter_merged(self.peft, adapter=name)}

    def sampler_model(self, weights: dict[str, Any] | None) -> Any:
        """A plain model (no adapters) holding `weights` (None: the base model's own)."""
        plain = self.peft.get_base_model() if self.peft is not None else self.base
        # always a copy: peft adds the adapters' layers to the base model in place
        model = _plain_copy(self.base, plain)
        state = weights if weights is not None else _without_adapters(plain)
        model.load_state_dict(state, strict=True)
        return model.eval()

    def save_model_dir(self, weights: dict[str, Any], path: Path) -> None:
        """A model directory (config, tokenizer, safetensors) any HF tool loads."""
        model = self.sampler_model(weights)
        model.save_pretrained(path)
        self.tokenizer.save_pretrained(path)


def _without_adapters(inner: Any) -> dict[str, Any]:
    return {k.replace(".base_layer.", "."): v for k, v in inner.state_dict().items() if ".lora_" not in k}


def _plain_copy(base: Any, inner: Any) -> Any:
    """A fresh model of the base's class and config (no adapter layers), on its device."""
    from transformers import AutoModelForCausalLM

    device = next(inner.parameters()).device
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = AutoModelForCausalLM.from_config(base.config, dtype=next(inner.parameters()).dtype)
    if getattr(base, "generation_config", None) is not None:
        model.generation_config = copy.deepcopy(base.generation_config)
    return model.to(device)
