"""The disaggregated loop against the colocated synchronous loop, on the same GPUs, layout by layout.

Rows, each one `atropos train ENV` launch (torchrun) on the same machine in the same run; `--layouts` lists
T+E splits (T trainer GPUs + E engine GPUs, e.g. `1+1` on 2 GPUs, `1+3,2+2,3+1` on 4):
- `sync (N GPUs)`: `--nproc-per-node N` (N = T+E, once per N): every rank samples its share of a step's groups
  on its own local engine, then every rank trains, then the weights are copied into each engine;
- `async S (T+E)`: `--nproc-per-node N --inference-gpus E --max-staleness S`: the first T ranks train, the last
  E only sample, weights pushed over NCCL after every step (S=0: the same schedule as sync; S=1: generation
  overlaps training);
- `async S CORRECTION (T+E)`: the same with `--is-correction CORRECTION` (none, truncate, mask, decoupled,
  stable: docs/training-async.md; without it, S > 0 trains with truncate);
- `--auto` adds, for each N of the layouts above 2, `async 1 auto (N GPUs)`: the sync row's run resumed with
  `--inference-gpus auto --max-staleness 1` for `--steps` more steps; the split auto chose (its printed line) is in
  the table, and only the resumed steps are timed.

For each model x env: steps/s and trained tokens/s (prompt + completion) over the wall clock of the steps
after `--warmup` (those pay for compilation and graph capture), mean reward of the first and last steps, mean
staleness, and the reward curve per step of every row side by side (the same groups per step, so a step is the
same number of samples). Compiles are kept in one cache for the whole run (`ATROPOS_COMPILE_CACHE`,
`--compile-cache`), so only the first row of a shape compiles; and a row's `--timeout` starts once its warm-up
steps are done (`--compile-timeout` bounds those), so a compile never eats the timed steps' budget.

Models: `0.5b`: Qwen2.5-0.5B-shaped, random weights, the shipped tokenizer's vocabulary (no download; its
reward stays near 0: a throughput row); `tiny`: the shipped atropos-tiny-arith (256 positions), which learns
arithmetic (the learning row). Envs:
- `arithmetic`: short answers;
- `count` (examples/count_env.py: reward 1 for an even character count): completions of up to `--long-tokens`;
- `long`: the count env with `--long-gen-tokens` (1,024) completions and `--max-len` to match, the
  long-generation row (a random-weight model generates to the limit; the tiny model's 256 positions cannot
  hold it: skipped for it);
- `multiturn`: envs/blackjack.py, a multi-turn game (up to 5 model turns, the simulator's observation between
  them, 64 tokens a turn);
- `tool`: envs/tool_agent.py, the multi-turn tool env (up to 6 model turns of 128 tokens: `lookup` and
  `calculator` calls, each result a `tool` message, a reply with neither a call nor an answer gets a reminder
  and the next turn). A random-weight model almost never calls or answers, so it plays every turn (the 0.5B row's
  rollouts are the longest the env makes); the tiny model's 256 positions hold 2 turns (its first prompt is
  ~190 tokens), and as it answers with bare numbers its groups score alike (a throughput row, not a learning one).

`--seeds 0,1,2 --curves FILE.md`: every row over each seed (`--seed` and `--env.seed`: the trainer's seed, and
the env's items and sampling), then a per-step reward table per env (each mode's
mean over the seeds and its min-max spread) and a plot (FILE.png, matplotlib) instead of the throughput tables.

    python benchmarks/bench_async.py --out benchmarks/results/async_gpu.md                     # 2 GPUs
    python benchmarks/bench_async.py --layouts 1+3,2+2,3+1 --auto --envs long --models 0.5b    # 4 GPUs
    python benchmarks/bench_async.py --models tiny --envs arithmetic,count --modes "sync,async 1" --seeds 0,1,2 \
        --curves benchmarks/results/async_curves_gpu.md                                        # 3-seed curves
    python benchmarks/bench_async.py --device cpu --models tiny --steps 3 --warmup 1 --groups 2 --group-size 4 \
        --long-tokens 16                                                                       # smoke test (gloo)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COUNT_ENV = ROOT / "examples" / "count_env.py"  # long completions
TINY_POSITIONS = 256  # the shipped tiny model's max positions
POLL_S = 1.0  # how often a running row's metrics.jsonl is read (its warm-up steps, then its budget)


@dataclass
class Row:
    """One launch: its label, its `atropos train` flags beyond the common ones, and (auto) the run it resumes."""

    mode: str  # sync, "async S", "async S CORRECTION", "async S auto"
    world: int
    engines: int = 0  # 0: the colocated loop
    flags: list[str] = field(default_factory=list)
    resume_from: Path | None = None

    @property
    def label(self) -> str:
        if self.engines == 0:  # the colocated loop, or auto (its split is chosen at launch)
            return f"{self.mode} ({self.world} GPUs)"
        return f"{self.mode} ({self.world - self.engines}+{self.engines})"


def parse_layouts(text: str) -> list[tuple[int, int]]:
    """`1+1,1+3,...` as (trainers, engines) pairs."""
    layouts = []
    for spec in text.split(","):
        match = re.fullmatch(r"\s*(\d+)\+(\d+)\s*", spec)
        if match is None or int(match.group(1)) < 1 or int(match.group(2)) < 1:
            raise SystemExit(f"error: --layouts {spec!r}: expected T+E (trainer GPUs + engine GPUs), e.g. 1+3")
        layouts.append((int(match.group(1)), int(match.group(2))))
    return layouts


def plan_rows(modes: list[str], layouts: list[tuple[int, int]], auto: bool) -> list[Row]:
    """Every mode on every layout; sync once per GPU count; with `auto`, the auto row after each sync row of more
    than 2 GPUs (it resumes that row's run)."""
    rows: list[Row] = []
    worlds = sorted({t + e for t, e in layouts})
    for mode in modes:
        if mode == "sync":
            for world in worlds:
                rows.append(Row("sync", world))
                if auto and world > 2:
                    rows.append(Row("async 1 auto", world, flags=["--inference-gpus", "auto", "--max-staleness", "1"]))
            continue
        parts = mode.split()
        for trainers, engines in layouts:
            flags = ["--inference-gpus", str(engines), "--max-staleness", parts[1]]
            flags += ["--is-correction", parts[2]] if len(parts) > 2 else []
            rows.append(Row(mode, trainers + engines, engines, flags))
    return rows


def model_dir(name: str, work: Path) -> tuple[str, float]:
    """(the --model to train, lr) for a benchmark model name."""
    if name == "tiny":
        return "atropos-tiny-arith", 3e-4
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    path = work / "model-0.5b"
    if path.is_dir():
        return str(path), 1e-6
    tokenizer = load_tokenizer(resolve_model_path("atropos-tiny-arith"))
    cfg = Qwen2Config(  # Qwen2.5-0.5B's shape with the shipped tokenizer's vocabulary
        vocab_size=len(tokenizer), hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    tokenizer.model_max_length = cfg.max_position_embeddings  # the tiny model's 256 is not this model's context
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), 1e-6


def env_specs(args) -> dict[str, tuple[str, list[str]]]:
    """Bench env name -> (the ENV to train, its flags)."""
    long = args.long_gen_tokens
    return {
        "arithmetic": ("arithmetic", []),
        "count": (str(COUNT_ENV), ["--env.max_token_length", str(args.long_tokens)]),
        "long": (str(COUNT_ENV), ["--env.max_token_length", str(long), "--max-len", str(long + 64)]),
        "multiturn": ("blackjack", []),
        "tool": ("tool_agent", []),
    }


def skip_reason(model_name: str, env_name: str, args) -> str | None:
    if model_name == "tiny" and env_name == "long":
        return (
            f"skipped: the tiny model's {TINY_POSITIONS} positions cannot hold {args.long_gen_tokens}-token completions"
        )
    return None


def _steps_done(metrics: Path) -> int:
    try:
        return sum(1 for line in metrics.read_text().splitlines() if line.strip())
    except OSError:
        return 0


def _watch(proc: subprocess.Popen, metrics: Path, warmup: int, args) -> bool:
    """Wait for the row: `--compile-timeout` for its first `warmup` steps, then `--timeout` for the rest; True when
    it had to be stopped."""
    started = time.monotonic()
    deadline = started + args.compile_timeout + args.timeout
    warmed = warmup == 0
    if warmed:
        deadline = started + args.timeout
    while proc.poll() is None:
        now = time.monotonic()
        if not warmed and _steps_done(metrics) >= warmup:
            warmed, deadline = True, now + args.timeout
        elif not warmed and now > started + args.compile_timeout:
            deadline = now  # the warm-up steps alone outran their bound
        if now >= deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
            return True
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=POLL_S)
    return False


def run_row(row: Row, model: str, lr: float, env: str, env_flags: list[str], args, work: Path, seed: int) -> dict:
    tag = re.sub(r"[^A-Za-z0-9+]", "", row.label)
    out = work / f"run-{Path(model).name}-{Path(env).stem}-{tag}-seed{seed}"
    steps, skip = args.steps, 0
    if row.resume_from is not None:  # the auto row goes on in the sync row's run (auto reads its metrics)
        out = row.resume_from
        skip = _steps_done(out / "metrics.jsonl")
        steps += skip
    cmd = [
        sys.executable, "-m", "atropos_cli", "train", env, "--model", model, "--out", str(out), "--lr", str(lr),
        "--steps", str(steps), "--groups-per-step", str(args.groups), "--env.group_size", str(args.group_size),
        "--save-every", "0", "--device", args.device, "--seed", str(seed), "--env.seed", str(seed),
        "--nproc-per-node", str(row.world),
        *env_flags, *row.flags,
    ]  # fmt: skip
    if row.resume_from is not None:
        cmd.append("--resume")
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}-{tag}.log"  # a file, not a pipe: a rank outliving a kill cannot hold it open
    metrics = out / "metrics.jsonl"
    # its own process group: a row past its limits is stopped with its ranks (they hold the GPUs)
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        timed_out = _watch(proc, metrics, skip + args.warmup, args)
    wall = time.perf_counter() - started
    if args.out or args.curves:  # each row's log and per-step metrics beside the table (what its steps spent)
        target = Path(args.out or args.curves)
        keep = target.parent / f"{target.stem}_rows"
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, keep / log.name)
        if metrics.is_file():
            shutil.copy(metrics, keep / f"{out.name}-{tag}.metrics.jsonl")
    text = log.read_text()
    chose = re.search(r"--inference-gpus auto: (\d+) of (\d+) GPUs generate[^\n]*", text)
    mode = row.label
    if chose is not None:  # auto's split, as T+E
        mode += f": chose {int(chose.group(2)) - int(chose.group(1))}+{chose.group(1)}"
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    rows = rows[skip:]
    result = {"mode": mode, "out": out, "chose": chose.group(0) if chose else None}
    if timed_out and len(rows) <= args.warmup:
        return {**result, "error": f"stopped at step {len(rows)} (limits: {args.compile_timeout:.0f} s to warm up, "
                f"{args.timeout:.0f} s after)"}  # fmt: skip
    if proc.returncode and not timed_out:
        return {**result, "error": f"exit {proc.returncode}: {text.strip()[-600:]}"}
    if timed_out:  # the steps it made before the limit still count (the table says how many)
        result["mode"] = f"{mode} ({len(rows)} of {args.steps} steps: stopped at its time limit)"
    timed = rows[args.warmup :] or rows
    seconds = sum(r.get("loop_s", 0.0) for r in timed)
    rewards = [r.get("reward_mean", 0.0) for r in rows]
    window = max(1, min(5, len(rewards) // 2))
    return {
        **result,
        "wall_s": wall,
        "steps_per_s": sum(not r.get("skipped") for r in timed) / seconds if seconds else 0.0,  # trained steps
        "tokens_per_s": sum(r.get("real_tokens", 0) for r in timed) / seconds if seconds else 0.0,
        "first_reward": sum(rewards[:window]) / window if rewards else 0.0,
        "last_reward": sum(rewards[-window:]) / window if rewards else 0.0,
        "staleness": sum(r.get("staleness_mean", 0.0) for r in rows) / len(rows) if rows else 0.0,
        "rewards": rewards,
    }


def run_rows(rows: list[Row], model: str, lr: float, env_name: str, args, work: Path, seed: int) -> list[dict]:
    """Each row in order; an auto row resumes the run of the sync row before it (same GPU count)."""
    env, env_flags = env_specs(args)[env_name]
    results: list[dict] = []
    last_sync: dict[int, dict] = {}
    for row in rows:
        if row.mode.endswith("auto"):
            base = last_sync.get(row.world)
            if base is None or "error" in base:
                results.append({"mode": row.label, "error": "no sync row of this GPU count to resume"})
                continue
            row.resume_from = base["out"]
        result = run_row(row, model, lr, env, env_flags, args, work, seed)
        if row.mode == "sync":
            last_sync[row.world] = result
        print(json.dumps({k: v for k, v in result.items() if k not in ("rewards", "out")}), flush=True)
        results.append(result)
    return results


def table(model: str, env: str, results: list[dict], args) -> list[str]:
    lines = [
        f"### {model}, {env}: {args.steps} steps of {args.groups} groups x {args.group_size} "
        f"(timed: steps after the first {args.warmup})",
        "",
        "| loop | steps/s | tokens/s (trained: prompt + completion) | reward first -> last | mean staleness | wall s |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['mode']} | failed: {r['error']} | | | | |")
            continue
        lines.append(
            f"| {r['mode']} | {r['steps_per_s']:.3f} | {r['tokens_per_s']:,.0f} | {r['first_reward']:.3f} -> "
            f"{r['last_reward']:.3f} | {r['staleness']:.2f} | {r['wall_s']:.0f} |"
        )
    lines += [f"\n{r['chose']}" for r in results if r.get("chose")]
    good = [r for r in results if "error" not in r]
    lines += ["", "reward per step:", "", "| step | " + " | ".join(r["mode"] for r in good) + " |"]
    lines.append("|---|" + "---|" * len(good))
    for step in range(max((len(r["rewards"]) for r in good), default=0)):
        cells = [f"{r['rewards'][step]:.3f}" if step < len(r["rewards"]) else "" for r in good]
        lines.append(f"| {step + 1} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def spread(curves: list[list[float]]) -> list[tuple[float, float, float] | None]:
    """Per step over the seeds' curves: (mean, min, max), None past the shortest curve."""
    steps = min((len(c) for c in curves), default=0)
    out: list[tuple[float, float, float] | None] = []
    for i in range(steps):
        values = [c[i] for c in curves]
        out.append((sum(values) / len(values), min(values), max(values)))
    return out


def curves_table(model: str, env: str, by_mode: dict[str, list[list[float]]], seeds: list[int]) -> list[str]:
    """Per step, each mode's mean reward over the seeds and its [min, max]; and the steps where a mode's mean is
    outside the first mode's spread."""
    modes = list(by_mode)
    stats = {mode: spread(curves) for mode, curves in by_mode.items()}
    lines = [
        f"### {model}, {env}: reward per step over seeds {', '.join(map(str, seeds))} (mean [min, max])",
        "",
        "| step | " + " | ".join(modes) + " |",
        "|---|" + "---|" * len(modes),
    ]
    for step in range(max((len(v) for v in stats.values()), default=0)):
        cells = []
        for mode in modes:
            cell = stats[mode][step] if step < len(stats[mode]) else None
            cells.append(f"{cell[0]:.3f} [{cell[1]:.3f}, {cell[2]:.3f}]" if cell else "")
        lines.append(f"| {step + 1} | " + " | ".join(cells) + " |")
    base = stats[modes[0]] if modes else []
    for mode in modes[1:]:
        pairs = enumerate(zip(stats[mode], base, strict=False))
        outside = [i + 1 for i, (a, b) in pairs if a and b and not b[1] <= a[0] <= b[2]]
        steps = min(len(stats[mode]), len(base))
        lines.append(
            f"\n{mode}: mean outside {modes[0]}'s min-max spread at {len(outside)} of {steps} steps"
            + (f" ({', '.join(map(str, outside))})" if outside else "")
        )
    return [*lines, ""]


def plot_curves(panels: list[tuple[str, dict[str, list[list[float]]]]], path: Path) -> str:
    """One panel per model x env: each mode's mean reward per step and its min-max band over the seeds."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "no plot: matplotlib is not installed (pip install 'atropos[plot]')"
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.6), squeeze=False)
    for ax, (title, by_mode) in zip(axes[0], panels, strict=True):
        for mode, curves in by_mode.items():
            stats = [s for s in spread(curves) if s is not None]
            steps = range(1, len(stats) + 1)
            ax.plot(steps, [s[0] for s in stats], label=mode)
            ax.fill_between(steps, [s[1] for s in stats], [s[2] for s in stats], alpha=0.2)
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel("reward (mean over seeds, min-max band)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"![reward per step]({path.name})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="0.5b,tiny", help="0.5b (random, throughput) and/or tiny (learns)")
    parser.add_argument("--envs", default="arithmetic,count", help="arithmetic, count, long, multiturn, tool")
    parser.add_argument("--modes", default="sync,async 0,async 1", help="sync, 'async S', 'async S CORRECTION' rows")
    parser.add_argument("--layouts", default="1+1", help="T+E splits: trainer GPUs + engine GPUs (1+3,2+2,3+1)")
    parser.add_argument("--auto", action="store_true", help="add the --inference-gpus auto row (layouts over 2 GPUs)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=512, help="the count env's completion budget")
    parser.add_argument("--long-gen-tokens", type=int, default=1024, help="the long env's completion budget")
    parser.add_argument("--timeout", type=float, default=3600, help="a row's seconds after its warm-up steps")
    parser.add_argument("--compile-timeout", type=float, default=300, help="a row's seconds for its warm-up steps")
    parser.add_argument("--compile-cache", default=None, help="ATROPOS_COMPILE_CACHE for every row")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--seeds", default=None, help="e.g. 0,1,2: every row over each seed (with --curves)")
    parser.add_argument("--curves", default=None, help="write the per-step reward table over --seeds here (+ .png)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    if args.compile_cache:
        os.environ["ATROPOS_COMPILE_CACHE"] = args.compile_cache
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    layouts = parse_layouts(args.layouts)
    modes = [mode.strip() for mode in args.modes.split(",")]

    import torch

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu (gloo)"
    worlds = sorted({t + e for t, e in layouts})
    lines = [f"# async vs synchronous loop: {'/'.join(map(str, worlds))} ranks on {name}, torch {torch.__version__}"]
    lines += [f"layouts (trainers+engines): {args.layouts}", ""]
    work = Path(tempfile.mkdtemp(prefix="bench-async-"))
    panels: list[tuple[str, dict[str, list[list[float]]]]] = []
    target = args.curves or args.out

    def text() -> str:
        plot = [plot_curves(panels, Path(args.curves).with_suffix(".png")), ""] if args.curves and panels else []
        return "\n".join([*lines, *plot])

    def flush() -> None:  # after every model x env: a run stopped at its time limit keeps what it finished
        if target:
            Path(target).write_text(text() + "\n")

    for model_name in args.models.split(","):
        model, lr = model_dir(model_name, work)
        for env_name in args.envs.split(","):
            reason = skip_reason(model_name, env_name, args)
            if reason is not None:
                lines += [f"### {model_name}, {env_name}: {reason}", ""]
                print(json.dumps({"model": model_name, "env": env_name, "error": reason}), flush=True)
                continue
            by_mode: dict[str, list[list[float]]] = {}
            for seed in seeds:
                results = run_rows(plan_rows(modes, layouts, args.auto), model, lr, env_name, args, work, seed)
                if not args.curves:
                    lines += table(model_name, env_name, results, args)
                for r in results:
                    if "error" not in r:
                        by_mode.setdefault(r["mode"].split(":")[0], []).append(r["rewards"])
                    elif args.curves:
                        lines.append(f"{model_name}, {env_name}, seed {seed}, {r['mode']}: failed: {r['error']}")
            if args.curves:
                lines += curves_table(model_name, env_name, by_mode, seeds)
                panels.append((f"{model_name}, {env_name}", by_mode))
            flush()
    print(text())


if __name__ == "__main__":
    main()
