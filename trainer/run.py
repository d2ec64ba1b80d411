"""One `atropos train` run, wired together: output dir, batch source, trainer, weight sync, metrics, Ctrl-C.

Where it sits: `cli/train.py` parses flags into `RunOptions` + `GRPOConfig` and calls `run_training`, which
picks the batch source (rollout files, a trajectory API, or env workers on an inference engine it owns),
runs `grpo.train` and always leaves a checkpoint behind: at the end, on an error, and on Ctrl-C (then the
summary says `interrupted` and the CLI exits 130). Child processes it started (vLLM) are stopped in every case.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from atropos_cli.config import config_diff
from atropos_cli.errors import ConfigError, OutputExistsError

from . import lora
from .checkpoint import latest_checkpoint, read_trainer_state
from .grpo import GRPOConfig, GRPOTrainer, train
from .metrics import MetricsSink

__all__ = ["RunOptions", "run_training", "RunSummary", "CONFIG_FILE"]

CONFIG_FILE = "train_config.json"
# Keys a resumed run may change without changing what is being trained.
_RESUMABLE = {
    "grpo.steps",
    "grpo.save_every",
    "grpo.keep_checkpoints",
    "grpo.device",
    "run.plot",
    "run.wandb_project",
    "run.tensorboard",
    "run.wait_timeout",
    "run.resume",
    "run.overwrite",
    "run.vllm_sync",
}


class RunOptions(BaseModel):
    """Where batches come from and how the run is wrapped (the GRPO knobs live in GRPOConfig)."""

    model_config = ConfigDict(extra="forbid")

    env: str | None = None
    dotted_args: list[str] = Field(default_factory=list)
    env_config_path: str | None = None
    data: list[str] = Field(default_factory=list)
    api_url: str | None = None
    inference: Literal["local", "vllm", "external"] = "local"
    sync_every: int = Field(1, ge=1)
    vllm_python: str | None = None
    vllm_port: int = 9001
    vllm_timeout: float = 300.0
    vllm_args: list[str] = Field(default_factory=list)
    vllm_sync: Literal["reload", "restart", "auto"] = "auto"  # auto: reload in place when vLLM allows it
    groups_per_step: int = Field(32, ge=1)  # 32 groups x 8: a steady gradient (measured on arithmetic)
    epochs: int = Field(1, ge=1)
    api_batch_size: int = Field(64, ge=1)
    wait_timeout: float = Field(600.0, gt=0)
    resume: bool = False
    overwrite: bool = False
    plot: bool = False
    wandb_project: str | None = None
    tensorboard: bool = False


class RunSummary(BaseModel):
    steps: int
    checkpoint: str | None
    interrupted: bool = False
    plot: str | None = None
    first_reward: float | None = None
    last_reward: float | None = None
    rollouts_failed: int = 0


def _prepare_out(out: Path, opts: RunOptions, config: GRPOConfig) -> None:
    saved = out / CONFIG_FILE
    current = {"grpo": config.model_dump(mode="json"), "run": opts.model_dump(mode="json")}
    if out.exists() and any(out.iterdir()):
        if opts.resume and saved.is_file():
            changed = [k for k in config_diff(json.loads(saved.read_text()), current) if k not in _RESUMABLE]
            if changed:
                raise ConfigError(
                    f"--resume with a different config: {', '.join(changed)} changed",
                    hint=f"use the flags of the original run (see {saved}) or a new --out",
                )
        elif opts.overwrite:
            shutil.rmtree(out)
        elif not opts.resume:
            raise OutputExistsError(
                f"output directory {str(out)!r} is not empty", hint="pass --resume to continue or --overwrite"
            )
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(current, indent=2))


def _source(
    opts: RunOptions,
    config: GRPOConfig,
    trainer: GRPOTrainer,
    stack: ExitStack,
    on_event: Callable[[str], None] = lambda _: None,
):
    """(batch iterator, after-step sync, rollouts or None) for the chosen mode."""
    from .sources import api_batches, file_batches
    from .sync import CheckpointSync, LocalSync

    sync: Callable[[Any], dict[str, Any]] | None
    out = Path(config.out)
    if opts.data:
        return file_batches(opts.data, opts.groups_per_step, opts.epochs, config.seed), None, None
    if opts.api_url:
        sync = CheckpointSync(out, opts.sync_every) if opts.inference == "external" else None
        batches = api_batches(
            opts.api_url, opts.api_batch_size, config.max_len, config.steps, out / "checkpoints", opts.wait_timeout,
            api_key=os.environ.get("ATROPOS_API_KEY") or None,  # the API's bearer token, as `serve` reads it
            on_wait=on_event,
        )  # fmt: skip
        return batches, sync, None
    from .rollouts import EnvRollouts

    server: dict[str, Any]
    if opts.inference == "local":
        server = {"server_type": "local", "model_name": config.model}
    elif opts.inference == "vllm":
        vllm = stack.enter_context(_vllm_server(opts, config, trainer, out))
        server = {
            "server_type": "vllm",
            "base_url": vllm.base_url,
            "model_name": vllm.served_name,
            "tokenizer_name": config.model,
        }
    else:
        server = {}
    rollouts = EnvRollouts(opts.env or "arithmetic", opts.dotted_args, opts.env_config_path, server)
    stack.callback(rollouts.close)
    if opts.inference == "local":
        sync = LocalSync(rollouts.backend)
        sync(trainer)  # a resumed trainer's weights go to the engine before the first rollout
    elif opts.inference == "vllm":
        from .vllm import VLLMSync

        sync = vllm_sync = VLLMSync(vllm, out, opts.sync_every, opts.vllm_sync)
        on_event(vllm_sync.describe())
    else:
        server_config = rollouts.run_config.openai[0]
        sync = CheckpointSync(out, opts.sync_every, server_config.base_url or None, server_config.api_key)
    return rollouts.batches(opts.groups_per_step), sync, rollouts


def _vllm_server(opts: RunOptions, config: GRPOConfig, trainer: GRPOTrainer, out: Path) -> Any:
    """The vLLM server to launch: on the resumed checkpoint if any; with LoRA, the base + the step's adapter."""
    from .vllm import VLLMServer

    model = str(latest_checkpoint(out)) if trainer.step_count and latest_checkpoint(out) else config.model
    adapter = None
    if getattr(trainer, "is_lora", False):  # the base stays config.model; the adapter carries the training
        model = config.model
        adapter = trainer.save_adapter(out / "adapters" / f"step-{trainer.step_count}")
    return VLLMServer(
        model,
        opts.vllm_python,
        opts.vllm_port,
        opts.vllm_timeout,
        out,
        opts.vllm_args,
        lora_adapter=adapter,
        lora_rank=getattr(config, "lora_r", 0) or 16,
    )


def run_training(
    opts: RunOptions,
    config: GRPOConfig,
    on_step: Callable[[dict[str, Any]], None],
    on_event: Callable[[str], None] = lambda _: None,
) -> RunSummary:
    out = Path(config.out)
    _prepare_out(out, opts, config)
    trainer = GRPOTrainer(config)
    if trainer.is_lora:
        on_event(lora.describe(trainer.model))
    if opts.resume and (checkpoint := trainer.resume(out)) is not None:
        on_event(f"resumed from {checkpoint} (step {trainer.step_count})")
    rewards: list[float] = []
    summary = RunSummary(steps=trainer.step_count, checkpoint=None)

    def record(metrics: dict[str, Any]) -> None:
        if "reward_mean" in metrics:
            rewards.append(metrics["reward_mean"])
        sink.write(metrics)
        on_step(metrics)

    with ExitStack() as stack:
        sink = MetricsSink(out, opts.wandb_project, opts.tensorboard, config.model_dump(mode="json"))
        stack.callback(sink.close)
        batches, sync, rollouts = _source(opts, config, trainer, stack, on_event)
        try:
            train(trainer, batches, record, sync)
        except KeyboardInterrupt:
            summary.interrupted = True
        finally:
            summary.steps = trainer.step_count
            latest = latest_checkpoint(out)
            if latest is not None and read_trainer_state(latest)["step"] == trainer.step_count:
                summary.checkpoint = str(latest)
            elif trainer.step_count > 0:
                summary.checkpoint = str(trainer.save(out))
            if rollouts is not None:
                summary.rollouts_failed = rollouts.counts.failed_rollouts + rollouts.counts.failed_groups
    if rewards:
        summary.first_reward, summary.last_reward = rewards[0], rewards[-1]
    if opts.plot and rewards:
        from .plot import plot_reward_curve

        summary.plot = str(plot_reward_curve(out))
    return summary
