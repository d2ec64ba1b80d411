"""Tokens/s of `atropos serve-trainer` through the official tinker SDK (forward_backward, sample) beside `atropos
train`'s own step on the same model, in one run.

    ATROPOS_TINKER_PYTHON=/tmp/tinker-venv/bin/python \
    python benchmarks/bench_tinker.py --shape 0.5b --device cuda --rank 32 --datums 64 --tokens 512 \
        --samples 64 --max-tokens 256 --train-steps 4 --out tinker.md

`--shape 0.5b`: the Qwen2.5-0.5B shape with random weights (bf16) and the shipped tiny model's tokenizer
(no download, as bench_generation.py's loop split); `--model` instead names a model directory or shipped model.
The SDK side runs in its own environment: $ATROPOS_TINKER_PYTHON (a venv's python, or a wrapper that puts the
SDK's wheels on PYTHONPATH: benchmarks/device/run.sh's `tinker` round). `atropos train arithmetic` runs the
env's GRPO loop on the same model with --lora-r RANK; its metrics.jsonl gives train_tokens_per_s (steps after
the first). Prints one JSON line per row, and with --out a markdown table.
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

import httpx

SDK_SIDE = r"""
import json, sys, time
import numpy as np
import tinker
from tinker import types
model, rank, datums, tokens, samples, max_tokens, steps = sys.argv[1], *map(int, sys.argv[2:8])
sc = tinker.ServiceClient()
tc = sc.create_lora_training_client(base_model=model, rank=rank).result()
rng = np.random.default_rng(0)
vocab = len(tc.get_tokenizer())
low, high = 10, min(vocab, 250)  # ids every tokenizer of the model holds: the load, not the text, is measured
def datum():
    ids = rng.integers(low, high, tokens + 1).tolist()
    return types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                       loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * tokens})
batch = [datum() for _ in range(datums)]
tc.forward_backward(batch, "cross_entropy").result(); tc.optim_step(types.AdamParams(learning_rate=1e-5)).result()
start = time.perf_counter()
for _ in range(steps):
    tc.forward_backward(batch, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-5)).result()
fb = steps * datums * tokens / (time.perf_counter() - start)
sampler = tc.save_weights_and_get_sampling_client().result()
prompt = types.ModelInput.from_ints(rng.integers(low, high, 64).tolist())
params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
start = time.perf_counter()  # the first call of this many rows builds the engine for their shape
sampler.sample(prompt, samples, params).result()
first = time.perf_counter() - start
start = time.perf_counter()
res = sampler.sample(prompt, samples, params).result()
sampled = sum(len(s.tokens) for s in res.sequences) / (time.perf_counter() - start)
print(json.dumps({"forward_backward_tokens_per_s": fb, "sample_tokens_per_s": sampled, "sample_first_call_s": first,
                  "sdk_vocab": vocab}))
"""


def wait_up(url: str, deadline_s: float = 600.0) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if httpx.get(url + "/api/v1/healthz", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"serve-trainer did not come up at {url}")


def shaped_model(work: Path) -> str:
    """The Qwen2.5-0.5B shape, random bf16 weights, the tiny model's tokenizer: a model directory in `work`."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_generation import build_model

    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path("atropos-tiny-arith"))
    model = build_model(False, "cpu", vocab=len(tokenizer)).to(torch.bfloat16)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    return str(work / "model")


def sdk_row(args: argparse.Namespace, model: str, python: str, work: Path) -> dict:
    """serve-trainer on `model`, driven by the SDK side: forward_backward and sample tokens/s."""
    url = f"http://127.0.0.1:{args.port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "atropos_cli", "serve-trainer", "--model", model, "--device", args.device,
         "--port", str(args.port), "--state-dir", str(work / "state")],
    )  # fmt: skip
    try:
        wait_up(url)
        env = {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": "tml-bench", "HF_HUB_OFFLINE": "1"}
        argv = [model, args.rank, args.datums, args.tokens, args.samples, args.max_tokens, args.steps]
        out = subprocess.run(
            [python, "-c", SDK_SIDE, *map(str, argv)], env=env, capture_output=True, text=True,
            timeout=args.sdk_timeout,
        )  # fmt: skip
        if out.returncode:
            return {"what": "serve-trainer (tinker SDK)", "error": out.stderr[-1500:]}
        return {"what": "serve-trainer (tinker SDK)", **json.loads(out.stdout.strip().splitlines()[-1])}
    except subprocess.TimeoutExpired:
        return {"what": "serve-trainer (tinker SDK)", "error": f"stopped at --sdk-timeout {args.sdk_timeout} s"}
    finally:
        server.terminate()
        server.wait(60)


def train_row(args: argparse.Namespace, model: str, work: Path) -> dict:
    """`atropos train arithmetic` on `model` with LoRA rank RANK: its step's tokens/s (steps after the first)."""
    out = work / "train"
    cmd = [sys.executable, "-m", "atropos_cli", "train", "arithmetic", "--model", model, "--steps",
           str(args.train_steps), "--lora-r", str(args.rank), "--env.max_token_length", "256",
           "--out", str(out)]  # fmt: skip
    note = ""
    try:
        subprocess.run(cmd, capture_output=True, text=True, timeout=args.train_timeout)
    except subprocess.TimeoutExpired:  # the steps that finished are in metrics.jsonl
        note = f"stopped at --train-timeout {args.train_timeout} s"
    metrics = out / "metrics.jsonl"
    steps = [json.loads(x) for x in metrics.read_text().splitlines() if x.strip()] if metrics.is_file() else []
    speeds = [s["train_tokens_per_s"] for s in steps[1:] if "train_tokens_per_s" in s]
    row: dict = {"what": "atropos train (its step)", "steps_timed": len(speeds)}
    if speeds:
        row["train_tokens_per_s"] = sum(speeds) / len(speeds)
    if note or not speeds:
        row["error"] = note or "no timed step (see the run's stderr: rerun the command by hand)"
    return row


def table(args: argparse.Namespace, model: str, rows: list[dict]) -> str:
    what = f"{args.shape} shape, random weights" if args.shape else model
    lines = [
        f"tinker SDK against `atropos serve-trainer` beside `atropos train`: {what}, {args.device}, "
        f"LoRA r={args.rank}; "
        f"forward_backward of {args.datums} datums x {args.tokens} tokens ({args.steps} timed steps); sample of "
        f"{args.samples} x {args.max_tokens} tokens; `atropos train arithmetic` {args.train_steps} steps.",
        "",
        "| what | forward_backward tokens/s | sample tokens/s | sample: first call s | train step tokens/s | note |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        keys = ("forward_backward_tokens_per_s", "sample_tokens_per_s", "sample_first_call_s", "train_tokens_per_s")
        cells = [(f"{r[k]:.1f}" if k == "sample_first_call_s" else f"{r[k]:,.0f}") if k in r else "" for k in keys]
        lines.append(f"| {r['what']} | {' | '.join(cells)} | {r.get('error', '')[:200]} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="atropos-tiny-arith")
    ap.add_argument("--shape", choices=["0.5b"], default=None, help="a random-weight shape instead of --model")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--datums", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=5)
    ap.add_argument("--sdk-timeout", type=float, default=240.0)
    ap.add_argument("--train-timeout", type=float, default=150.0)
    ap.add_argument("--port", type=int, default=18765)
    ap.add_argument("--out", type=Path, default=None, help="write the markdown table here too")
    args = ap.parse_args()
    python = os.environ.get("ATROPOS_TINKER_PYTHON")
    if not python:
        raise SystemExit("set ATROPOS_TINKER_PYTHON to the tinker SDK's python (a venv's, or a wrapper)")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = shaped_model(work) if args.shape else args.model
        rows = [sdk_row(args, model, python, work), train_row(args, model, work)]
    for row in rows:
        print(json.dumps(row))
    text = table(args, model, rows)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
