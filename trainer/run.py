"""One `atropos train` run, wired together: output dir, batch source, trainer, weight sync, metrics, Ctrl-C.

Where it sits: `cli/train.py` parses flags into `RunOptions` + `GRPOConfig` and calls `run_training`, which
picks the batch source (rollout files, a trajectory API, or env workers on an inference engine it owns),
runs `grpo.train` and always leaves a checkpoint behind: at the end, on an error, and on Ctrl-C (then the
summary says `interrupted` and the CLI exits 130). Child processes it started (vLLM) are stopped in every case.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from atropos_cli.config import config_diff, read_saved
from atropos_cli.errors import ConfigError, EmptyDrawsError, OutputExistsError, PeerLost

from .checkpoint import latest_checkpoint, read_trainer_state
from .config import GRPOConfig, RunOptions
from .data.rollouts import EnvRollouts
from .data.sources import CheckedBatches, FileData, from_rank0, gathered
from .step.grpo import GRPOTrainer, train
from .step.metrics import MetricsSink
from .weights import lora

__all__ = ["RunOptions", "run_training", "RunSummary", "CONFIG_FILE"]

CONFIG_FILE = "train_config.json"
TRAINED_ROLLOUTS = "trained_rollouts.jsonl"  # --save-rollouts
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
    "run.nproc_per_node",  # a sharded checkpoint reshards onto another world size
    "grpo.grad_sync",
    "grpo.parallel",  # replicated checkpoints are one-process ones; a sharded one resumes sharded (_run)
    "run.dist_timeout",
    "run.save_rollouts",
    "run.max_staleness",
    "run.inference_gpus",
    "run.vllm_gpu_memory_utilization",
    "run.vllm_sleep_mode",
    "run.vllm_probe_tolerance",
    "run.max_empty_draws",
}


REWARD_WINDOW = 10  # the summary's reward A -> B compares the mean of the first and of the last this many steps


class RunSummary(BaseModel):
    steps: int
    checkpoint: str | None
    interrupted: bool = False
    plot: str | None = None
    first_reward: float | None = None  # mean over the first `reward_window` steps
    last_reward: float | None = None  # mean over the last `reward_window` steps
    reward_window: int = REWARD_WINDOW
    rollouts_failed: int = 0
    max_len: int = 0  # the max_len the run used (capped at the model's positions)
    truncated: int = 0  # rollouts cut to max_len
    data_exhausted: bool = False  # --data ran out before `steps`
    groups_available: int = 0  # --data: the groups read
    groups_per_step: int = 0
    epochs: int = 0
    groups_skipped: int = 0  # --api-url: groups the model cannot train (token ids, scores), skipped
    groups_filtered: int = 0  # env runs: groups the env dropped (identical scores, None, ...), counted per step
    env_exhausted: bool = False  # the env's items ran out and the run stopped there
    env_restartable: bool = True  # False: the env cannot start its items over (no restart_items)
    env_items: int | None = None  # the env's items in one pass, when a pass ended
    env_epochs: int = 1  # passes over the env's items (--on-exhausted cycle)


def _prepare_out(out: Path, opts: RunOptions, config: GRPOConfig) -> bool:
    """Check --out against --resume/--overwrite and save the run's config in it; True when it starts empty."""
    saved = out / CONFIG_FILE
    current = {"grpo": config.model_dump(mode="json"), "run": opts.model_dump(mode="json")}
    fresh = not out.exists() or all(_is_log(entry) for entry in out.iterdir())
    if not fresh:
        if opts.resume and saved.is_file():
            before = read_saved(saved, "restore it from the run, or train into a new --out")
            changed = [k for k in config_diff(before, current) if k not in _RESUMABLE]
            if changed:
                raise ConfigError(
                    f"--resume with a different config: {', '.join(changed)} changed",
                    hint=f"use the flags of the original run (see {saved}) or a new --out",
                )
        elif opts.overwrite:
            shutil.rmtree(out)
            fresh = True
        elif not opts.resume:
            raise OutputExistsError(
                f"output directory {str(out)!r} is not empty", hint="pass --resume to continue or --overwrite"
            )
    out.mkdir(parents=True, exist_ok=True)
    saved.write_text(json.dumps(current, indent=2))
    return fresh


def _is_log(entry: Path) -> bool:
    return entry.is_file() and entry.suffix == ".log"


def _clear_untrained(out: Path) -> None:
    """A run that trained nothing (its start failed, or it stopped before step 1) leaves --out as it found it,
    so the corrected retry is not refused: only its logs stay (vllm.log, which the error's hint names), and a
    directory of logs alone counts as empty."""
    if not out.is_dir() or latest_checkpoint(out) is not None:
        return
    for entry in out.iterdir():
        if entry.is_dir():
            shutil.rmtree(entry)
        elif not _is_log(entry):
            entry.unlink()


def _source(
    opts: RunOptions,
    config: GRPOConfig,
    trainer: GRPOTrainer,
    stack: ExitStack,
    on_event: Callable[[str], None] = lambda _: None,
    roles: Any = None,
):
    """(batch iterator, after-step sync, the env rollouts or the --data groups or None) for the chosen mode."""
    from .data.sources import api_batches, file_batches
    from .weights.sync import CheckpointSync, LocalSync

    sync: Callable[[Any], dict[str, Any]] | None
    out = Path(config.out)
    dist = trainer.dist
    if roles is not None:  # --inference-gpus: the engines are other ranks (async_loop.py)
        from .async_loop import trainer_source

        return trainer_source(opts, trainer, roles, stack, on_event)
    if opts.data:  # every rank reads the same files in the same order; the cursor skips what was trained
        data = _load_data(opts, trainer, on_event)
        batches = file_batches(data.groups, opts.groups_per_step, opts.epochs, config.seed)
        return itertools.islice(batches, trainer.batches_seen, None), None, data
    if opts.api_url:
        sync = CheckpointSync(out, opts.sync_every) if opts.inference == "external" else None
        if dist is not None and not dist.is_main:  # the API sees one trainer: rank 0 pulls, every rank trains
            return from_rank0(None, dist), sync, None
        vocab = vocab_size(trainer.model)
        batches = api_batches(
            opts.api_url, opts.api_batch_size, config.max_len, config.steps, out / "checkpoints", opts.wait_timeout,
            api_key=os.environ.get("ATROPOS_API_KEY") or None,  # the API's bearer token, as `serve` reads it
            on_wait=on_event, vocab_size=vocab,
        )  # fmt: skip
        checked = CheckedBatches(batches, vocab, on_event)
        return (iter(checked) if dist is None else from_rank0(checked, dist)), sync, checked
    if dist is not None and opts.inference != "local":  # one inference server (vLLM, external) for all ranks
        if opts.inference == "vllm" and trainer.is_lora:
            raise ConfigError(
                "--inference vllm with --lora-r swaps the adapter from one process: not with several",
                hint="train LoRA with --inference local, or full weights with --inference vllm",
            )
        if not dist.is_main:  # rank 0 runs the env workers and the server; the others save on the same steps
            return from_rank0(None, dist), CheckpointSync(out, opts.sync_every), None

    server: dict[str, Any]
    backend: Any = None
    colocated: Any = None
    if opts.inference == "local":
        server = {"server_type": "local", "model_name": config.model}
    elif opts.inference == "vllm-colocate":
        from .weights.vllm_colocate import start_colocated

        colocated = start_colocated(trainer, opts, on_event)
        stack.callback(colocated.close)
        server, backend = {"server_type": "local", "model_name": config.model}, colocated.backend
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
    # data-parallel rollouts (local engines): each rank collects its share of the one item stream
    rank, world = (dist.rank, dist.world) if dist is not None and opts.inference == "local" else (0, 1)
    rollouts = EnvRollouts(
        opts.env or "arithmetic", opts.dotted_args, opts.env_config_path, server, backend, rank=rank, world=world,
        on_exhausted=opts.on_exhausted, on_event=on_event, tokenizer=config.model,
    )  # fmt: skip
    stack.callback(rollouts.close)
    if colocated is not None:
        from .weights.sync import ColocateSync

        sync = ColocateSync(colocated, opts.sync_every, opts.vllm_probe_tolerance)
        return colocated.sleeping_between(rollouts.batches(opts.groups_per_step)), sync, rollouts
    if opts.inference == "local":
        sync = LocalSync(rollouts.backend)
        sync(trainer)  # a resumed trainer's weights go to the engine before the first rollout
        if dist is not None:  # data-parallel rollouts: each rank samples its share on its own engine
            return gathered(rollouts, opts.groups_per_step, dist, on_event), sync, rollouts
    elif opts.inference == "vllm":
        from .weights.vllm import VLLMSync

        sync = vllm_sync = VLLMSync(vllm, out, opts.sync_every, opts.vllm_sync)
        on_event(vllm_sync.describe())
    else:
        server_config = rollouts.run_config.openai[0]
        sync = CheckpointSync(out, opts.sync_every, server_config.base_url or None, server_config.api_key)
    batches = rollouts.batches(opts.groups_per_step)
    return (batches if dist is None else from_rank0(batches, dist)), sync, rollouts


def _vllm_server(opts: RunOptions, config: GRPOConfig, trainer: GRPOTrainer, out: Path) -> Any:
    """The vLLM server to launch: on the resumed checkpoint if any; with LoRA, the base + the step's adapter."""
    from .weights.vllm import VLLMServer

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


class _NoSink:
    """The metrics sink of a rank other than 0 (rank 0 writes metrics.jsonl for the run)."""

    def write(self, metrics: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


def vocab_size(model: Any) -> int:
    """Rows of the model's input embedding: a token id must be below this."""
    return int(model.get_input_embeddings().num_embeddings)


def max_positions(model: Any) -> int | None:
    """The model's max positions (None when its config does not say)."""
    return getattr(lora.unwrap(model).config, "max_position_embeddings", None)


def _load_data(opts: RunOptions, trainer: GRPOTrainer, on_event: Callable[[str], None]) -> Any:
    """--data's groups, checked against the model's vocabulary; what was skipped is reported, never dropped."""
    from .data.sources import MAX_WARNINGS, load_file_groups

    data = load_file_groups(opts.data, vocab_size(trainer.model))
    for bad in data.bad_records[:MAX_WARNINGS]:
        on_event(f"warning: skipped {bad.location}: {bad.reason}")
    skipped = []
    if data.bad_records:
        skipped.append(f"{len(data.bad_records)} corrupt records")
    if data.no_tokens:
        skipped.append(f"{data.no_tokens} groups without token ids")
    note = f" (skipped {' and '.join(skipped)})" if skipped else ""
    on_event(f"read {len(data.groups)} groups from --data{note}")
    return data


def _saving(batches: Any, path: Path, trainer: GRPOTrainer) -> Any:
    """`batches`, each appended to `path` (one group a line, `trained_step`: the step that trains it)."""
    for batch in batches:
        with path.open("a") as f:
            for group in batch:
                f.write(json.dumps({**group.to_record(), "trained_step": trainer.step_count + 1}) + "\n")
        yield batch


def _evaluating(sync: Any, rollouts: EnvRollouts, opts: RunOptions, trainer: GRPOTrainer) -> Any:
    """The after-step sync, then every --eval-every steps the env's eval split on the synced weights (its
    metrics join the step's). An env without eval items fails here, before the first step."""
    from atropos_cli.runs.evaluate import eval_items

    eval_items(rollouts.env, 1)

    def after_step(trained: GRPOTrainer) -> dict[str, Any]:
        metrics = dict(sync(trained) or {}) if sync is not None else {}
        if trained.step_count % opts.eval_every == 0:
            metrics |= rollouts.evaluate(opts.eval_items)
        return metrics

    return after_step


def _cap_max_len(trainer: GRPOTrainer, on_event: Callable[[str], None]) -> None:
    """Rollouts longer than the model's positions cannot train correctly: max_len never exceeds them."""
    limit = max_positions(trainer.model)
    if limit is not None and trainer.config.max_len > limit:
        on_event(f"max_len {trainer.config.max_len} is over the model's {limit} positions: using {limit}")
        trainer.config = trainer.config.model_copy(update={"max_len": limit})


def _finish(summary: RunSummary, rewards: list[float], opts: RunOptions, config: GRPOConfig, source: Any) -> None:
    if rewards:
        window = min(REWARD_WINDOW, len(rewards))
        summary.reward_window = window
        summary.first_reward = sum(rewards[:window]) / window
        summary.last_reward = sum(rewards[-window:]) / window
    if isinstance(source, FileData):
        summary.groups_available, summary.epochs = len(source.groups), opts.epochs
        summary.groups_per_step = opts.groups_per_step
        summary.data_exhausted = not summary.interrupted and summary.steps < config.steps


def _join_ranks(opts: RunOptions, config: GRPOConfig) -> Any:
    """The process group when this run is sharded: under torchrun, or resuming a sharded checkpoint alone."""
    from .scale.distributed import in_launcher, init_from_env
    from .scale.sharded_checkpoint import is_sharded

    out = Path(config.out)
    if in_launcher() or (opts.resume and is_sharded(latest_checkpoint(out))):
        return init_from_env(config.device, opts.dist_timeout)
    return None


def run_training(
    opts: RunOptions,
    config: GRPOConfig,
    on_step: Callable[[dict[str, Any]], None],
    on_event: Callable[[str], None] = lambda _: None,
) -> RunSummary:
    out = Path(config.out)
    opts.check_async()
    if opts.inference == "vllm-colocate" and not opts.data and not opts.api_url:
        from .weights.vllm_colocate import check_can_colocate

        check_can_colocate(opts.nproc_per_node)  # before anything is written or loaded
    dist = _join_ranks(opts, config)
    finished = fresh = False
    try:
        if dist is None or dist.is_main:
            fresh = _prepare_out(out, opts, config)
        else:  # one rank speaks: the others train silently and write nothing but their checkpoint shards
            on_step, on_event = (lambda _: None), (lambda _: None)
            opts = opts.model_copy(update={"plot": False, "wandb_project": None, "tensorboard": False})
        if dist is not None:
            dist.catch_stop_signals()
            dist.barrier()
        if dist is not None and opts.inference_gpus:  # the disaggregated loop: this rank trains or samples
            from .async_loop import engine_loop, split_roles

            roles = split_roles(dist, int(opts.inference_gpus), opts.dist_timeout)  # "auto": resolved (check_async)
            if roles.is_engine:
                summary = RunSummary(steps=0, checkpoint=None, interrupted=engine_loop(opts, config, roles))
            else:
                summary = _run(opts, config, on_step, on_event, roles.trainer_dist, roles)
        else:
            summary = _run(opts, config, on_step, on_event, dist)
        finished = True
        return summary
    except EmptyDrawsError as exc:  # every rank stopped at the same draw: they meet at the teardown, one speaks
        finished = True
        if dist is not None and not dist.is_main:
            exc.quiet = True  # type: ignore[attr-defined]
        raise
    except RuntimeError as exc:  # a collective failed (gloo/NCCL): a peer rank died, or this rank's own error
        if dist is None or not dist.stopped_by_launcher():
            raise
        raise PeerLost(f"rank {dist.rank} lost a peer ({type(exc).__name__})",
                       hint="the launcher's line names the rank that failed") from None  # fmt: skip
    finally:
        if dist is not None:
            if finished:  # every rank reaches the teardown before any leaves: a gloo rank whose peer has already
                dist.barrier()  # torn its group down can abort ("terminate called without an active exception")
            dist.close()
        if fresh:
            _clear_untrained(out)


def _run(
    opts: RunOptions,
    config: GRPOConfig,
    on_step: Callable[[dict[str, Any]], None],
    on_event: Callable[[str], None],
    dist: Any,
    roles: Any = None,
) -> RunSummary:
    out = Path(config.out)
    if dist is not None and opts.resume and config.parallel == "auto":
        from .scale.sharded_checkpoint import is_sharded

        if is_sharded(latest_checkpoint(out)):  # an FSDP run wrote it: it resumes sharded, on any world size
            config.parallel = "fsdp"
    trainer = GRPOTrainer(config, dist=dist)
    _cap_max_len(trainer, on_event)
    for line in trainer.paths():
        on_event(line)
    if opts.inference == "local" and not opts.data and not opts.api_url:
        from atropos_cli.paths import rollout_path

        on_event("rollouts: " + rollout_path(lora.unwrap(trainer.model), trainer.device.startswith("cuda")))
    if trainer.is_lora:
        on_event(lora.describe(trainer.model))
    if opts.resume and (checkpoint := trainer.resume(out)) is not None:
        on_event(f"resumed from {checkpoint} (step {trainer.step_count})")
    rewards: list[float] = []
    summary = RunSummary(steps=trainer.step_count, checkpoint=None, max_len=trainer.config.max_len)

    probe: Any = None  # --api-url: the staleness of batches whose producers posted policy versions

    def record(metrics: dict[str, Any]) -> None:
        if probe is not None:
            metrics.update(probe.last)
        if "reward_mean" in metrics and not metrics.get("skipped"):  # the summary's rewards are the trained steps'
            rewards.append(metrics["reward_mean"])
        summary.truncated += metrics.get("truncated", 0)
        summary.groups_filtered += metrics.get("groups_filtered", 0)
        sink.write(metrics)
        on_step(metrics)

    with ExitStack() as stack:
        sink: Any = _NoSink()
        if dist is None or dist.is_main:  # (the disaggregated loop's one trainer rank: dist None, rank 0)
            sink = MetricsSink(out, opts.wandb_project, opts.tensorboard, config.model_dump(mode="json"))
        stack.callback(sink.close)
        batches, sync, source = _source(opts, config, trainer, stack, on_event, roles)
        if opts.api_url:
            from .async_loop import StalenessProbe

            probe = StalenessProbe()
            batches = probe.watch(batches, trainer)
        if opts.save_rollouts and (dist is None or dist.is_main):
            batches = _saving(batches, out / TRAINED_ROLLOUTS, trainer)
        if opts.eval_every and isinstance(source, EnvRollouts):
            sync = _evaluating(sync, source, opts, trainer)
        try:
            from_env = not opts.data and not opts.api_url  # files and the API end; an env's items cycle
            train(trainer, batches, record, sync, opts.max_empty_draws if from_env else None)
        except KeyboardInterrupt:
            summary.interrupted = True
        finally:
            summary.steps = trainer.step_count
            latest = latest_checkpoint(out)
            if latest is not None and read_trainer_state(latest)["step"] == trainer.step_count:
                summary.checkpoint = str(latest)
            elif trainer.step_count > 0:
                summary.checkpoint = str(trainer.save(out))
            if isinstance(source, CheckedBatches):  # the trajectory API's
                summary.groups_skipped = source.skipped
            elif source is not None and not isinstance(source, FileData):  # the env rollouts
                summary.rollouts_failed = source.counts.failed_rollouts + source.counts.failed_groups
                if isinstance(source, EnvRollouts):
                    summary.env_exhausted, summary.env_restartable = source.exhausted, source.restartable
                    summary.env_items, summary.env_epochs = source.epoch_size, source.epoch
    _finish(summary, rewards, opts, config, source)
    if opts.plot and rewards:
        from .plot import plot_reward_curve

        summary.plot = str(plot_reward_curve(out))
    return summary
