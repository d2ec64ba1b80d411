"""`atropos train`: GRPO from an env (one command), from rollout files, or behind a trajectory API; and SFT.

Modes, by what is given: `--sft DATA` (supervised fine-tuning, trainer/sft.py), `--data PATH` (offline GRPO on
rollout files), `--api-url URL` (a trainer behind `atropos api` / Atropos' run-api), else ENV (default
arithmetic: env workers + inference engine + GRPO in one process). torch is imported only inside the command.

The options are generated from `GRPOConfig` and `RunOptions` (trainer/config.py): their fields' docstrings are
the help, their defaults the defaults. Layers: field defaults < `train:` in `--config FILE.yaml` < flags.
"""

from __future__ import annotations

import shlex
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer

from atropos_cli.cli.common import DottedCommand, cli_errors, console, err_console, fail, warn
from atropos_cli.cli.options import ModelOptions, with_options
from atropos_cli.errors import EXIT_INTERRUPTED, EXIT_USAGE

ENV_HELP = "Env for the one-command loop: a bundled name (see `atropos envs`), an entry point or a file.py."


def _specs() -> tuple[ModelOptions, ModelOptions]:
    from atropos_cli.trainer.config import GRPOConfig, RunOptions

    grpo = ModelOptions(GRPOConfig, exclude=("out",), flags={"is_mode": "--is-correction"}, panel="GRPO")
    run = ModelOptions(
        RunOptions,
        exclude=("env", "dotted_args", "env_config_path"),
        flags={"api_batch_size": "--batch-size"},
        panel="Run",
    )
    return grpo, run


GRPO_OPTIONS, RUN_OPTIONS = _specs()


def _load_trainer() -> None:
    """The trainer needs torch; say how to get it instead of failing on the first import."""
    try:
        import torch  # noqa: F401
    except ImportError as exc:  # torch missing: the local extra is not installed
        raise fail(f"the trainer needs torch ({exc})", hint='pip install "atropos[local]"', code=EXIT_USAGE) from None


def _num(value: float) -> str:
    """A loss-sized number readable at any scale: 3 significant digits, scientific below 1e-3."""
    return f"{value:+.3e}" if value and abs(value) < 1e-3 else f"{value:+.4f}"


def _dropped(metrics: dict[str, Any]) -> list[str]:
    """What the step's draw lost on the way: groups the env filtered, items that failed."""
    parts = []
    if metrics.get("groups_filtered"):
        parts.append(f"{metrics['groups_filtered']} groups filtered")
    if metrics.get("groups_failed"):
        parts.append(f"{metrics['groups_failed']} items failed")
    return parts


def _fmt(metrics: dict[str, Any], total: int) -> str:
    if metrics.get("skipped"):
        parts = [f"step {metrics['step']:>4}/{total}"]
        if metrics.get("groups"):
            parts.append(f"reward {metrics['reward_mean']:.3f}  no group had signal")
        parts += _dropped(metrics)
        streak = metrics.get("empty_draws", 1)
        return "  ".join(parts) + f": nothing to train on ({streak} draw{'s' if streak > 1 else ''} in a row)"
    parts = [
        f"step {metrics['step']:>4}/{total}",
        f"reward {metrics['reward_mean']:.3f} ±{metrics['reward_std']:.2f}",
        f"signal {metrics['signal_fraction']:.0%}",
        f"loss {_num(metrics['loss'])}",
        f"|grad| {metrics['grad_norm']:.3g}" if "grad_norm" in metrics else "",
        f"clip {metrics['clip_fraction']:.1%}",
    ]
    if "logprob_gap_abs" in metrics:
        parts.append(f"lp-gap {metrics['logprob_gap_abs']:.4f}")
    if "kl" in metrics:
        parts.append(f"kl {_num(metrics['kl'])}")
    if metrics.get("truncated"):
        parts.append(f"{metrics['truncated']} truncated")
    parts += _dropped(metrics)
    parts.append(f"{metrics['tokens_per_s']:,.0f} tok/s")
    return "  ".join(p for p in parts if p)


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


def _eval_line(metrics: dict[str, Any]) -> str:
    """--eval-every's line: the eval split's mean score and pass@1 on the weights of this step."""
    line = f"eval at step {metrics['step']}: "
    if "eval_mean_score" in metrics:
        line += f"mean score {metrics['eval_mean_score']:.3f} ±{metrics.get('eval_mean_score_stderr', 0):.3f}, "
    if "eval_pass@1" in metrics:
        line += f"pass@1 {metrics['eval_pass@1']:.3f}, "
    return line + f"{metrics['eval_num_items']} items, {metrics['eval_failed_samples']} failed samples"


class StepPrinter:
    """Prints each step's line with the time since the run started and an ETA: the mean time a step took so
    far (waiting for rollouts included: metrics' loop_s) times the steps left. A resumed run counts from its
    own first step."""

    def __init__(self, total: int) -> None:
        self.total, self.started = total, time.monotonic()
        self.base: int | None = None  # the step count the run started from
        self.loop_s = 0.0

    def __call__(self, metrics: dict[str, Any]) -> None:
        step = metrics["step"]
        if self.base is None:
            self.base = step if metrics.get("skipped") else step - 1
        self.loop_s += metrics.get("loop_s", 0.0)
        done = step - self.base
        eta = _duration(self.loop_s / done * (self.total - step)) if done else "?"
        timing = f"  {_duration(time.monotonic() - self.started)} elapsed, ETA {eta}"
        console.print(_fmt(metrics, self.total) + timing, soft_wrap=True)
        if "eval_num_items" in metrics:
            console.print(_eval_line(metrics), soft_wrap=True)


def _run_sft(sft: list[Path], values: dict[str, Any], out: Path) -> None:
    _load_trainer()
    from atropos_cli.trainer.sft import SFTConfig, run_sft

    if values.get("lora_r"):
        raise fail("--lora-r is for GRPO runs: --sft trains the full model", hint="drop --lora-r with --sft", code=2)
    if values.get("nproc_per_node", 1) > 1:
        raise fail(
            "--nproc-per-node is for GRPO runs: --sft trains in one process",
            hint="drop --nproc-per-node with --sft (TRL's SFTTrainer loads sft-gen's datasets for many GPUs)",
            code=2,
        )
    from atropos_cli.resources import DEFAULT_MODEL

    config = {"data": [str(p) for p in sft], "out": str(out), "model": values.get("model", DEFAULT_MODEL)}
    config |= {k: values[k] for k in ("overwrite", "seed", "lr") if k in values}
    if "steps" in values:
        config["max_steps"] = values["steps"]
    saved = run_sft(
        SFTConfig(**config),
        on_log=lambda m: console.print(
            f"step {m['step']}  loss {m['loss']:.4f}  lr {m['lr']:.2e}  {m['tokens_per_s']:,.0f} tok/s"
        ),
    )
    console.print(f"saved the fine-tuned model to {saved}")


@with_options(GRPO_OPTIONS, RUN_OPTIONS)
def train_command(
    ctx: typer.Context,
    env: Annotated[str | None, typer.Argument(help=ENV_HELP)] = None,
    out: Annotated[Path | None, typer.Option("--out", help="Run directory (default: runs/train-<env>).")] = None,
    sft: Annotated[list[Path] | None, typer.Option(help="Supervised fine-tuning on sft-gen output instead.")] = None,
    config: Annotated[
        Path | None, typer.Option("--config", help="YAML config: env:, openai: (Atropos layout) and train: (flags).")
    ] = None,
    **settings: Any,
) -> None:
    """Train a policy with GRPO (or a variant) and save Hugging Face checkpoints under OUT/checkpoints/step-N.

    `atropos train` alone trains the shipped model on arithmetic, on CPU, in one process. Atropos-style dotted
    flags go to the env and its servers: --env.group_size 16, --openai.base_url URL (with --inference external).
    """
    with cli_errors():
        values = _layered(ctx, settings, config)
        if sft:
            _run_sft(sft, values, out or Path("runs/sft"))
            return
        _load_trainer()
        grpo, opts = _configs(values, env, out, list(ctx.args), config)
        if opts.nproc_per_node > 1 and not _in_launcher():
            from atropos_cli.quiet import verbose
            from atropos_cli.trainer.scale.launch import launch

            argv = _with_split(sys.argv[1:], opts.inference_gpus)  # the ranks get auto's number, not "auto"
            launch(opts.nproc_per_node, argv, verbose(), int(opts.inference_gpus))  # each rank re-runs this command
            return
        from atropos_cli.trainer.run import run_training

        show = StepPrinter(grpo.steps)
        event = lambda m: err_console.print(m, soft_wrap=True, markup=False)  # noqa: E731
        summary = run_training(opts, grpo, show, event)
        if _rank() == 0:  # one rank of a many-GPU run reports
            _report(summary, grpo.steps)
        elif summary.interrupted:
            sys.exit(EXIT_INTERRUPTED)


def _in_launcher() -> bool:
    from atropos_cli.trainer.scale.distributed import in_launcher

    return in_launcher()


def _rank() -> int:
    from atropos_cli.trainer.scale.distributed import world_from_env

    return world_from_env()[0]


def _layered(ctx: typer.Context, settings: dict[str, Any], config: Path | None) -> dict[str, Any]:
    """The settings that differ from the fields' defaults: the YAML's `train:` section, then the typed flags."""
    from atropos_cli.config import load_yaml, validate_keys

    from_yaml: dict[str, Any] = {}
    if config is not None:
        from_yaml = load_yaml(config).get("train") or {}
        known = {*GRPO_OPTIONS.fields(), *RUN_OPTIONS.fields()}
        validate_keys(from_yaml, known, f"{config}: train")
    return {**from_yaml, **GRPO_OPTIONS.given(ctx, settings), **RUN_OPTIONS.given(ctx, settings)}


def default_train_out(env: str | None) -> Path:
    """runs/train-<env>, <env> spelled as `process` names its run directory (file-name safe: `vf:x` -> `vf-x`)."""
    from atropos_cli.env.registry import spec_stem

    return Path("runs") / f"train-{spec_stem(env or 'arithmetic')}"


def _configs(values: dict[str, Any], env: str | None, out: Path | None, dotted: list[str], config: Path | None):
    from atropos_cli.config import validate_model
    from atropos_cli.trainer.config import GRPOConfig, RunOptions

    grpo_values = {k: v for k, v in values.items() if k in GRPO_OPTIONS.fields()}
    grpo_values["out"] = str(out or default_train_out(env))
    run_values = {k: v for k, v in values.items() if k in RUN_OPTIONS.fields()}
    run_values |= {"env": env, "dotted_args": dotted, "env_config_path": str(config) if config else None}
    if isinstance(run_values.get("vllm_args"), list | tuple):  # each --vllm-args value is split like a shell line
        run_values["vllm_args"] = [arg for chunk in run_values["vllm_args"] for arg in shlex.split(chunk)]
    if "data" in run_values:
        run_values["data"] = [str(p) for p in run_values["data"]]
    grpo = validate_model(GRPOConfig, grpo_values, "train")
    grpo.loss_config()  # an unknown --loss fails here, before any model loads
    grpo.check_lora()  # and so do bad --lora-* values
    opts = validate_model(RunOptions, run_values, "train")
    if opts.inference_gpus == "auto":  # from the steps OUT already trained; said once (the parent, or rank 0)
        from atropos_cli.trainer.scale.split import auto_split

        split = auto_split(Path(grpo.out), opts.nproc_per_node)
        if _rank() == 0:
            err_console.print(split.describe(), soft_wrap=True, markup=False)
        opts = opts.model_copy(update={"inference_gpus": split.engines})
    opts.check_async()  # so do --inference-gpus / --max-staleness that do not fit, before torchrun starts
    return grpo, opts


def _with_split(argv: list[str], engines: int | str) -> list[str]:
    """`argv` with `--inference-gpus auto` replaced by the number it resolved to."""
    out = list(argv)
    for i, arg in enumerate(out):
        if arg == "--inference-gpus" and i + 1 < len(out) and out[i + 1] == "auto":
            out[i + 1] = str(engines)
        elif arg == "--inference-gpus=auto":
            out[i] = f"--inference-gpus={engines}"
    return out


def _report(summary: Any, asked: int) -> None:
    line = f"trained {summary.steps} steps; checkpoint {summary.checkpoint}"
    if summary.first_reward is not None:
        line += (
            f"; reward {summary.first_reward:.3f} -> {summary.last_reward:.3f} "
            f"(mean of the first {summary.reward_window} vs the last {summary.reward_window} steps)"
        )
    if summary.rollouts_failed:
        line += f" ({summary.rollouts_failed} rollouts failed)"
    if summary.groups_filtered:
        line += f"; {summary.groups_filtered} groups filtered by the env (not trained)"
    if summary.env_epochs > 1:
        line += f"; {summary.env_epochs} epochs over the env's {summary.env_items} items"
    console.print(line, soft_wrap=True)
    if summary.groups_skipped:
        warn(
            f"skipped {summary.groups_skipped} groups from the trajectory API that the model cannot train "
            "(token ids outside its vocabulary, or scores/advantages/log-probs beyond ±1e6)"
        )
    if summary.truncated:
        warn(f"{summary.truncated} rollouts were longer than max_len {summary.max_len} and were truncated")
    if summary.plot:
        console.print(f"wrote {summary.plot}", soft_wrap=True)
    if summary.interrupted:
        err_console.print(
            f"interrupted; the checkpoint {summary.checkpoint} holds the last step", style="yellow", soft_wrap=True
        )
        sys.exit(EXIT_INTERRUPTED)
    if summary.data_exhausted and summary.steps < asked:
        warn(
            f"the data ran out after {summary.steps} of {asked} steps "
            f"({summary.groups_available} groups, {summary.groups_per_step} per step, {summary.epochs} epoch(s))"
        )
        err_console.print("[yellow]hint:[/] raise --epochs, lower --groups-per-step or --steps, or add rollouts")
    if summary.env_exhausted and summary.steps < asked:
        _report_exhausted(summary, asked)


def _report_exhausted(summary: Any, asked: int) -> None:
    """The env's items ran out before --steps: say when, and how to go on."""
    items = f"its {summary.env_items} items" if summary.env_epochs == 1 else f"{summary.env_epochs} epochs"
    warn(f"the env ran out of items after {summary.steps} of {asked} steps ({items})")
    if not summary.env_restartable:
        hint = "this env cannot start its items over (no restart_items): make get_next_item cycle, or lower --steps"
    else:
        hint = "pass --on-exhausted cycle to start its items over (epochs), or lower --steps"
    err_console.print(f"[yellow]hint:[/] {hint}", soft_wrap=True)


def register(app: typer.Typer) -> None:
    app.command("train", cls=DottedCommand)(train_command)
