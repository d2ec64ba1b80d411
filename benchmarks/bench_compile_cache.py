"""Compiles kept across runs (atropos_cli/compile_cache.py): the first step of `atropos train` on a model, in a
run with an empty compile cache and in the run after it, which finds the first one's kernels.

Per shape (published shapes of atropos_cli/families.py at full depth, random weights, the shipped tokenizer's
vocabulary), two fresh processes of

    atropos train arithmetic --model DIR --env.max_token_length 256 --steps STEPS

with `ATROPOS_COMPILE_CACHE` pointing at one new directory: the first run compiles (cold), the second loads
(warm). The table gives each run's first step (metrics.jsonl's `loop_s`: rollouts with the engine's compile and
graph capture, then the trainer's step with its compile), a later step for scale, and the process's wall time.

    python benchmarks/bench_compile_cache.py --shapes Qwen2.5-0.5B,Llama-3.2-1B --out results.md   # GPU
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def model_dir(shape: str, work: Path) -> Path:
    """The shape with random weights and the shipped tokenizer, saved as `atropos train --model` reads it."""
    from atropos_cli.families import build
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("atropos-tiny-arith"))
    model = build(shape, vocab_size=len(tokenizer))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    path = work / shape
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def one_run(model: Path, out: Path, cache: Path, steps: int, timeout: float) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHINDUCTOR_", "TRITON_"))}
    env["ATROPOS_COMPILE_CACHE"] = str(cache)
    cmd = [
        sys.executable, "-m", "atropos_cli.cli.app", "train", "arithmetic", "--model", str(model),
        "--env.max_token_length", "256", "--steps", str(steps), "--out", str(out), "--lr", "1e-6",
    ]  # fmt: skip
    started = time.perf_counter()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
        error = done.stderr[-800:] if done.returncode else None
    except subprocess.TimeoutExpired:
        error = f"stopped at {timeout:.0f} s"
    wall = time.perf_counter() - started
    path = out / "metrics.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()] if path.is_file() else []
    steps_s = [r["loop_s"] for r in rows if "loop_s" in r]
    return {"wall": wall, "steps": steps_s, "error": error}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="Qwen2.5-0.5B", help="comma-separated published shapes")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=400.0, help="seconds a run may take")
    parser.add_argument("--out", type=Path, default=None, help="write the table here too")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="compile-cache-"))
    lines = [
        "| shape | run | compile cache | first step s | later step s | process wall s |",
        "|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for shape in args.shapes.split(","):
        model = model_dir(shape, work)
        cache = work / f"cache-{shape}"
        for i, state in enumerate(("empty (cold)", "filled by run 1 (warm)")):
            r = one_run(model, work / f"run-{shape}-{i}", cache, args.steps, args.timeout)
            first = f"{r['steps'][0]:.1f}" if r["steps"] else "-"
            later = f"{r['steps'][-1]:.2f}" if len(r["steps"]) > 1 else "-"
            line = f"| {shape} | {i + 1} | {state} | {first} | {later} | {r['wall']:.0f} |"
            if r["error"]:
                line += f" error: {r['error'].strip().splitlines()[-1][:200]}"
            lines.append(line)
            print(line, flush=True)
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
