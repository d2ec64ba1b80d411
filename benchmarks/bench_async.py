"""The disaggregated loop against the colocated synchronous loop, on the same 2 GPUs.

Rows, each one `atropos train ENV` launch (torchrun, 2 ranks) on the same machine in the same run:
- `sync`: `--nproc-per-node 2`: both ranks sample their share of a step's groups on their own local engine,
  then both train (FSDP2), then the weights are copied into each engine (the one-command loop today);
- `async S`: `--nproc-per-node 2 --inference-gpus 1 --max-staleness S`: rank 0 trains, rank 1 only samples,
  weights pushed over NCCL after every step (S=0: the same schedule as sync; S=1: generation overlaps training);
- `async S CORRECTION`: the same with `--is-correction CORRECTION` (none, truncate, mask, decoupled, stable:
  the off-policy corrections of docs/training-async.md; without it, S > 0 trains with truncate).

For each model x env: steps/s and trained tokens/s (prompt + completion) over the wall clock of the steps
after `--warmup` (those pay for compilation and graph capture), mean reward of the first and last steps, mean
staleness, and the reward curve per step of every row side by side (the same groups per step, so a step is the
same number of samples).

Models: `0.5b`: Qwen2.5-0.5B-shaped, random weights, the shipped tokenizer's vocabulary (no download; its
reward stays near 0: a throughput row); `tiny`: the shipped atropos-tiny-arith, which learns arithmetic (the
learning row). Envs: `arithmetic` (short answers) and `count` (this file's env: completions of up to
`--long-tokens` tokens, reward 1 for an even character count: the longer-generation row).

    python benchmarks/bench_async.py --out benchmarks/results/async_gpu.md                     # 2 GPUs
    python benchmarks/bench_async.py --device cpu --models tiny --steps 3 --warmup 1 --groups 2 --group-size 4 \\
        --long-tokens 16                                                                       # smoke test (gloo)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COUNT_ENV = Path(__file__).resolve().parents[1] / "examples" / "count_env.py"  # long completions


def model_dir(name: str, work: Path) -> tuple[str, float]:
    """(the --model to train, lr) for a benchmark model name."""
    if name == "tiny":
        return "atropos-tiny-arith", 3e-4
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("atropos-tiny-arith"))
    cfg = Qwen2Config(  # Qwen2.5-0.5B's shape with the shipped tokenizer's vocabulary
        vocab_size=len(tokenizer), hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768, rope_theta=1000000.0,
        rms_norm_eps=1e-6, tie_word_embeddings=True,
    )  # fmt: skip
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    path = work / "model-0.5b"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path), 1e-6


def run_row(mode: str, model: str, lr: float, env: str, env_flags: list[str], args, work: Path) -> dict:
    out = work / f"run-{Path(model).name}-{Path(env).stem}-{mode.replace(' ', '')}-seed{args.seed}"
    flags = ["--nproc-per-node", "2"]
    if mode.startswith("async"):
        parts = mode.split()
        flags += ["--inference-gpus", "1", "--max-staleness", parts[1]]
        flags += ["--is-correction", parts[2]] if len(parts) > 2 else []
    cmd = [
        sys.executable, "-m", "atropos_cli", "train", env, "--model", model, "--out", str(out), "--lr", str(lr),
        "--steps", str(args.steps), "--groups-per-step", str(args.groups), "--env.group_size", str(args.group_size),
        "--save-every", "0", "--device", args.device, "--seed", str(args.seed), *env_flags, *flags,
    ]  # fmt: skip
    started = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    log = out.parent / f"{out.name}.log"  # a file, not a pipe: a rank that outlives a kill cannot hold it open
    # its own process group: a row past --timeout is stopped with its ranks (they hold the GPUs)
    with log.open("w") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            proc.wait(timeout=args.timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            timed_out = True
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=30)
    wall = time.perf_counter() - started
    metrics = out / "metrics.jsonl"
    if args.out:  # each row's log and per-step metrics beside the table (what its steps spent, engine builds)
        keep = Path(args.out).parent / f"{Path(args.out).stem}_rows"
        keep.mkdir(parents=True, exist_ok=True)
        shutil.copy(log, keep / log.name)
        if metrics.is_file():
            shutil.copy(metrics, keep / f"{out.name}.metrics.jsonl")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()] if metrics.is_file() else []
    if timed_out and len(rows) <= args.warmup:
        return {"mode": mode, "error": f"timed out after {args.timeout:.0f} s at step {len(rows)}"}
    if proc.returncode and not timed_out:
        return {"mode": mode, "error": f"exit {proc.returncode}: {log.read_text().strip()[-600:]}"}
    if timed_out:  # the steps it made before the limit still count (the table says how many)
        mode = f"{mode} ({len(rows)} of {args.steps} steps: timed out)"
    timed = rows[args.warmup :] or rows
    seconds = sum(r.get("loop_s", 0.0) for r in timed)
    rewards = [r.get("reward_mean", 0.0) for r in rows]
    window = max(1, min(5, len(rewards) // 2))
    return {
        "mode": mode,
        "wall_s": wall,
        "steps_per_s": len(timed) / seconds if seconds else 0.0,
        "tokens_per_s": sum(r.get("real_tokens", 0) for r in timed) / seconds if seconds else 0.0,
        "first_reward": sum(rewards[:window]) / window,
        "last_reward": sum(rewards[-window:]) / window,
        "staleness": sum(r.get("staleness_mean", 0.0) for r in rows) / len(rows),
        "rewards": rewards,
    }


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
    good = [r for r in results if "error" not in r]
    lines += ["", "reward per step:", "", "| step | " + " | ".join(r["mode"] for r in good) + " |"]
    lines.append("|---|" + "---|" * len(good))
    for step in range(max((len(r["rewards"]) for r in good), default=0)):
        cells = [f"{r['rewards'][step]:.3f}" if step < len(r["rewards"]) else "" for r in good]
        lines.append(f"| {step + 1} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--models", default="0.5b,tiny", help="0.5b (random, throughput) and/or tiny (learns)")
    parser.add_argument("--envs", default="arithmetic,count")
    parser.add_argument("--modes", default="sync,async 0,async 1", help="sync, 'async S', 'async S CORRECTION' rows")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--groups", type=int, default=32)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=512, help="the count env's completion budget")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")

    import torch

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu (gloo)"
    lines = [f"# async vs synchronous loop: 2 ranks on {name}, torch {torch.__version__}", ""]
    work = Path(tempfile.mkdtemp(prefix="bench-async-"))
    envs = {
        "arithmetic": ("arithmetic", []),
        "count": (str(COUNT_ENV), ["--env.max_token_length", str(args.long_tokens)]),
    }
    for model_name in args.models.split(","):
        model, lr = model_dir(model_name, work)
        for env_name in args.envs.split(","):
            env, env_flags = envs[env_name]
            results = []
            for mode in args.modes.split(","):
                result = run_row(mode.strip(), model, lr, env, env_flags, args, work)
                print(json.dumps({k: v for k, v in result.items() if k != "rewards"}), flush=True)
                results.append(result)
            lines += table(model_name, env_name, results, args)
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
