"""Vision-language rollouts and trainer steps on image + text rows: a Qwen2.5-VL shape at full depth, random
weights (atropos_cli/families_vl.py; the shipped tokenizer's vocabulary with the VL special tokens, as the family
rows of bench_generation.py use it), one GPU.

What it measures: the local backend sampling chats that each carry one image (GROUPS prompts x N choices, the
image processor and the vision tower in the prefill, the loop sampler: the static engine takes no image inputs),
completion tokens/s; then GRPO steps of the trainer's defaults on those rows (each image row its own micro-batch,
the pixels recomputed from the row's image), trained tokens/s and model tokens/s; and the largest gap between the
trainer's logprobs and the rollout's on the sampled tokens (the logprob contract, in bf16 on the GPU). Last, the
same text stack as a Qwen2 causal LM samples text prompts of the image rows' length on the static engine: the ratio
of the two rollout rates is what the loop sampler costs image rows.

    python benchmarks/bench_vision.py --out vision.md                  # GPU: Qwen2.5-VL-3B, 448 px images
    python benchmarks/bench_vision.py --tiny --device cpu --out x.md   # a smoke test of the script itself

The rollout model (a bf16 copy of the trainer's fp32 weights) is freed before the trainer's optimizer states are
made, so the 3B shape fits one 80 GB card; the text stack on the static engine runs last, alone on the card.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import copy
import gc
import io
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch


def image_url(seed: int, pixels: int) -> str:
    """A data URL of a noise PNG of `pixels` x `pixels` (Atropos' multimodal envs send images this way)."""
    from PIL import Image

    gen = torch.Generator().manual_seed(seed)
    data = torch.randint(0, 256, (pixels, pixels, 3), generator=gen, dtype=torch.uint8).numpy()
    buf = io.BytesIO()
    Image.fromarray(data).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat(url: str, index: int) -> list[dict[str, Any]]:
    text = {"type": "text", "text": f"Question {index}: how many objects are in the image? Answer in one word."}
    return [{"role": "user", "content": [text, {"type": "image_url", "image_url": {"url": url}}]}]


def rollouts(args: argparse.Namespace, model: Any, tokenizer: Any, vision: Any) -> tuple[list[Any], dict[str, float]]:
    """GROUPS chats of one image each, N choices each, sampled as one batch; (groups, timings)."""
    from atropos_cli.config import ServerConfig
    from atropos_cli.inference.base import SamplingParams
    from atropos_cli.inference.local import LocalBackend
    from atropos_cli.types import ScoredGroup

    config = ServerConfig(model_name=args.shape or "tiny", server_type="local", device=args.device)
    backend = LocalBackend(config, max_batch_size=args.groups * args.n, model=(model, tokenizer), vision=vision)
    params = SamplingParams(n=args.n, max_tokens=args.gen_tokens, temperature=1.0, seed=0)
    urls = [image_url(i, args.image) for i in range(args.groups)]

    async def run(count: int) -> tuple[list[Any], float]:
        started = time.perf_counter()
        with backend.expecting(count * args.n, args.gen_tokens):
            gens = await asyncio.gather(*(backend.chat(chat(urls[i], i), params) for i in range(count)))
        _sync(args.device)
        return gens, time.perf_counter() - started

    asyncio.run(run(1))  # warm-up: one group
    gens, elapsed = asyncio.run(run(args.groups))
    groups, completion = [], 0
    for g, url in zip(gens, urls, strict=True):
        prompt = list(g.prompt_token_ids)
        completion += sum(len(c.token_ids) for c in g.choices)
        groups.append(
            ScoredGroup(
                tokens=[prompt + list(c.token_ids) for c in g.choices],
                masks=[[-100] * len(prompt) + list(c.token_ids) for c in g.choices],
                scores=[float(i % 2) for i in range(args.n)],
                inference_logprobs=[[1.0] * len(prompt) + list(c.logprobs) for c in g.choices],
                images=[url] * args.n,
                generation_params={"temperature": 1.0},
            )
        )
    prompt_len = len(gens[0].prompt_token_ids)
    image_tokens = gens[0].prompt_token_ids.count(model.config.image_token_id)
    return groups, {
        "rollout_s": elapsed, "completion_tokens": completion, "prompt_tokens": prompt_len,
        "image_tokens": image_tokens, "gen_tok_s": completion / elapsed,
    }  # fmt: skip


def engine_tok_s(args: argparse.Namespace, config: Any, tokenizer: Any, prompt_len: int) -> float:
    """The same text stack as a Qwen2 causal LM (no vision tower, 1-D rope) on the local backend's static engine
    (CUDA): text prompts as long as the image rows' prompts, the same rows and new tokens. Beside the image rows'
    rate it is what the loop sampler costs them."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from atropos_cli.config import ServerConfig
    from atropos_cli.inference.base import SamplingParams
    from atropos_cli.inference.local import LocalBackend

    text = config.text_config
    keys = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
            "vocab_size", "tie_word_embeddings", "max_position_embeddings", "rms_norm_eps")  # fmt: skip
    values = {k: getattr(text, k) for k in keys}
    qwen2 = AutoConfig.for_model(
        "qwen2", **values, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id, bos_token_id=None,
    )  # fmt: skip
    torch.manual_seed(0)
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(qwen2, dtype=dtype).eval()
    rows = args.groups * args.n
    backend = LocalBackend(
        ServerConfig(model_name="text-engine", server_type="local", device=args.device),
        max_batch_size=rows, model=(model, tokenizer),
    )  # fmt: skip
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, len(tokenizer) - 8, (prompt_len,), generator=gen).tolist() for _ in range(args.groups)]
    params = SamplingParams(n=args.n, max_tokens=args.gen_tokens, temperature=1.0, seed=0)

    async def run() -> tuple[int, float]:
        started = time.perf_counter()
        with backend.expecting(rows, args.gen_tokens):
            gens = await asyncio.gather(*(backend.complete(p, params) for p in prompts))
        _sync(args.device)
        return sum(len(c.token_ids or []) for g in gens for c in g.choices), time.perf_counter() - started

    asyncio.run(run())  # warm-up: the engine's build (its compile) and first batch
    tokens, elapsed = asyncio.run(run())
    return tokens / elapsed  # the model and its engine go with this frame (main() collects them)


def trainer_steps(args: argparse.Namespace, groups: list[Any], model: Any, tokenizer: Any) -> dict[str, float]:
    """The trainer's defaults on the rollout groups (the rollout's weights, fp32 masters): a warm-up step (its
    logprob gap is the contract's, before any update), then `--steps` timed ones."""
    from atropos_cli import families_vl
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    folder = tempfile.mkdtemp(prefix="bench-vision-")
    families_vl.image_processor().save_pretrained(folder)  # where the trainer reads the image processor from
    cfg = GRPOConfig(
        model=folder, out=str(Path(folder) / "out"), device=args.device, lr=1e-6, max_len=8192, lora_r=args.lora_r
    )
    trainer = GRPOTrainer(cfg, model=model, tokenizer=tokenizer)
    warm = trainer.step(groups)
    _sync(args.device)
    times, metrics = [], []
    for _ in range(args.steps):
        started = time.perf_counter()
        metrics.append(trainer.step(groups))
        _sync(args.device)
        times.append(time.perf_counter() - started)
    step_s = statistics.median(times)
    peak = torch.cuda.max_memory_allocated() / 2**30 if args.device.startswith("cuda") else 0.0
    return {
        "step_s": step_s, "trained_tok_s": metrics[-1]["trained_tokens"] / step_s,
        "model_tok_s": metrics[-1]["padded_tokens"] / step_s, "image_rows": metrics[-1]["image_rows"],
        "peak_gib": peak, "gap": warm.get("logprob_gap_abs", float("nan")),
    }  # fmt: skip


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="Qwen2.5-VL-3B", help="a published shape of atropos_cli/families_vl.py")
    parser.add_argument("--tiny", action="store_true", help="the tiny test shape (a smoke test of the script)")
    parser.add_argument("--layers", type=int, default=None, help="fewer text layers (default: full depth)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--groups", type=int, default=16, help="prompts, one image each")
    parser.add_argument("--n", type=int, default=8, help="choices a prompt (the group size)")
    parser.add_argument("--image", type=int, default=448, help="image side in pixels (448: 256 image tokens)")
    parser.add_argument("--gen-tokens", type=int, default=256)
    parser.add_argument("--steps", type=int, default=3, help="timed trainer steps (after one warm-up step)")
    parser.add_argument("--lora-r", type=int, default=0, help="train LoRA adapters of this rank (0: full fine-tune)")
    parser.add_argument(
        "--no-engine-row", dest="engine_row", action="store_false",
        help="skip the text-only rate of the same text stack on the static engine (the loop sampler's cost)",
    )  # fmt: skip
    parser.add_argument("--out", default=None, help="append the results row (markdown) to this file")
    args = parser.parse_args()
    if args.tiny:  # the tiny test shape's sizes, where the line does not give its own
        parser.set_defaults(groups=2, n=2, image=28, gen_tokens=16, steps=1)
        args = parser.parse_args()
    from atropos_cli import families_vl
    from atropos_cli.vision import VisionProcessor

    if args.tiny:
        args.shape = None
    began = time.perf_counter()

    def progress(what: str) -> None:  # each stage as it ends: a run cut short by its time limit still says where
        print(f"  [{time.perf_counter() - began:6.1f} s] {what}", flush=True)

    tokenizer = families_vl.tiny_tokenizer()
    config = families_vl.config_for(args.shape, args.layers, tokenizer)
    master = families_vl.build(config, seed=0, dtype=torch.float32, device=args.device)  # the trainer's weights
    cuda = args.device.startswith("cuda")
    model = copy.deepcopy(master).to(torch.bfloat16) if cuda else master  # the rollout engine's: bf16 on CUDA
    vision = VisionProcessor.for_config(families_vl.image_processor(), model.config)
    params = sum(p.numel() for p in model.parameters())
    progress(f"built {args.shape or 'tiny'}: {params / 1e9:.2f}B params")
    groups, roll = rollouts(args, model, tokenizer, vision)
    progress(f"rollouts: {roll['gen_tok_s']:,.0f} generated tok/s, {roll['image_tokens']} image tokens a row")
    del model
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    train = trainer_steps(args, groups, master, tokenizer)
    progress(f"trainer: {train['step_s']:.2f} s a step, {train['peak_gib']:.1f} GiB peak, gap {train['gap']:.4f}")
    del master  # last: the engine's compiled step and CUDA graphs are built with nothing else on the card
    gc.collect()
    if cuda:
        torch.cuda.empty_cache()
    engine = engine_tok_s(args, config, tokenizer, roll["prompt_tokens"]) if args.engine_row else float("nan")
    card = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    text = config.text_config
    how = f"LoRA r={args.lora_r}" if args.lora_r else "full fine-tune"
    size = f"{text.num_hidden_layers} layers, {params / 1e9:.2f}B params, vocab {len(tokenizer)}"
    shape = f"{args.shape or 'tiny'} ({size}; {how})"
    header = (
        "| shape | card | rows (prompts x n) | image px (tokens) | prompt tokens | rollout gen tok/s | "
        "text rows on the engine, same stack, tok/s | "
        "trainer step s | trained tok/s | model tok/s | image rows a step | peak GiB (trainer) | mean abs logprob gap |"
    )
    row = (
        f"| {shape} | {card} | {args.groups} x {args.n} | {args.image} ({roll['image_tokens']}) | "
        f"{roll['prompt_tokens']} | {roll['gen_tok_s']:,.0f} | {engine:,.0f} ({engine / roll['gen_tok_s']:.1f}x) | "
        f"{train['step_s']:.2f} | {train['trained_tok_s']:,.0f} | "
        f"{train['model_tok_s']:,.0f} | {train['image_rows']} | {train['peak_gib']:.1f} | "
        f"{train['gap']:.4f} |"
    )
    lines = [header, "|" + "|".join("---" for _ in range(header.count("|") - 1)) + "|", row]
    print("\n".join(lines))
    if args.out:
        with open(args.out, "a") as f:
            f.write("\n".join(lines) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
