"""The settings of an `atropos train` run, declared once: `GRPOConfig` (what is trained and how) and `RunOptions`
(where batches come from and how the run is wrapped).

Pure pydantic, no torch: `atropos train --help` generates its options from these fields (cli/options.py), so each
field's docstring is its `--help` text and its default the flag's default. Saved as OUT/train_config.json and
compared on --resume. Layers: field defaults < the `train:` section of `--config FILE.yaml` < CLI flags.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from atropos_cli.resources import DEFAULT_MODEL

from .step.precision import Dtype

if TYPE_CHECKING:
    from .step.losses import LossConfig

__all__ = ["GRPOConfig", "RunOptions", "DEFAULT_CHUNK", "default_lr"]

DEFAULT_CHUNK = 1024  # tokens per log-prob chunk: 1024 x 152k vocab x 4 bytes = 0.6 GB of fp32 logits
# Learning rates: 1e-5 suits pretrained LLMs; the shipped ~1M-parameter model needs a much larger step to move
# within minutes on CPU (measured on arithmetic: 3e-4 raises reward steadily, 1e-3 collapses it).
DEFAULT_LR, TINY_MODEL_LR = 1e-5, 3e-4


def default_lr(model: str) -> float:
    """The learning rate a run gets when none is given: the one rule, for the CLI and for library callers."""
    return TINY_MODEL_LR if model == DEFAULT_MODEL else DEFAULT_LR


class GRPOConfig(BaseModel):
    """Everything a run needs; saved as OUT/train_config.json and compared on --resume."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    model: str = DEFAULT_MODEL
    """Policy: a shipped model name, a model directory or a hub id."""
    out: str = "runs/train"
    """Run directory (the CLI's default: runs/train-<env>)."""
    loss: str = "grpo"
    """Loss preset: grpo, dapo, dr_grpo, gspo, cispo (the flags below override single knobs)."""
    clip_low: float | None = None
    """ε_low of the ratio clip (default: the preset's)."""
    clip_high: float | None = None
    """ε_high of the ratio clip, clip-higher (default: the preset's)."""
    kl_beta: float | None = None
    """KL-to-reference weight β; 0 = no reference model (default: the preset's, 0)."""
    distill_beta: float = Field(0.0, ge=0)
    """On-policy distillation weight B: adds B x the reverse KL to the teacher on sampled tokens (groups with
    distill_token_ids/distill_logprobs, e.g. from a TeacherDistillationEnv)."""
    kl_estimator: Literal["k1", "k3"] | None = None
    """KL estimator (default: the preset's, k3)."""
    is_mode: Literal["none", "truncate", "mask", "decoupled", "stable"] | None = None
    """Off-policy correction by ρ = π_old/μ per token: truncate (TIS, min(ρ, C)), mask (IcePop, tokens with ρ
    outside [C_min, C]), decoupled (decoupled PPO, ρ untruncated), stable (min(ρ, C), sequences too far from
    the sampler dropped, a KL pull toward it); docs/training-async.md (default: the preset's, none)."""
    is_max: float | None = None
    """Upper bound C of the IS weight (default: the preset's, 2.0)."""
    is_min: float | None = None
    """Lower bound of the IS weight, mask mode only (default: the preset's, 0)."""
    scale_rewards: bool | None = None
    """Divide advantages by the group's std (GRPO) or not (Dr. GRPO) (default: the preset's)."""
    dynamic_sampling: bool | None = None
    """Drop groups whose rewards are all equal, as DAPO does (default: the preset's)."""
    max_completion_len: int = Field(1024, ge=1)
    """L_max of Dr. GRPO's constant loss normaliser."""
    lr: float = Field(
        DEFAULT_LR,
        gt=0,
        json_schema_extra={"cli_default": f"{TINY_MODEL_LR:g} for the shipped {DEFAULT_MODEL}, else {DEFAULT_LR:g}"},
    )
    """Learning rate."""
    weight_decay: float = Field(0.0, ge=0)
    """AdamW weight decay."""
    betas: tuple[float, float] = (0.9, 0.99)
    """AdamW betas (two numbers)."""
    grad_clip: float = Field(1.0, gt=0)
    """Clip the gradient norm to this."""
    warmup_steps: int = Field(0, ge=0)
    """Linear learning-rate warm-up steps."""
    steps: int = Field(500, ge=1)
    """Optimizer steps (with --sft, SFT's own default applies)."""
    micro_batch_tokens: int | None = Field(None, ge=16)
    """Model tokens per micro-batch. Default (`default_micro_batch_tokens`): 8192 on CPU; on CUDA the largest of
    16384 (32768 under FSDP), 8192, 4096 whose activations fit beside the model's training state."""
    max_len: int = Field(2048, ge=2)
    """Longer rollouts are truncated (and counted); capped at the model's max positions."""
    save_every: int = Field(50, ge=0)
    """Checkpoint every N steps (0: only at the end)."""
    keep_checkpoints: int = Field(2, ge=0)
    """Checkpoints kept in OUT/checkpoints (0: all)."""
    seed: int = 0
    """Seed of the trainer (and of the data order)."""
    device: str = "auto"
    """auto, cpu, cuda, cuda:1 ..."""
    dtype: Dtype | Literal["auto"] = "auto"
    """auto (bf16-pure on CUDA, fp32 on CPU), fp32, bf16 (autocast on fp32 weights) or bf16-pure (bf16 weights
    + fp32 master)."""
    gradient_checkpointing: bool = False
    """Recompute activations in the backward pass: less memory."""
    compile: bool | None = None
    """torch.compile the transformer body (attention.compile_body). Default: on with CUDA, off on CPU."""
    chunk_size: int = Field(DEFAULT_CHUNK, ge=1)
    """Tokens per chunk of the fp32 log-prob computation (bounds the logits' memory)."""
    pack: bool | None = None
    """Pack samples end to end, no padding (packing_mode). Default: on with CUDA, as rows of exactly
    --micro-batch-tokens tokens with varlen flash attention (one shape: compiled once); off on CPU."""
    cuda_graphs: bool | None = None
    """Replay each micro-batch's forward and backward as a CUDA graph, one recording per bucketed row width: no
    host work per layer (trainer/step/graphs.py). Default: on for one-process and replicated CUDA training with
    --pack and bf16-pure weights (the CUDA defaults) when a micro-batch's activations fit twice; off elsewhere."""
    activation_memory_budget: float | None = Field(None, gt=0, le=1)
    """With --compile: the fraction (0-1] of activations the backward keeps; the cheapest rest is recomputed."""
    parallel: Literal["auto", "fsdp", "replicate"] = "auto"
    """Many-GPU runs: shard the model over the ranks (FSDP2) or give every rank the whole model and sum the
    gradients once a step (replicate: no per-layer host work, 18 bytes a parameter on each GPU). Default: replicate
    on CUDA for a model under 1B parameters on 2-4 ranks (measured on H100: 94.9% weak scaling at 2 ranks and
    102% at 4, FSDP 75% at 4), else FSDP."""
    grad_sync: Literal["auto", "step", "micro-batch"] = "auto"
    """Many-GPU runs: reduce-scatter gradients once per step (less communication; each rank holds one unsharded
    fp32 gradient, 4 bytes x parameters) or after every micro-batch (sharded gradients: what a 7B model needs).
    auto: once per step where the training state leaves room for a 4k-token micro-batch in 80% of the GPU, else
    after every micro-batch (an 8B model on 4 x 80 GB)."""
    lora_r: int = 0
    """LoRA rank (peft): 0 trains every weight, >0 only adapters."""
    lora_alpha: int | None = None
    """LoRA alpha: the update is scaled by alpha/r (default 2r)."""
    lora_dropout: float = 0.0
    """Dropout on the LoRA branch's input."""
    lora_target_modules: str = "all-linear"
    """Modules that get adapters: all-linear (all but the LM head) or 'q_proj,v_proj'."""

    @model_validator(mode="before")
    @classmethod
    def _default_lr(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("lr") is None:
            return {**data, "lr": default_lr(data.get("model") or DEFAULT_MODEL)}
        return data

    def check_lora(self) -> None:
        from .weights import lora

        lora.check_lora(self.lora_r, self.lora_alpha, self.lora_dropout, self.lora_target_modules)

    def loss_config(self) -> LossConfig:
        """The preset named by `loss` with this config's overrides (a `losses.LossConfig`; imports torch)."""
        from atropos_cli.errors import ConfigError

        from .step.losses import LOSS_NAMES, loss_config

        if self.loss not in LOSS_NAMES:
            raise ConfigError(f"unknown loss {self.loss!r}", hint="choose one of: " + ", ".join(LOSS_NAMES))
        keys = ("clip_low", "clip_high", "kl_beta", "kl_estimator", "is_mode", "is_max", "is_min")
        extra = {k: getattr(self, k) for k in (*keys, "scale_rewards", "dynamic_sampling")}
        return loss_config(self.loss, max_completion_len=self.max_completion_len, **extra)


class RunOptions(BaseModel):
    """Where batches come from and how the run is wrapped (the GRPO knobs live in GRPOConfig)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    env: str | None = None
    """Env of the one-command loop: a bundled name (see `atropos envs`), an entry point or a file.py."""
    dotted_args: list[str] = Field(default_factory=list)
    """Atropos-style dotted flags for the env and its servers (--env.group_size 16, --openai.base_url URL)."""
    env_config_path: str | None = None
    """YAML config (Atropos layout: env:, openai:, and train: for these settings)."""
    data: list[str] = Field(default_factory=list)
    """Train on rollout files (jsonl/parquet/run dirs)."""
    api_url: str | None = None
    """Register as the trainer of this trajectory API."""
    inference: Literal["local", "vllm", "vllm-colocate", "external"] = "local"
    """Engine of the one-command loop: local, vllm (a vLLM server we launch), vllm-colocate (vLLM in this process,
    on the trainer's device) or external."""
    sync_every: int = Field(1, ge=1)
    """vllm/vllm-colocate/external: sync weights every N steps."""
    vllm_python: str | None = None
    """Python of the venv that has vLLM."""
    vllm_port: int = 9001
    """Port of the vLLM server the run starts."""
    vllm_timeout: float = 300.0
    """Seconds to wait for vLLM to start, and for each weight-sync call."""
    vllm_args: list[str] = Field(default_factory=list)
    """Extra vLLM server flags, e.g. '--gpu-memory-utilization 0.5' (split like a shell line)."""
    vllm_sync: Literal["reload", "restart", "auto"] = "auto"
    """vllm: reload (weights in place, no restart), restart, or auto (reload if possible)."""
    vllm_gpu_memory_utilization: float = Field(0.3, gt=0, lt=1)
    """vllm-colocate: fraction of the device's memory vLLM takes (its weights + KV cache); the trainer keeps the
    rest."""
    vllm_sleep_mode: bool = False
    """vllm-colocate: free vLLM's GPU memory while the optimizer steps (llm.sleep(level=1): weights to host
    memory, KV cache dropped; woken before the next sampling). CUDA builds of vLLM only."""
    vllm_probe_tolerance: float | None = Field(None, gt=0)
    """vllm-colocate: mean |logprob difference| per token allowed between vLLM and the trainer on a fixed probe
    prompt after each weight load, else the run stops (default: 1e-3 when vLLM computes in fp32, 0.2 in bf16)."""
    groups_per_step: int = Field(32, ge=1)  # 32 groups x 8: a steady gradient (measured on arithmetic)
    """Groups per optimizer step (env/files)."""
    epochs: int = Field(1, ge=1)
    """Passes over --data."""
    eval_every: int = Field(0, ge=0)
    """Every N steps, sample the env's eval split (its first --eval-items items, group-size samples each) from
    the new weights: mean score and pass@1 on a line of their own and in metrics.jsonl (0: never). Env runs."""
    eval_items: int = Field(32, ge=1)
    """Eval items per --eval-every evaluation."""
    on_exhausted: Literal["cycle", "stop"] = "cycle"
    """When the env's items run out before --steps: cycle (start them over: one more epoch, said on stderr) or
    stop (end the run there, with a warning)."""
    max_empty_draws: int = Field(20, ge=1)
    """Env runs: stop with an error after this many draws in a row (each a step's --groups-per-step items) gave
    nothing to train on (every group filtered by the env, failed, or with all rewards equal): such draws take no
    step, so the run would otherwise never reach --steps."""
    api_batch_size: int = Field(64, ge=1)
    """Sequences per step when behind an API."""
    wait_timeout: float = Field(600.0, gt=0)
    """Seconds to wait for a batch from --api-url."""
    nproc_per_node: int = Field(1, ge=1)
    """Processes (one per GPU) on this node: >1 launches the run through torchrun and shards the model with
    FSDP2. For several nodes use torchrun itself: torchrun --nnodes M --nproc-per-node N -m atropos_cli train."""
    inference_gpus: Annotated[int, Field(ge=0)] | Literal["auto"] = 0
    """Many-GPU runs: ranks (the last K of --nproc-per-node) that only generate rollouts with the local engine
    while the others train; weights go to them over NCCL after every step (0: every rank samples, then trains).
    auto: the K that balances the generation and training times measured in OUT/metrics.jsonl (with --resume
    after a few steps), printed."""
    max_staleness: int = Field(0, ge=0)
    """With --inference-gpus: steps a rollout's policy may lag the policy it trains (0: on-policy, the
    synchronous schedule; >0: generation overlaps training, with the IS correction on unless --is-mode says)."""
    dist_timeout: float = Field(1800.0, gt=0)
    """Many-GPU runs: seconds a rank waits in any collective (a batch from rank 0 included) before the run stops
    with an error."""
    save_rollouts: bool = False
    """Append the groups each step trains on to OUT/trained_rollouts.jsonl (key `trained_step`; with
    --inference-gpus their meta holds the policy version of every token)."""
    resume: bool = False
    """Continue from the latest checkpoint in --out."""
    overwrite: bool = False
    """Replace an existing --out."""
    plot: bool = False
    """Write OUT/reward_curve.png at the end (needs matplotlib)."""
    wandb_project: str | None = None
    """Also log to W&B (needs wandb)."""
    tensorboard: bool = False
    """Also log to TensorBoard (needs tensorboard)."""

    @field_validator("inference_gpus", mode="before")
    @classmethod
    def _number_or_auto(cls, value: Any) -> Any:
        if isinstance(value, str) and value != "auto" and not value.strip().isdigit():
            raise ValueError("a number of GPUs or auto")
        return value

    def check_async(self) -> None:
        """The disaggregated loop's flags fit together, and --eval-every has an env to evaluate (a ConfigError
        with a hint otherwise)."""
        from atropos_cli.errors import ConfigError

        if self.eval_every and (self.data or self.api_url or self.nproc_per_node > 1):
            raise ConfigError(
                "--eval-every evaluates the env of a one-process run: not with --data, --api-url or --nproc-per-node",
                hint="drop --eval-every, or run `atropos evaluate ENV --model OUT/checkpoints/step-N` on a checkpoint",
            )

        k = self.inference_gpus
        if k == "auto":  # resolved to a number from measured times first (scale/split.py: auto_split)
            raise ConfigError("--inference-gpus auto was not resolved", hint="resolve it with auto_split first")
        if self.max_staleness and not k:
            raise ConfigError("--max-staleness needs --inference-gpus", hint="add --inference-gpus 1 (or more)")
        if not k:
            return
        if self.nproc_per_node <= k:
            raise ConfigError(
                f"--inference-gpus {k} needs --nproc-per-node above {k}: at least one rank must train",
                hint=f"e.g. --nproc-per-node {k + 1} --inference-gpus {k}",
            )
        if self.data or self.api_url:
            raise ConfigError(
                "--inference-gpus is for the one-command loop (an env), not --data or --api-url",
                hint="drop --inference-gpus, or train on an env: atropos train ENV --inference-gpus 1",
            )
        if self.inference != "local":
            raise ConfigError(
                f"--inference-gpus runs the local engine on its ranks; --inference {self.inference} with it is not "
                "supported",
                hint="use --inference local with --inference-gpus, or drop --inference-gpus",
            )
        if self.groups_per_step < k:
            raise ConfigError(
                f"--groups-per-step {self.groups_per_step} is below --inference-gpus {k}: an engine would idle",
                hint=f"pass --groups-per-step {k} or more",
            )


def activation_bytes_per_token(model_config: Any, checkpointing: bool, eager_len: int = 0) -> int:
    """GPU bytes a trained token's activations take, measured on H100/H200 with the compiled bf16 body (no
    checkpointing): ~48 bytes per layer x hidden unit (0.5B: 1.0 MB, 1.5B: 2.1 MB, 3B: 3.5 MB a token;
    benchmarks/results/fsdp_gpu.md). A mixture of experts keeps more (each token's copies for its top-k experts):
    ~80, from the one MoE row measured (OLMoE-1B-7B on 4 x H100 under FSDP, 4k micro-batches: 57.4 GiB at its
    peak less its training state; benchmarks/results/trainer_families_gpu.md). Attention computed eagerly on
    padded rows of up to `eager_len` tokens (gpt-oss: sinks, which the flash kernels lack) adds its bf16
    probabilities: a row of `eager_len` per head and layer for each token. With gradient checkpointing each layer
    keeps only its bf16 input."""
    layers = int(getattr(model_config, "num_hidden_layers", 24))
    hidden = int(getattr(model_config, "hidden_size", 896))
    experts = getattr(model_config, "num_experts", None) or getattr(model_config, "num_local_experts", None)
    per_unit = MOE_BYTES_PER_UNIT if experts else DENSE_BYTES_PER_UNIT
    scores = 2 * int(getattr(model_config, "num_attention_heads", 0) or 0) * eager_len  # a layer's, per token
    if checkpointing:
        return 2 * layers * hidden + per_unit * hidden + scores
    return (per_unit * hidden + scores) * layers


DENSE_BYTES_PER_UNIT = 48  # activation bytes a token keeps per layer x hidden unit (activation_bytes_per_token)
MOE_BYTES_PER_UNIT = 80


def gpu_budget_bytes(device: str) -> int:
    """The GPU memory this process may use: the card's, or the share `torch.cuda.set_per_process_memory_fraction`
    gave it (a run sized for an 80 GB card on a larger one: the defaults follow the cap)."""
    import torch

    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", None)
    return int(total * fraction(index)) if fraction is not None else total


def default_micro_batch_tokens(
    device: str, sharded: bool, gpu_bytes: int | None, held_bytes: int, bytes_per_token: int
) -> int:
    """--micro-batch-tokens when not given: the largest of 32k (FSDP only), 16k, 8k, 4k tokens whose activations
    fit beside the training state in 80% of the GPU. Measured (benchmarks/results/trainer_gpu.md, fsdp_gpu.md):
    a 0.5B step is host-bound per micro-batch, so larger micro-batches win: 8k -> 16k gave +10-22% tokens/s on
    one H100/H200; 16k -> 32k +10% per GPU under FSDP (whose hooks cost per micro-batch), nothing in one process.
    Larger models get smaller micro-batches instead of running out of memory (3B on 2 x 80 GB: 8k). CPU: 8k."""
    if not device.startswith("cuda"):
        return 8192
    for tokens in (32768, 16384, 8192) if sharded else (16384, 8192):
        if _activations_fit(tokens, gpu_bytes, held_bytes, bytes_per_token):
            return tokens
    return MIN_MICRO_BATCH


MIN_MICRO_BATCH = 4096  # the smallest default micro-batch


def _activations_fit(tokens: int, gpu_bytes: int | None, held_bytes: int, bytes_per_token: int) -> bool:
    """A micro-batch of `tokens` fits beside `held_bytes` of training state in 80% of the GPU (no GPU: yes)."""
    return gpu_bytes is None or held_bytes + tokens * bytes_per_token <= 0.8 * gpu_bytes


def auto_grad_sync(
    gpu_bytes: int | None, sharded: bool, step_state_bytes: int, bytes_per_token: int
) -> Literal["step", "micro-batch"]:
    """--grad-sync auto: "step" (one reduce-scatter a step: the faster) unless the unsharded gradient it keeps
    leaves no room for a 4k-token micro-batch in 80% of the GPU; then "micro-batch" (sharded gradients)."""
    roomy = _activations_fit(MIN_MICRO_BATCH, gpu_bytes, step_state_bytes, bytes_per_token)
    return "step" if roomy or not sharded else "micro-batch"


def check_fits(gpu_bytes: int | None, held_bytes: int, bytes_per_token: int, micro_batch_tokens: int) -> None:
    """Fail before the first step when the training state and one micro-batch's activations cannot fit this GPU
    (a CUDA out-of-memory after minutes of compiling otherwise). `gpu_bytes` None (CPU): nothing to check."""
    if gpu_bytes is None:
        return
    need = held_bytes + micro_batch_tokens * bytes_per_token
    if need <= 0.95 * gpu_bytes:
        return
    from atropos_cli.errors import ConfigError

    gib = 2**30
    raise ConfigError(
        f"this run needs about {need / gib:.0f} GiB a GPU ({held_bytes / gib:.0f} GiB of weights, gradients and AdamW "
        f"state, {micro_batch_tokens * bytes_per_token / gib:.0f} GiB of activations for {micro_batch_tokens} tokens) "
        f"and the GPU gives this process {gpu_bytes / gib:.0f} GiB",
        hint="shard it over several GPUs (--nproc-per-node N: FSDP), train LoRA adapters (--lora-r 16), or lower "
        "--micro-batch-tokens / add --gradient-checkpointing when the activations are the excess",
    )


HOST_THREADS = 4  # torch's intra-op threads in a CUDA training process (its host only collates small tensors)
AUTO_THREADS = "ATROPOS_AUTO_THREADS"  # set by `launch` beside the OMP_NUM_THREADS it chose: not the user's


def host_threads(device: str, current: int, env: Mapping[str, str]) -> int | None:
    """The intra-op thread count a training process should switch to, or None to keep `current`.

    On CUDA, HOST_THREADS: the host collates micro-batches and queues the GPU's work, small tensors that many
    OpenMP threads only slow down. Measured on an H100 of a 64-core host (torch's default: 64 threads), the same
    mixed-length benchmark gave 90.8-101.0k tokens/s against 106.1-106.3k with 4 (equal lengths 109.4k against
    114.0k; benchmarks/results/trainer_gpu.md, 2026-11-27, d4e80d1). OMP_NUM_THREADS set by the user wins; on a CPU the
    threads do the training, so torch's default stays."""
    user_set = "OMP_NUM_THREADS" in env and env.get(AUTO_THREADS) != "1"
    if not device.startswith("cuda") or user_set or current <= HOST_THREADS:
        return None
    return HOST_THREADS
