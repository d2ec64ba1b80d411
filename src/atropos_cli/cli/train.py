"""`atropos train`: GRPO from an env (one command), from rollout files, or behind a trajectory API; and SFT.

Modes, by what is given: `--sft DATA` (supervised fine-tuning, trainer/sft.py), `--data PATH` (offline GRPO on
rollout files), `--api-url URL` (a trainer behind `atropos api` / Atropos' run-api), else ENV (default
arithmetic: env workers + inference engine + GRPO in one process). torch is imported only inside the command.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import cli_errors, console, err_console, fail

ENV_HELP = "Env for the one-command loop: a bundled name (see `atropos envs`), an entry point or a file.py."
LOSS_HELP = "Loss preset: grpo, dapo, dr_grpo, gspo, cispo (flags below override single knobs)."
# Learning rates: 1e-5 suits pretrained LLMs; the shipped ~1M-parameter model needs a much larger step to move
# within minutes on CPU (measured on arithmetic: 3e-4 raises reward steadily, 1e-3 collapses it).
DEFAULT_LR, TINY_MODEL_LR = 1e-5, 3e-4


def default_lr(model: str) -> float:
    from atropos_cli.resources import DEFAULT_MODEL

    return TINY_MODEL_LR if model == DEFAULT_MODEL else DEFAULT_LR


def _load_trainer() -> None:
    """The trainer needs torch; say how to get it instead of failing on the first import."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:  # torch missing: the local extra is not installed
        raise fail(f"the trainer needs torch ({exc})", hint='pip install "atropos[local]"', code=2) from None


def _fmt(metrics: dict[str, Any], total: int) -> str:
    if metrics.get("skipped"):
        return (
            f"step {metrics['step']:>4}/{total}  reward {metrics['reward_mean']:.3f}  "
            f"no group had signal: nothing to train on"
        )
    parts = [
        f"step {metrics['step']:>4}/{total}",
        f"reward {metrics['reward_mean']:.3f} ±{metrics['reward_std']:.2f}",
        f"signal {metrics['signal_fraction']:.0%}",
        f"loss {metrics['loss']:+.4f}",
        f"clip {metrics['clip_fraction']:.3f}",
    ]
    if "logprob_gap_abs" in metrics:
        parts.append(f"lp-gap {metrics['logprob_gap_abs']:.4f}")
    if "kl" in metrics:
        parts.append(f"kl {metrics['kl']:.4f}")
    parts.append(f"{metrics['tokens_per_s']:,.0f} tok/s")
    return "  ".join(parts)


def _run_sft(
    sft: list[Path], model: str, out: Path, overwrite: bool, lr: float | None, steps: int | None, seed: int
) -> None:
    _load_trainer()
    from atropos_cli.trainer.sft import SFTConfig, run_sft

    values: dict[str, Any] = {
        "data": [str(p) for p in sft],
        "model": model,
        "out": str(out),
        "overwrite": overwrite,
        "seed": seed,
    }
    if lr is not None:
        values["lr"] = lr
    if steps is not None:
        values["max_steps"] = steps
    saved = run_sft(
        SFTConfig(**values),
        on_log=lambda m: console.print(
            f"step {m['step']}  loss {m['loss']:.4f}  lr {m['lr']:.2e}  {m['tokens_per_s']:,.0f} tok/s"
        ),
    )
    console.print(f"saved the fine-tuned model to {saved}")


def train_command(
    ctx: typer.Context,
    env: Annotated[str | None, typer.Argument(help=ENV_HELP)] = None,
    model: Annotated[str, typer.Option(help="Policy: a shipped model name, a model directory or a hub id.")] = (
        "atropos-tiny-arith"
    ),
    out: Annotated[Path | None, typer.Option("--out", help="Run directory (default: runs/train-<env>).")] = None,
    data: Annotated[list[Path] | None, typer.Option(help="Train on rollout files (jsonl/parquet/run dirs).")] = None,
    api_url: Annotated[str | None, typer.Option(help="Register as the trainer of this trajectory API.")] = None,
    sft: Annotated[list[Path] | None, typer.Option(help="Supervised fine-tuning on sft-gen output instead.")] = None,
    inference: Annotated[str, typer.Option(help="Engine of the one-command loop: local, vllm, external.")] = "local",
    loss: Annotated[str, typer.Option(help=LOSS_HELP)] = "grpo",
    steps: Annotated[int | None, typer.Option(min=1, help="Optimizer steps (default 500; SFT: its own).")] = None,
    lr: Annotated[
        float | None, typer.Option(help="Learning rate (default 1e-5; 3e-4 for the shipped atropos-tiny-arith).")
    ] = None,
    warmup_steps: Annotated[int, typer.Option(min=0, help="Linear learning-rate warm-up steps.")] = 0,
    groups_per_step: Annotated[int, typer.Option(min=1, help="Groups per optimizer step (env/files).")] = 32,
    batch_size: Annotated[int, typer.Option(min=1, help="Sequences per step when behind an API.")] = 64,
    micro_batch_tokens: Annotated[int, typer.Option(min=16, help="Model tokens per micro-batch.")] = 8192,
    max_len: Annotated[int, typer.Option(min=2, help="Longer rollouts are truncated (and counted).")] = 2048,
    kl_beta: Annotated[float | None, typer.Option(help="KL-to-reference weight β (0 = no reference).")] = None,
    kl_estimator: Annotated[str | None, typer.Option(help="KL estimator: k1 or k3.")] = None,
    distill_beta: Annotated[
        float,
        typer.Option(
            min=0.0,
            help="On-policy distillation weight B: adds B x the reverse KL to the teacher on sampled tokens "
            "(groups with distill_token_ids/distill_logprobs, e.g. from a TeacherDistillationEnv).",
        ),
    ] = 0.0,
    is_correction: Annotated[
        str | None, typer.Option(help="Train/inference IS correction: none, truncate, mask.")
    ] = None,
    is_max: Annotated[float | None, typer.Option(help="Upper bound C of the IS weight.")] = None,
    clip_low: Annotated[float | None, typer.Option(help="ε_low of the ratio clip.")] = None,
    clip_high: Annotated[float | None, typer.Option(help="ε_high of the ratio clip (clip-higher).")] = None,
    dtype: Annotated[
        str,
        typer.Option(
            help="auto (bf16-pure on CUDA, fp32 on CPU), fp32, bf16 (autocast on fp32 weights) or bf16-pure "
            "(bf16 weights + fp32 master)."
        ),
    ] = "auto",
    device: Annotated[str, typer.Option(help="auto, cpu, cuda, cuda:1 ...")] = "auto",
    compile: Annotated[
        bool | None,
        typer.Option("--compile/--no-compile", help="torch.compile the model body. Default: on with CUDA, off on CPU."),
    ] = None,
    gradient_checkpointing: Annotated[bool, typer.Option(help="Recompute activations: less memory.")] = False,
    pack: Annotated[
        bool | None,
        typer.Option(
            "--pack/--no-pack",
            help="Pack samples end to end, no padding. Default: on with CUDA (rows of exactly "
            "--micro-batch-tokens, varlen flash attention: compiled once), off on CPU.",
        ),
    ] = None,
    activation_memory_budget: Annotated[
        float | None, typer.Option(help="With --compile: fraction of activations kept (0-1]; the rest recomputed.")
    ] = None,
    lora_r: Annotated[int, typer.Option(help="LoRA rank (peft): 0 trains every weight, >0 only adapters.")] = 0,
    lora_alpha: Annotated[
        int | None, typer.Option(help="LoRA alpha: the update is scaled by alpha/r (default 2r).")
    ] = None,
    lora_dropout: Annotated[float, typer.Option(help="Dropout on the LoRA branch's input.")] = 0.0,
    lora_target_modules: Annotated[
        str, typer.Option(help="Modules that get adapters: all-linear (all but the LM head) or 'q_proj,v_proj'.")
    ] = "all-linear",
    save_every: Annotated[int, typer.Option(min=0, help="Checkpoint every N steps (0: only at the end).")] = 50,
    sync_every: Annotated[int, typer.Option(min=1, help="vllm/external: sync every N steps.")] = 1,
    vllm_python: Annotated[str | None, typer.Option(help="Python of the venv that has vLLM.")] = None,
    vllm_timeout: Annotated[
        float, typer.Option(help="Seconds to wait for vLLM to start, and for each weight-sync call.")
    ] = 300.0,
    vllm_args: Annotated[str, typer.Option(help="Extra vLLM server flags, e.g. '--gpu-memory-utilization 0.5'.")] = "",
    vllm_sync: Annotated[
        str, typer.Option(help="vllm: reload (weights in place, no restart), restart, or auto (reload if possible).")
    ] = "auto",
    epochs: Annotated[int, typer.Option(min=1, help="Passes over --data.")] = 1,
    wait_timeout: Annotated[float, typer.Option(help="Seconds to wait for a batch from --api-url.")] = 600.0,
    seed: Annotated[int, typer.Option(help="Seed of the trainer (and of data order).")] = 0,
    config: Annotated[Path | None, typer.Option("--config", help="Env YAML config (Atropos layout).")] = None,
    plot: Annotated[bool, typer.Option(help="Write OUT/reward_curve.png at the end (needs matplotlib).")] = False,
    wandb_project: Annotated[str | None, typer.Option(help="Also log to W&B (needs wandb).")] = None,
    tensorboard: Annotated[bool, typer.Option(help="Also log to TensorBoard (needs tensorboard).")] = False,
    resume: Annotated[bool, typer.Option(help="Continue from the latest checkpoint in --out.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out.")] = False,
) -> None:
    """Train a policy with GRPO (or a variant) and save Hugging Face checkpoints under OUT/checkpoints/step-N.

    `atropos train` alone trains the shipped model on arithmetic, on CPU, in one process. Atropos-style dotted
    flags go to the env and its servers: --env.group_size 16, --openai.base_url URL (with --inference external).
    """
    with cli_errors():
        if sft and lora_r:
            raise fail(
                "--lora-r is for GRPO runs: --sft trains the full model", hint="drop --lora-r with --sft", code=2
            )
        if sft:
            _run_sft(sft, model, out or Path("runs/sft"), overwrite, lr, steps, seed)
            return
        if inference not in ("local", "vllm", "external"):
            raise typer.BadParameter(f"{inference!r}: choose local, vllm or external", param_hint="--inference")
        _load_trainer()
        from atropos_cli.trainer.run import run_training

        grpo = _grpo_config(
            model=model,
            out=str(out or Path(f"runs/train-{Path(env or 'arithmetic').stem}")),
            loss=loss,
            steps=steps or 500,
            lr=lr or default_lr(model),
            warmup_steps=warmup_steps,
            micro_batch_tokens=micro_batch_tokens,
            max_len=max_len,
            kl_beta=kl_beta,
            distill_beta=distill_beta,
            kl_estimator=kl_estimator,
            is_mode=is_correction,
            is_max=is_max,
            clip_low=clip_low,
            clip_high=clip_high,
            dtype=dtype,
            device=device,
            compile=compile,
            gradient_checkpointing=gradient_checkpointing,
            pack=pack,
            activation_memory_budget=activation_memory_budget,
            lora_r=lora_r,
            lora_alpha=lora_alpha,
            lora_dropout=lora_dropout,
            lora_target_modules=lora_target_modules,
            save_every=save_every,
            seed=seed,
        )
        opts = _run_options(
            env=env,
            dotted_args=list(ctx.args),
            env_config_path=str(config) if config else None,
            data=[str(p) for p in data or []],
            api_url=api_url,
            inference=inference,
            sync_every=sync_every,
            vllm_python=vllm_python,
            vllm_timeout=vllm_timeout,
            vllm_args=shlex.split(vllm_args),
            vllm_sync=vllm_sync,
            groups_per_step=groups_per_step,
            epochs=epochs,
            api_batch_size=batch_size,
            wait_timeout=wait_timeout,
            resume=resume,
            overwrite=overwrite,
            plot=plot,
            wandb_project=wandb_project,
            tensorboard=tensorboard,
        )
        show = lambda m: console.print(_fmt(m, grpo.steps), soft_wrap=True)  # noqa: E731
        _report(run_training(opts, grpo, show, err_console.print))


def _validated(model_cls: Any, values: dict[str, Any]) -> Any:
    from pydantic import ValidationError

    from atropos_cli.errors import ConfigError

    try:
        return model_cls(**values)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(map(str, err["loc"]))
        raise ConfigError(f"bad value for {where}: {err.get('input')!r} ({err['msg']})") from None


def _grpo_config(**values: Any) -> Any:
    from atropos_cli.trainer.grpo import GRPOConfig

    grpo = _validated(GRPOConfig, values)
    grpo.loss_config()  # an unknown --loss fails here, before any model loads
    grpo.check_lora()  # and so do bad --lora-* values
    return grpo


def _run_options(**values: Any) -> Any:
    from atropos_cli.trainer.run import RunOptions

    return _validated(RunOptions, values)


def _report(summary: Any) -> None:
    line = f"trained {summary.steps} steps; checkpoint {summary.checkpoint}"
    if summary.first_reward is not None:
        line += f"; reward {summary.first_reward:.3f} -> {summary.last_reward:.3f}"
    if summary.rollouts_failed:
        line += f" ({summary.rollouts_failed} rollouts failed)"
    console.print(line, soft_wrap=True)
    if summary.plot:
        console.print(f"wrote {summary.plot}", soft_wrap=True)
    if summary.interrupted:
        err_console.print(f"interrupted; the checkpoint {summary.checkpoint} holds the last step", style="yellow")
        sys.exit(130)


def register(app: typer.Typer) -> None:
    app.command(
        "train",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    )(train_command)
