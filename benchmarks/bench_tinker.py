"""Tokens/s of `atropos serve-trainer` through the official tinker SDK (forward_backward, sample) beside `atropos
train`'s own step on the same model, in one run.

    ATROPOS_TINKER_PYTHON=/tmp/tinker-venv/bin/python \
    python benchmarks/bench_tinker.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda --rank 32 \
        --datums 64 --tokens 512 --samples 64 --max-tokens 256 --env arithmetic --train-steps 5

prints one table (JSON lines per measurement). The SDK side runs in its own venv ($ATROPOS_TINKER_PYTHON);
`atropos train` runs the env's GRPO loop with --lora-r RANK and its metrics.jsonl gives train_tokens_per_s.
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
def datum():
    ids = rng.integers(10, vocab, tokens + 1).tolist()
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
prompt = types.ModelInput.from_ints(rng.integers(10, vocab, 64).tolist())
params = types.SamplingParams(max_tokens=max_tokens, temperature=1.0)
sampler.sample(prompt, 2, params).result()
start = time.perf_counter()
res = sampler.sample(prompt, samples, params).result()
sampled = sum(len(s.tokens) for s in res.sequences) / (time.perf_counter() - start)
print(json.dumps({"forward_backward_tokens_per_s": fb, "sample_tokens_per_s": sampled}))
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="atropos-tiny-arith")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rank", type=int, default=32)
    ap.add_argument("--datums", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--samples", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--env", default="arithmetic")
    ap.add_argument("--train-steps", type=int, default=5)
    ap.add_argument("--port", type=int, default=18765)
    args = ap.parse_args()
    python = os.environ.get("ATROPOS_TINKER_PYTHON")
    if not python:
        raise SystemExit("set ATROPOS_TINKER_PYTHON to the tinker SDK's venv python")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        url = f"http://127.0.0.1:{args.port}"
        server = subprocess.Popen(
            [sys.executable, "-m", "atropos_cli", "serve-trainer", "--model", args.model, "--device", args.device,
             "--port", str(args.port), "--state-dir", str(Path(tmp) / "state")],
        )  # fmt: skip
        try:
            wait_up(url)
            env = {**os.environ, "TINKER_BASE_URL": url, "TINKER_API_KEY": "tml-bench"}
            argv = [args.model, args.rank, args.datums, args.tokens, args.samples, args.max_tokens, args.steps]
            out = subprocess.run(
                [python, "-c", SDK_SIDE, *map(str, argv)], env=env, capture_output=True, text=True, check=True
            )
            rows.append({"what": "serve-trainer (tinker SDK)", **json.loads(out.stdout.strip().splitlines()[-1])})
        finally:
            server.terminate()
            server.wait(60)
        train_out = Path(tmp) / "train"
        subprocess.run(
            [sys.executable, "-m", "atropos_cli", "train", args.env, "--model", args.model, "--steps",
             str(args.train_steps), "--lora-r", str(args.rank), "--out", str(train_out)],
            check=True,
        )  # fmt: skip
        steps = [json.loads(line) for line in (train_out / "metrics.jsonl").read_text().splitlines() if line.strip()]
        speeds = [s["train_tokens_per_s"] for s in steps[1:] if "train_tokens_per_s" in s]
        rows.append({"what": "atropos train (its step)", "train_tokens_per_s": sum(speeds) / max(len(speeds), 1)})
    for row in rows:
        print(json.dumps(row))


if __name__ == "__main__":
    main()
