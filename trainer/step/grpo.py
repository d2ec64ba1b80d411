"""GRPO (and its family: DAPO, Dr. GRPO, GSPO, CISPO): one optimizer step per batch of scored groups.

The algorithm, top to bottom (`GRPOTrainer.step`):
1. groups -> samples: group-relative advantages (score - mean) / std, overrides applied, DAPO's dynamic
   sampling drops groups without reward spread (`batching.prepare`);
2. samples -> micro-batches under a token budget: similar lengths padded together, or (`--pack`) laid end to
   end with no padding (`batching.micro_batches`);
3. for each micro-batch: the transformer body gives hidden states (bf16 on GPU, fp32 on CPU); only trained
   positions go on to the LM head, whose per-token log-probs are fp32 and chunked so no [B, T, vocab] logits
   exist (`logprobs.flat_token_logprobs`), at each rollout's sampling temperature; the policy loss
   (`losses.policy_loss`) is this micro-batch's exact share of the step loss, so accumulating gradients is the
   same as one big batch; backward;
4. clip the gradient norm, AdamW step on fp32 master weights (a 1e-6 update is never rounded away, unlike
   bf16 weights; `precision.py` keeps the master copy when the model itself computes in bf16), zero the grads;
5. one host sync to read the step's metrics.

`train(...)` runs the loop: pull a batch from any iterator of group lists (rollout files, the trajectory
API, the in-process env workers), step, write metrics, sync weights to the inference engine, checkpoint.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Literal

from atropos_cli.attention import describe
from atropos_cli.errors import ConfigError, ModelLoadError
from atropos_cli.types import ScoredGroup
from atropos_cli.vision import VisionInputs, is_vision_config, positions

from ..checkpoint import CHECKPOINTS, latest_checkpoint, load_optimizer_state, read_trainer_state, save_checkpoint
from ..config import (
    GRPOConfig,
    activation_bytes_per_token,
    auto_grad_sync,
    check_fits,
    default_micro_batch_tokens,
    gpu_budget_bytes,
    host_threads,
)
from ..data.draws import EmptyDraws, draw_metrics
from ..scale import fsdp, meta_init, replicate
from ..scale.distributed import Dist, assign_groups
from ..weights import lora
from .attention import VARLEN_NAME, compile_body, flash_varlen, use_varlen
from .batching import (
    Deferred,
    Sample,
    StaticShape,
    image_micro_batches,
    micro_batches,
    narrow_warmups,
    prepare,
    static_rows,
)
from .graphs import CudaRecorder, MicroBatchGraphs
from .logprobs import flat_token_logprobs
from .losses import LossStats, Normaliser, distill_loss, policy_loss
from .metrics import loss_metrics, reward_metrics
from .precision import Dtype, Precision
from .router import router_for
from .vision_rows import VisionRows, refuse_images

__all__ = ["GRPOConfig", "GRPOTrainer", "train", "resolve_device", "packing_mode", "PackMode"]


def resolve_device(name: str) -> str:
    import torch

    if name != "auto":
        return name
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(name: str, device: str) -> Dtype:
    """ "auto": bf16 weights with an fp32 master on CUDA (fast, loses no update), plain fp32 on CPU (where bf16
    matrix products are slow)."""
    if name != "auto":
        return name  # type: ignore[return-value]
    return "bf16-pure" if device.startswith("cuda") else "fp32"


def load_policy(name: str, device: str) -> tuple[Any, Any]:
    """fp32 model (the master weights) + tokenizer, from a shipped name, a directory or a hub id."""
    import torch

    from atropos_cli.inference.local import pretrained
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    tokenizer = load_tokenizer(name)
    try:
        model, _ = pretrained(resolve_model_path(name), torch.float32)
    except OSError as exc:
        raise ModelLoadError(f"cannot load model {name!r}: {exc}", hint="pass a saved model directory") from None
    # transformers' stubs type the self argument of the decorated `.to()` wrongly
    return model.to(device), tokenizer  # type: ignore[arg-type]


def _body_and_head(model: Any) -> tuple[Any, Any]:
    """The transformer without its LM head, and the head's weight [vocab, hidden].

    Through a peft wrapper too (the body's layers then carry the adapters); for a LoRA run's KL reference
    (`lora.ReferenceView`) the body runs with the adapter switched off."""
    if isinstance(model, lora.ReferenceView):
        body, head_weight = _body_and_head(model.peft_model)
        return model.wrap_body(body), head_weight
    model = lora.unwrap(model)
    body = getattr(model, getattr(model, "base_model_prefix", "model"), None)
    head = model.get_output_embeddings()
    if body is None or head is None or getattr(head, "bias", None) is not None:
        raise ModelLoadError(
            f"model {type(model).__name__!r} has no separable body + bias-free LM head",
            hint="use a standard *ForCausalLM model (Llama, Qwen2, Mistral, ...)",
        )
    return body, head.weight


def _pieces(position_ids: Any) -> dict[str, Any]:
    """varlen attention's keyword arguments for a packed row whose positions restart at 0 with each sample."""
    import torch

    starts = (position_ids[0] == 0).nonzero()[:, 0]
    cu = torch.cat([starts, starts.new_tensor([position_ids.shape[1]])]).to(torch.int32)
    longest = int((cu[1:] - cu[:-1]).max())
    return {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}


PackMode = Literal["off", "rows", "static"]
# How packed rows are compiled (benchmarks/bench_trainer.py compares the alternatives, results/trainer_gpu.md):
# decoder layers one by one (the 24 layers share one graph: a first step of ~12 s instead of ~80-150 s for the
# whole body, same speed), rows ending at their last sample with the width marked dynamic (no filler tokens).
REGIONAL_COMPILE: bool | str = True  # True, "dynamic" (every dimension symbolic from the start) or False
EXACT_ROWS = True


def packing_mode(model: Any, pack: bool | None, device: str, dtype: str = "auto") -> PackMode:
    """How micro-batches are laid out; on CUDA this also switches the model's attention.

    - "off": padded rows, similar lengths together (the CPU default; on CUDA too for a model with attention sinks
      or soft-capped scores, which the varlen flash kernel lacks);
    - "static" (the CUDA default): samples end to end in rows of exactly `micro_batch_tokens` tokens (the rest
      is filler), attention confined to each sample by torch's varlen flash kernel (`atropos_varlen`). Every
      micro-batch has one shape, so the compiled body compiles once, and no padding reaches the model;
    - "rows" (CPU `--pack`, or CUDA where torch lacks varlen attention): samples end to end in rows as long as
      they come; on CPU, and on CUDA with `--dtype fp32` (the flash kernel computes in bf16/fp16 only), through
      `atropos_varlen`'s dense path (exact for every model: transformers' packed-position mask is not built by
      every model, gpt-oss's for one); on CUDA where torch lacks varlen attention, through flex attention.
    """
    cuda = device.startswith("cuda")
    if is_vision_config(lora.unwrap(model).config):  # mrope positions per row: padded rows, the model's attention
        if pack:
            raise ConfigError(
                "packing is not supported for vision-language models (each row's mrope positions and images)",
                hint="drop --pack (padded rows; image rows one a micro-batch)",
            )
        return "off"
    if not (cuda if pack is None else pack):
        return "off"
    if not cuda or resolve_dtype(dtype, device) == "fp32":  # varlen attention's dense path: exact for every model
        use_varlen(lora.unwrap(model))
        return "rows"
    model = lora.unwrap(model)
    facts = describe(model)
    if facts.sinks or facts.attn_softcap:  # the varlen flash kernel has neither: padded rows, the model's attention
        if pack:
            raise ConfigError(
                f"packing on CUDA needs the varlen flash kernel, which has no {'sinks' if facts.sinks else 'soft-cap'}",
                hint="drop --pack (padded rows with the model's own attention, the default for this model)",
            )
        return "off"
    try:
        if flash_varlen() is not None:
            use_varlen(model)
            return "static"
        model.set_attn_implementation("flex_attention")
    except (ValueError, ImportError, RuntimeError, AttributeError) as exc:
        raise ConfigError(
            f"packing needs varlen or flex attention on CUDA, which this model/torch refused: {exc}",
            hint="pass --no-pack (padded micro-batches) or upgrade torch/transformers",
        ) from None
    return "rows"


class GRPOTrainer:
    """Owns the policy, its fp32 master weights (`precision.py`), the optional frozen reference and AdamW."""

    def __init__(self, config: GRPOConfig, model: Any = None, tokenizer: Any = None, dist: Dist | None = None) -> None:
        import torch

        self.config = config
        self.loss_cfg = config.loss_config()
        config.check_lora()  # bad --lora-* values fail before any model loads
        self.dist = dist
        self.device = dist.device if dist is not None else resolve_device(config.device)
        threads = host_threads(self.device, torch.get_num_threads(), os.environ)
        if threads is not None:
            torch.set_num_threads(threads)
        torch.manual_seed(config.seed)
        # many ranks: the policy is built on the meta device and each rank fills only its shard after sharding
        # (meta_init.py); a meta-built model passed in (a benchmark's shape) gets random weights the same way
        self.weights_from: Path | None = None  # the checkpoint a meta-built policy is read from
        if model is None and dist is not None:
            model, tokenizer, self.weights_from = meta_init.empty_policy(config.model)
        elif model is None:
            model, tokenizer = load_policy(config.model, self.device)
        empty = meta_init.is_empty(model)
        self.model, self.tokenizer = (model.float() if empty else model.to(self.device).float()), tokenizer
        if config.lora_r > 0:
            self.model = lora.wrap(
                self.model, config.lora_r, config.lora_alpha, config.lora_dropout, config.lora_target_modules
            )
        if config.gradient_checkpointing:
            # transformers 5 renamed it (the old name warns); both forward through a peft wrapper
            enable = getattr(self.model, "activation_checkpointing_enable", None)
            (enable or self.model.gradient_checkpointing_enable)()
            if self.is_lora:  # the embeddings are frozen: without this no gradient reaches a checkpointed block
                self.model.enable_input_require_grads()
        self.model.train()
        # a vision-language policy's image side: its processor, where its chat template puts images
        self.vision = vision_rows_for(lora.unwrap(self.model), self.tokenizer, config.model)
        self.pack = packing_mode(self.model, config.pack, self.device, config.dtype)
        # Gemma 2's logits = cap * tanh(h·Wᵀ / cap): read once, the policy's and the reference's alike
        self.final_softcap = describe(lora.unwrap(self.model)).final_softcap
        # MoE: the router's load-balancing loss as the config says, and load-balance metrics (router.py)
        self.router = router_for(lora.unwrap(self.model).config)
        self._router_logits: Any = None  # the policy forward's, for _train_micro_batch
        # --parallel and --micro-batch-tokens are resolved once, so config.yaml and checkpoints record the values
        total = sum(p.numel() for p in self.model.parameters())
        trainable = sum(p.numel() for p in self.model.parameters() if p.requires_grad)
        gpu = gpu_budget_bytes(self.device) if self.device.startswith("cuda") else None
        world = dist.world if dist is not None else 1
        if dist is not None:
            config.parallel = replicate.choose(config.parallel, self.device, world, total, trainable, gpu)
        self.replicated = dist is not None and config.parallel == "replicate"
        sharded = dist is not None and not self.replicated
        eager = self.pack == "off" and getattr(self.model.config, "_attn_implementation", None) == "eager"
        per_token = activation_bytes_per_token(self.model.config.get_text_config(), config.gradient_checkpointing,
                                               config.max_len if eager else 0)  # fmt: skip
        layout: replicate.Parallel = "fsdp" if sharded else "replicate"
        self.dtype = dtype = resolve_dtype(config.dtype, self.device)
        gathered = fsdp.gathered_bytes(self.model, world, torch.device(self.device).type) if sharded else None
        frozen = 4 if dtype == "fp32" else 2  # FSDP shards frozen weights in the compute dtype (fsdp.py)
        held_by = functools.partial(replicate.state_bytes, total, trainable, layout, world, gathered=gathered,
                                    frozen_bytes=frozen)  # fmt: skip
        if config.grad_sync == "auto":
            config.grad_sync = auto_grad_sync(gpu, sharded, held_by("step"), per_token)
        held = held_by(config.grad_sync)
        if config.micro_batch_tokens is None:
            config.micro_batch_tokens = default_micro_batch_tokens(self.device, sharded, gpu, held, per_token)
        self.micro_batch_tokens: int = config.micro_batch_tokens
        check_fits(gpu, held, per_token, self.micro_batch_tokens)
        self.static_shape = StaticShape.for_budget(self.micro_batch_tokens, config.max_len, EXACT_ROWS)
        compile_on = self.device.startswith("cuda") if config.compile is None else config.compile
        compile_on = compile_on and self.vision is None  # a VL model's body runs eager (image rows vary in shape)
        if compile_on and self.device.startswith("cuda"):
            if config.activation_memory_budget is not None:
                import torch._functorch.config as functorch_config

                functorch_config.activation_memory_budget = config.activation_memory_budget
            compile_body(lora.unwrap(self.model), _body_and_head(self.model)[0], REGIONAL_COMPILE)
        self.ref_model = None
        if self.loss_cfg.kl_beta > 0 and self.is_lora:
            self.ref_model = lora.ReferenceView(self.model)  # the base model = the policy with its adapter off
        elif self.loss_cfg.kl_beta > 0:
            self.ref_model = self._reference_model()
            if getattr(lora.unwrap(self.model).config, "_attn_implementation", None) == VARLEN_NAME:
                use_varlen(self.ref_model)  # the reference reads the same packed rows
        # the log-prob forward of the policy and of the reference: plain calls, or the FSDP roots (fsdp.py)
        self.policy: Any = functools.partial(self._logprobs, self.model)
        self.reference: Any = functools.partial(self._logprobs, self.ref_model) if self.ref_model is not None else None
        self.precision: Precision | fsdp.ShardedPrecision
        if dist is not None and not self.replicated:
            self._shard(dist, dtype != "fp32")
        else:
            for built in (self.model, self.ref_model):  # meta-built, not sharded (replicas): filled whole
                meta_init.fill_if_empty(built, self.device, self.weights_from, config.seed)
            if dist is not None:  # replicas start from rank 0's weights and sum their gradients (replicate.py)
                replicate.broadcast_weights(self.model, dist.group)
            self.precision = Precision(self.model, dtype, self.device, config.lr, config.betas, config.weight_decay)
            if dist is not None:  # summed bucket by bucket while the step's last backward runs
                reducer = replicate.OverlappedSum(self.precision.optimized, dist.group)
                head = _body_and_head(self.model)[1]
                tied = head is lora.unwrap(self.model).get_input_embeddings().weight
                self.precision.sum_over(reducer, head, tied)
        self.optimizer = self.precision.optimizer
        self.graphs: MicroBatchGraphs | None = None
        refused = self._graphs_refused(dtype)
        if config.cuda_graphs and refused:
            raise ConfigError(f"--cuda-graphs needs {refused}", hint="drop --cuda-graphs (the default decides)")
        # auto: on where a micro-batch's activations fit twice (a shape's first, eager micro-batch runs beside the
        # recordings' memory pool)
        fits = gpu is not None and 2 * self.micro_batch_tokens * per_token + held <= 0.8 * gpu
        if not refused and (config.cuda_graphs or (config.cuda_graphs is None and fits)):
            self.static_shape = StaticShape.for_budget(self.micro_batch_tokens, config.max_len, bucketed=True)
            undo, summed = self.precision.discard_pending, getattr(self.precision, "reducer", None)
            # many ranks: NCCL's watchdog thread may query its events while this thread records
            recorder = CudaRecorder("thread_local" if dist is not None else "global")
            ahead = functools.partial(narrow_warmups, shape=self.static_shape)
            self.graphs = MicroBatchGraphs(self._train_micro_batch, self.device, recorder, undo, summed, ahead)
        self.step_count = 0
        self.batches_seen = 0  # batches pulled from the source, trained or skipped: the data cursor of --resume

    def _reference_model(self) -> Any:
        """The frozen KL reference of a full fine-tune: the policy's weights, loaded again (meta-built and
        filled shard by shard after sharding when the policy is, `_shard`)."""
        if self.weights_from is not None:
            ref = meta_init.empty_policy(self.config.model)[0]
        else:
            ref = load_policy(self.config.model, self.device)[0]
        return ref.eval().requires_grad_(False)

    def paths(self) -> list[str]:
        """One line per part of the training path this run takes (said before the first step)."""
        from atropos_cli.paths import attention_line, trainer_attention_path

        model = lora.unwrap(self.model)
        world = self.dist.world if self.dist is not None else 1
        parallel = "one process"
        if self.dist is not None:
            parallel = f"{world} replicas" if self.replicated else f"FSDP over {world} ranks"
        layout = {
            "static": f"packed rows of {self.micro_batch_tokens} tokens ({trainer_attention_path(model)})",
            "rows": "packed rows (varlen attention's dense path)",
            "off": "padded rows",
        }[self.pack]
        if self.vision is not None:
            layout = trainer_attention_path(model)
        graphs = "CUDA graphs: on" if self.graphs is not None else "CUDA graphs: off"
        if self.graphs is None and (why := self._graphs_refused(self.dtype)) is not None:
            graphs += f" (they need {why})"
        return [attention_line(model), f"training: {layout}; {parallel}; {graphs}"]

    def _graphs_refused(self, dtype: str) -> str | None:
        """Why this run cannot replay micro-batches as CUDA graphs (graphs.py), or None."""
        cfg = self.config
        reasons = (
            (not self.device.startswith("cuda"), "a CUDA device"),
            (self.pack != "static", "packed micro-batches (--pack, torch's varlen attention)"),
            (self.dist is not None and not self.replicated, "one process or replicas (FSDP replays no graphs yet)"),
            (dtype != "bf16-pure", "--dtype bf16-pure (the CUDA default): gradients must land in the fp32 master"),
            (self.ref_model is not None, "no KL reference (--kl-beta 0)"),
            (self.is_lora, "full fine-tuning (LoRA replays no graphs yet)"),
            (cfg.gradient_checkpointing, "no --gradient-checkpointing"),
        )
        return next((why for refused, why in reasons if refused), None)

    def _shard(self, dist: Dist, mixed: bool) -> None:
        """FSDP2 over the run's ranks (fsdp.py): the policy, and a full-model reference on its own."""
        cfg = self.config
        view = self.ref_model if self.is_lora else None
        self.policy = fsdp.shard(self.model, self._logprobs, dist.mesh, mixed, reference=view)
        meta_init.fill_if_empty(self.policy, self.device, self.weights_from, cfg.seed)  # each rank its own shards
        if view is not None:
            self.reference = functools.partial(self.policy, reference=True)
        elif self.ref_model is not None:
            self.reference = fsdp.shard(self.ref_model, self._logprobs, dist.mesh, mixed)
            meta_init.fill_if_empty(self.reference, self.device, self.weights_from, cfg.seed)
        self.precision = fsdp.ShardedPrecision(self.model, mixed, self.device, cfg.lr, cfg.betas, cfg.weight_decay)

    def _logprobs(self, model: Any, mb: Any) -> Any:
        """Log-probs of the trained tokens of a micro-batch, fp32, in its loss layout [samples, T] (0 elsewhere)."""
        import torch

        body, head_weight = _body_and_head(model)
        # no KV cache: training never decodes, and with a cache transformers would not see the packing
        inputs: dict[str, Any] = {"input_ids": mb.input_ids, "use_cache": False}
        if mb.cu_seqlens is not None:  # static packing: varlen attention within the pieces cu_seqlens delimits
            if self.static_shape.exact:  # one compiled graph for every row width
                torch._dynamo.mark_dynamic(mb.input_ids, 1)
                torch._dynamo.mark_dynamic(mb.position_ids, 1)
            inputs["position_ids"] = mb.position_ids
            inputs.update(cu_seq_lens_q=mb.cu_seqlens, cu_seq_lens_k=mb.cu_seqlens)
            inputs.update(max_length_q=mb.max_doc_len, max_length_k=mb.max_doc_len)
        elif mb.packed:  # no mask: attention is kept within each sample by the restarting position ids
            inputs["position_ids"] = mb.position_ids
            if getattr(lora.unwrap(model).config, "_attn_implementation", None) == VARLEN_NAME:
                inputs.update(_pieces(mb.position_ids))
        elif mb.padded:  # else no mask at all: attention takes the plain causal (flash) path
            inputs["attention_mask"] = mb.attention_mask
        if self.vision is not None:  # mrope positions from the model's rope index, images with their row
            images = None
            if mb.pixel_values is not None:
                images = VisionInputs(mb.pixel_values, mb.image_grid_thw)
                inputs.update(pixel_values=mb.pixel_values, image_grid_thw=mb.image_grid_thw)
            mask = mb.attention_mask if mb.padded else None
            inputs["position_ids"] = positions(lora.unwrap(self.model), mb.input_ids, images, mask)  # no weights read
        routed = self.router is not None and torch.is_grad_enabled()  # the policy's forward, not the reference's
        if routed:
            inputs["output_router_logits"] = True
        with self.precision.autocast(self.device):
            output = body(**inputs)
        hidden = output.last_hidden_state
        if routed:
            self._router_logits = output.router_logits
        # only trained positions reach the LM head (prompt tokens need no logits); its inputs are in the compute
        # dtype (as autocast would give them), its logits fp32
        hidden = hidden.reshape(-1, hidden.shape[-1]).index_select(0, mb.select).to(self.precision.compute_dtype)
        targets = mb.targets.reshape(-1).index_select(0, mb.select)
        sink = self.precision.grad_sink(head_weight) if torch.is_grad_enabled() else None
        if sink is not None and isinstance(self.precision, Precision):
            self.precision.watch_sink(hidden, head_weight)
        logp = flat_token_logprobs(
            hidden, head_weight, targets, mb.inv_temperature, self.config.chunk_size, sink, self.final_softcap
        )
        out = torch.zeros(mb.loss_mask.numel(), dtype=logp.dtype, device=logp.device)
        return out.index_copy(0, mb.place, logp).view_as(mb.loss_mask)

    def step(self, groups: list[ScoredGroup]) -> dict[str, Any]:
        """One optimizer step on `groups`; returns the step's metrics (no step is taken if nothing trains)."""
        import torch

        cfg, started = self.config, time.perf_counter()
        # many ranks: each builds only its own groups' samples (the counts stay the whole batch's)
        keep = self._my_groups if self.dist is not None else None
        loss_cfg = self.loss_cfg
        vision = None
        if self.vision is None:
            refuse_images(groups, cfg.model)
        else:
            groups, vision = self.vision.expand(groups)
        prepared = prepare(groups, loss_cfg.scale_rewards, loss_cfg.dynamic_sampling, cfg.max_len, keep, vision)
        metrics = reward_metrics(prepared)
        if self.vision is not None:  # the image rows that reach the policy's forward with their pixels
            metrics["image_rows"] = sum(s.vision is not None for s in prepared.samples)
        if not prepared.sequences:
            return {**metrics, "skipped": True, "step_time_s": time.perf_counter() - started}
        self._set_lr()
        norm = Normaliser(prepared.sequences, prepared.trained_tokens)
        stats = LossStats()
        total_loss = torch.zeros((), device=self.device)
        batches = self._micro_batches(prepared.samples)
        # every rank makes the same FSDP calls: a rank with fewer micro-batches runs zero-weight fillers (replicas
        # only meet once a step, in precision.step)
        fsdp_dist = None if self.replicated else self.dist
        count = fsdp_dist.max_int(len(batches)) if fsdp_dist is not None else len(batches)
        for i in range(count):
            if fsdp_dist is not None and cfg.grad_sync == "step":  # reduced once, after the last micro-batch
                self.policy.set_requires_gradient_sync(i == count - 1)
            last = i == len(batches) - 1  # replicas: this backward starts the gradient sum bucket by bucket
            if last and self.graphs is None:  # (graphs start it themselves: a replay runs no hooks)
                self.precision.last_backward()
            if i >= len(batches):
                self._filler_pass()
                continue
            mb = batches[i]
            if self.graphs is not None:  # the recording of its shape, replayed (graphs.py)
                loss = self.graphs(mb, norm, stats, last)
            else:
                loss = self._train_micro_batch(mb.to(self.device), norm, stats)
            total_loss += loss
            stats.add("padded_tokens", mb.input_ids.numel())
            stats.add("real_tokens", mb.real_tokens)
        grad_norm = self.precision.step(cfg.grad_clip)
        self.step_count += 1
        sums = stats.floats(loss=total_loss, grad_norm=torch.as_tensor(grad_norm))  # the step's one host sync
        grad_norm = sums.pop("grad_norm")
        if self.dist is not None:  # every rank's share of the sums
            sums = self.dist.sum_floats(sums)
        elapsed = time.perf_counter() - started
        return {
            **metrics,
            **loss_metrics(sums, norm),
            "loss": sums["loss"],
            "grad_norm": grad_norm,
            "lr": self.optimizer.param_groups[0]["lr"],
            "step_time_s": elapsed,
            "train_tokens_per_s": sums["padded_tokens"] / elapsed,
        }

    def _train_micro_batch(self, mb: Any, norm: Normaliser, stats: LossStats) -> Any:
        """Forward, loss and backward of one micro-batch on the device; its loss, detached. What a CUDA graph
        records (graphs.py): nothing here may sync with the host."""
        import torch

        logp = self.policy(mb)
        aux = None
        if self.router is not None:  # before the reference's forward; its share of the step (router.py)
            tokens = mb.loss_mask.sum()
            aux = self.router.term(self._router_logits, mb.attention_mask, tokens, norm.token_divisor, stats)
            self._router_logits = None
        ref = None
        if self.reference is not None:
            with torch.no_grad():
                ref = self.reference(mb)
        cfg = self.config
        loss = policy_loss(
            logp, mb.advantages, mb.loss_mask, self.loss_cfg, norm, inference_logp=mb.inference_logp, ref_logp=ref,
            stats=stats,
        )  # fmt: skip
        if cfg.distill_beta > 0 and mb.teacher_logp is not None and mb.teacher_mask is not None:
            covered = mb.teacher_mask * mb.loss_mask
            loss = loss + cfg.distill_beta * distill_loss(logp, mb.teacher_logp, covered, norm)
            stats.add("distill_kl_sum", ((logp.detach() - mb.teacher_logp) * covered).sum())
            stats.add("distill_tokens", covered.sum())
        if aux is not None:
            loss = loss + aux
        # FSDP averages gradients over ranks; each rank's loss is its share of the sum (fsdp.py); replicas sum
        fsdp_dist = None if self.replicated else self.dist
        (loss * fsdp_dist.world if fsdp_dist is not None else loss).backward()
        self.precision.after_backward()
        return loss.detach()

    def _filler_pass(self) -> None:
        """A rank with fewer micro-batches than the others joins their collectives with a zero-weight one."""
        import torch

        mb = self._filler().to(self.device)
        logp = self.policy(mb)
        if self.reference is not None:
            with torch.no_grad():
                self.reference(mb)
        (logp.sum() * 0.0).backward()  # joins the collectives, adds nothing

    def _my_groups(self, loads: dict[int, int]) -> set[int]:
        """This rank's whole groups of the step (`distributed.assign_groups` over the groups' token loads)."""
        assert self.dist is not None
        order = sorted(loads)
        return {order[i] for i in assign_groups([loads[g] for g in order], self.dist.world)[self.dist.rank]}

    def _filler(self) -> Any:
        """A two-token micro-batch whose loss is multiplied by zero (a rank with less work than the others)."""
        filler = Sample(tokens=[0, 0], trained=[True], advantages=[0.0], temperature=1.0, inference_logprobs=None)
        return self._micro_batches([filler])[0]

    def _micro_batches(self, samples: list[Any]) -> Sequence[Any]:
        """The step's micro-batches; static ones are collated as they are read (`batching.Deferred`)."""
        if not samples:
            return []
        images = [s for s in samples if s.vision is not None]
        if images:
            text = [s for s in samples if s.vision is None]
            return [*self._micro_batches(text), *image_micro_batches(images)]
        if self.pack == "static":
            return Deferred(static_rows(samples, self.static_shape), self.static_shape)
        return micro_batches(samples, self.micro_batch_tokens, self.pack == "rows")

    def _set_lr(self) -> None:
        warm = self.config.warmup_steps
        factor = min(1.0, (self.step_count + 1) / warm) if warm else 1.0
        for group in self.optimizer.param_groups:
            group["lr"] = self.config.lr * factor

    def save(self, out: Path) -> Path:
        """OUT/checkpoints/step-N (sharded: every rank must call it; sharded_checkpoint.py)."""
        state = {"config": self.config.model_dump(mode="json"), "batches_seen": self.batches_seen}
        keep = self.config.keep_checkpoints
        if self.dist is not None and self.replicated:  # every rank holds the same state: rank 0 writes it whole
            path = None
            if self.dist.is_main:
                saved = self._saved_tokenizer
                path = save_checkpoint(out, self.step_count, self.model, saved, self.optimizer, state, keep)
            self.dist.barrier()
            return path or out / CHECKPOINTS / f"step-{self.step_count}"
        if self.dist is not None:
            from ..scale.sharded_checkpoint import save_sharded

            return save_sharded(out, self.step_count, self, state, keep, self.dist)
        return save_checkpoint(out, self.step_count, self.model, self._saved_tokenizer, self.optimizer, state, keep)

    @property
    def _saved_tokenizer(self) -> Any:
        """What a checkpoint saves beside the weights: the tokenizer, and a VL model's image processor (a checkpoint
        directory then loads as the model it came from)."""
        return self.tokenizer if self.vision is None else self.vision.saved_with(self.tokenizer)

    @property
    def is_lora(self) -> bool:
        """True when only LoRA adapters train (`lora_r > 0`); `self.model` is then a peft model."""
        return lora.is_lora_model(self.model)

    def save_adapter(self, path: Path) -> Path:
        """Write only the adapter (adapter_config.json + adapter_model.safetensors) to `path`: what vLLM's
        LoRA loading and `PeftModel.from_pretrained` read. Checkpoints hold it too, under step-N/adapter/."""
        if not self.is_lora:
            raise ConfigError("this run trains the full model: it has no adapter to save", hint="pass --lora-r 16")
        return lora.save_adapter(self.model, Path(path))

    def resume(self, out: Path) -> Path | None:
        """Load the latest OUT/checkpoints/step-N (weights, optimizer, step); None if there is none."""
        checkpoint = latest_checkpoint(out)
        if checkpoint is None:
            return None
        if self.replicated:
            from ..scale.sharded_checkpoint import is_sharded

            if is_sharded(checkpoint):
                raise ConfigError(
                    f"{checkpoint} is sharded (an FSDP run wrote it): --parallel replicate resumes one-process "
                    "and replicated checkpoints only",
                    hint="drop --parallel replicate: --parallel auto resumes a sharded checkpoint sharded",
                )
        elif self.dist is not None:
            from ..scale.sharded_checkpoint import load_sharded

            meta = load_sharded(checkpoint, self, self.dist)
            self.step_count, self.batches_seen = int(meta["step"]), int(meta.get("batches_seen", meta["step"]))
            return checkpoint
        if self.is_lora:  # the adapter itself, not the merged weights: the base stays bit-identical
            lora.load_adapter(self.model, checkpoint / lora.ADAPTER_DIR)
        else:
            from transformers import AutoModelForCausalLM

            loaded = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=self.model.dtype)
            self.model.load_state_dict(loaded.state_dict())
        self.precision.sync_from_model()
        load_optimizer_state(checkpoint, self.optimizer)
        state = read_trainer_state(checkpoint)
        self.step_count = int(state["step"])
        self.batches_seen = int(state.get("batches_seen", self.step_count))
        return checkpoint


def vision_rows_for(model: Any, tokenizer: Any, name: str) -> VisionRows | None:
    """A VL policy's `VisionRows` (its image processor from the model's directory); None for a text-only one."""
    from atropos_cli.resources import resolve_model_path
    from atropos_cli.vision import VisionProcessor

    if not is_vision_config(model.config):
        return None
    return VisionRows(VisionProcessor.load(resolve_model_path(name), model.config), tokenizer)


def train(
    trainer: GRPOTrainer,
    batches: Iterable[list[ScoredGroup]],
    on_step: Callable[[dict[str, Any]], None],
    after_step: Callable[[GRPOTrainer], dict[str, Any] | None] | None = None,
    max_empty_draws: int | None = None,
) -> int:
    """Step on each batch until `config.steps` is reached or `batches` ends; returns the last step.

    `after_step` is the weight sync (sync.py): it runs after every optimizer step and before the next batch
    is pulled, so an in-process inference engine samples the next groups from the new weights. A checkpoint
    is written every `save_every` steps and at the end; the caller saves on Ctrl-C. A batch with nothing to
    train takes no step; after `max_empty_draws` such batches in a row (None: no bound) the run stops with a
    EmptyDrawsError saying what became of their groups (`draws.EmptyDraws`).
    """
    out = Path(trainer.config.out)
    if trainer.step_count >= trainer.config.steps:
        return trainer.step_count
    last = time.perf_counter()
    empty = EmptyDraws(max_empty_draws)
    for groups in batches:
        trainer.batches_seen += 1
        metrics = trainer.step(groups)
        metrics.update(draw_metrics(groups))
        empty.see(groups, metrics)
        if not metrics.get("skipped"):
            synced = after_step(trainer) if after_step else None
            metrics.update(synced or {})
            every = trainer.config.save_every
            if every and trainer.step_count % every == 0:
                metrics["checkpoint"] = str(trainer.save(out))
        now = time.perf_counter()
        # tokens/s of the whole loop (waiting for rollouts included), as opposed to train_tokens_per_s
        metrics["tokens_per_s"] = metrics.get("padded_tokens", 0) / max(now - last, 1e-9)
        metrics["loop_s"] = now - last  # the whole step: waiting for rollouts, training, sync, checkpoint
        last = now
        on_step({"step": trainer.step_count, **metrics})
        empty.check()
        if trainer.step_count >= trainer.config.steps:
            break
        if trainer.dist is not None and trainer.dist.stop_requested():  # Ctrl-C on any rank: all stop here
            raise KeyboardInterrupt
    return trainer.step_count
