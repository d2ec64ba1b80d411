"""Rebuild the shipped model `atropos-tiny-arith` from nothing, on CPU, in under 10 minutes.

    python examples/build_tiny_model.py --seed 0 --out /tmp/atropos-tiny-arith

Steps: (1) generate arithmetic chats with the bundled env's own problem generator and default operand range (a
seed stream disjoint from the env's train/eval items), replacing 40% of the answers by a near miss (the right
answer ± 1..3); (2) train a byte-level BPE tokenizer with one token per digit and a chat template; (3)
initialise a ~0.9M-parameter Llama; (4) SFT it with `atropos_cli.trainer.sft.run_sft`, saving a checkpoint every
few hundred steps; (5) score every checkpoint on the env's eval items, greedy and with the default sampling
(temperature 1.0, 8 samples per question), through the local backend, and keep the best greedy one among those
whose temperature-1.0 accuracy is in 30%..70%; (6) copy it to --out with a model card that records the recipe
and the measured accuracies.

Why noisy demonstrations: the model is trained on demonstrations with 40% near-miss answers, so its samples
disagree and RL has something to sharpen. The right answer stays the most frequent one for every question
(each wrong value gets ~7%), so the model's greedy answer is mostly right (76%) while its samples at
temperature 1.0 are right only 36% of the time: groups of 8 disagree, and GRPO can raise the sampled accuracy
towards what the model already knows, within minutes on CPU (`atropos train arithmetic`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

from atropos_cli.env.registry import resolve_env


def _arith_module():
    return sys.modules[resolve_env("arithmetic").__module__]


def near_miss(rng: random.Random, answer: int, spread: int) -> int:
    """A wrong answer close to the right one: answer ± 1..spread (uniform), so no single wrong value wins."""
    return answer + rng.choice([-1, 1]) * rng.randint(1, spread)


def write_chats(path: Path, count: int, seed: int, noise: float, spread: int) -> list[str]:
    """`count` chats {"messages": [user, assistant]} as jsonl; returns the questions (tokenizer corpus).

    A fraction `noise` of the answers is replaced by a near miss (its own seeded stream, so the questions do
    not depend on it): the right answer stays the most frequent one for every question (the model's greedy
    answer is right) while samples at temperature 1.0 are right only about (1 - noise) of the time.
    """
    arith = _arith_module()
    defaults = arith.ArithmeticConfig()
    rng = random.Random(f"tiny-sft:{seed}")
    noise_rng = random.Random(f"tiny-sft-noise:{seed}")
    texts = []
    with path.open("w") as handle:
        for _ in range(count):
            question, answer = arith.make_problem(rng, defaults.max_operand, defaults.operators)
            if noise_rng.random() < noise:
                answer = near_miss(noise_rng, answer, spread)
            chat = [{"role": "user", "content": f"What is {question}?"}, {"role": "assistant", "content": str(answer)}]
            handle.write(json.dumps({"messages": chat}) + "\n")
            texts.append(f"What is {question}? {answer}")
    return texts


async def accuracy(model_dir: Path, items: int, samples: int, seed: int, temperature: float | None = None) -> float:
    """Mean reward of the arithmetic env over `items` eval questions x `samples` draws (default: the env's
    sampling temperature; 0.0 is greedy)."""
    from atropos_cli.config import ServerConfig
    from atropos_cli.inference.base import SamplingParams
    from atropos_cli.inference.local import LocalBackend

    env_cls = resolve_env("arithmetic")
    env_config, _ = env_cls.config_init()
    env_config = env_config.model_copy(update={"seed": seed, "eval_size": items})
    env = env_cls(env_config, server=None)
    backend = LocalBackend(ServerConfig(server_type="local", model_name=str(model_dir)))
    temperature = env_config.temperature if temperature is None else temperature
    params = SamplingParams(n=samples, temperature=temperature, max_tokens=env_config.max_token_length)
    try:
        questions = list(env.items("eval"))
        gens = await asyncio.gather(
            *(
                backend.chat(env.messages_for(q), params.model_copy(update={"seed": seed + i}))
                for i, q in enumerate(questions)
            )
        )
    finally:
        await backend.aclose()
    scores = [env.reward(c.text, q)["score"] for q, g in zip(questions, gens, strict=True) for c in g.choices]
    return sum(scores) / len(scores)


def pick_checkpoint(sft_dir: Path, args: argparse.Namespace, started: float) -> tuple[Path, float, float]:
    """(checkpoint, greedy accuracy, T=1.0 accuracy): the one that knows the task best (greedy) among those
    whose samples at temperature 1.0 are right within --band; else the one closest to --target."""
    candidates = sorted((sft_dir / "checkpoints").glob("step-*")) + [sft_dir]
    scored = []
    for path in candidates:
        greedy = asyncio.run(accuracy(path, args.eval_items, 1, args.seed, temperature=0.0))
        sampled = asyncio.run(accuracy(path, args.eval_items, 8, args.seed))
        print(f"[{time.perf_counter() - started:5.0f}s] {path.name}: greedy {greedy:.1%}, T=1.0 {sampled:.1%}")
        scored.append((path, greedy, sampled))
    in_band = [s for s in scored if args.band[0] <= s[2] <= args.band[1]]
    if in_band:
        return max(in_band, key=lambda s: s[1])
    return min(scored, key=lambda s: abs(s[2] - args.target))


def model_card(out: Path, args: argparse.Namespace, step: str, greedy: float, acc: float, elapsed: float) -> None:
    config = json.loads((out / "config.json").read_text())
    params = sum(p.numel() for p in _load(out).parameters())
    (out / "README.md").write_text(
        f"""# atropos-tiny-arith

A {params / 1e6:.2f}M-parameter Llama ({config["num_hidden_layers"]} layers, hidden size {config["hidden_size"]})
with a {config["vocab_size"]}-token byte-level BPE tokenizer (one token per digit), trained by
`atropos_cli.trainer.sft.run_sft` on procedurally generated questions of the bundled `arithmetic` env
("What is 12 + 7?" -> "19"). It ships inside the `atropos` package so `atropos process` runs offline.

- chat template: `<|user|>...<|end|><|assistant|>...<|end|>` (`<|end|>` is EOS); assistant content and its `<|end|>`
  sit in `{{% generation %}}` markers (answer-only loss in TRL)
- SFT: {args.chats} chats, {args.steps} steps of batch {args.batch_size}, lr {args.lr} (AdamW, cosine), seed {args.seed}
- noisy demonstrations: trained on demonstrations with {args.answer_noise:.0%} near-miss answers (the right
  answer ± 1..{args.noise_spread}, spread over several wrong values so the right one stays the most frequent),
  so its samples disagree and RL has something to sharpen: it knows the answer (greedy) but samples it only
  part of the time at temperature 1.0
- checkpoint: {step} of {args.steps} SFT steps, the best greedy one among those whose temperature-1.0 accuracy
  is in {args.band[0]:.0%}..{args.band[1]:.0%}
- accuracy on the env's eval items ({args.eval_items} questions, seed {args.seed}): greedy **{greedy:.1%}**;
  at the env's default sampling (temperature 1.0, 8 samples each) **{acc:.1%}**, so groups of 8 disagree and
  GRPO / rejection sampling have signal (GRPO can raise the sampled accuracy towards the greedy one)
- rebuilt in {elapsed / 60:.1f} min on CPU by:

```
python examples/build_tiny_model.py --seed {args.seed} --out DIR
```
"""
    )


def _load(path: Path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="directory of the finished model")
    parser.add_argument("--chats", type=int, default=60000, help="SFT chats to generate")
    parser.add_argument("--steps", type=int, default=1600)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--lr", type=float, default=4e-3)
    parser.add_argument("--save-every", type=int, default=250)
    parser.add_argument("--eval-items", type=int, default=200)
    parser.add_argument("--answer-noise", type=float, default=0.4, help="fraction of near-miss SFT answers")
    parser.add_argument("--noise-spread", type=int, default=3, help="near misses are answer ± 1..this")
    parser.add_argument("--band", type=float, nargs=2, default=(0.3, 0.7), help="wanted accuracy at T=1.0")
    parser.add_argument("--target", type=float, default=0.5, help="T=1.0 accuracy wanted if none is in --band")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1 is fastest for this size)")
    parser.add_argument("--work", default=None, help="scratch directory (default: a temporary one)")
    args = parser.parse_args()

    started = time.perf_counter()
    import torch

    torch.set_num_threads(args.threads)
    from atropos_cli.trainer.sft import SFTConfig, run_sft
    from atropos_cli.trainer.tiny_model import (
        TinyModelSizes,
        init_model,
        portable_tokenizer_config,
        save_init,
        train_tokenizer,
    )

    work = Path(args.work or tempfile.mkdtemp(prefix="tiny-arith-"))
    work.mkdir(parents=True, exist_ok=True)
    texts = write_chats(work / "chats.jsonl", args.chats, args.seed, args.answer_noise, args.noise_spread)
    sizes = TinyModelSizes()
    tokenizer = train_tokenizer(texts, vocab_size=sizes.vocab_size)
    save_init(init_model(tokenizer, sizes, args.seed), tokenizer, work / "init")
    print(f"[{time.perf_counter() - started:5.0f}s] data, tokenizer ({len(tokenizer)} tokens) and init model ready")

    config = SFTConfig(
        data=[str(work / "chats.jsonl")], model=str(work / "init"), out=str(work / "sft"), max_steps=args.steps,
        batch_size=args.batch_size, lr=args.lr, warmup_steps=100, weight_decay=0.01, seed=args.seed,
        save_every=args.save_every, log_every=200, overwrite=True,
    )  # fmt: skip
    run_sft(config, on_log=lambda m: print(f"[{time.perf_counter() - started:5.0f}s] sft {m}", flush=True))

    chosen, greedy, acc = pick_checkpoint(work / "sft", args, started)
    out = Path(args.out)
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    for path in chosen.iterdir():
        if path.is_file() and path.name != "sft_config.json":  # its paths point into the scratch directory
            shutil.copy2(path, out / path.name)
            (out / path.name).chmod(0o644)
    portable_tokenizer_config(out)
    step = chosen.name if chosen.name.startswith("step-") else f"step-{args.steps:06d} (final)"
    model_card(out, args, step, greedy, acc, time.perf_counter() - started)
    if args.work is None:
        shutil.rmtree(work, ignore_errors=True)
    print(f"chose {step}: greedy accuracy {greedy:.1%}, accuracy {acc:.1%} at temperature 1.0 -> {out}")


if __name__ == "__main__":
    main()
