"""tinker-cookbook's RL training loop, unchanged, against `atropos serve-trainer` on the shipped tiny model, with the
reward climbing:

    python cookbook_run.py rl MODEL_DIR LOG_DIR STEPS LORA_RANK LEARNING_RATE     (rank 0: full fine-tuning)

`rl` is `tinker_cookbook.rl.train.main` (rollouts, group-centred advantages, the importance-sampling loss) on the
cookbook's arithmetic env in the tiny model's range (tiny_cookbook.SmallOperandBuilder) and its own chat template
(tiny_cookbook's renderer, registered through the cookbook's `register_renderer`). The recipe script
`math_rl/train.py` runs unchanged too (tests/test_tinker_service.py), but with the cookbook's plain-text renderer
and operands 0..100 the tiny model answers about nothing right, so its reward has nothing to climb from; this
builds the same loop's Config in code instead."""

from __future__ import annotations

import asyncio
import sys

from tinker_cookbook.rl import train as rl_train
from tiny_cookbook import RENDERER, SmallOperandBuilder


def rl(model: str, log_path: str, steps: str, rank: str, lr: str) -> None:
    config = rl_train.Config(
        learning_rate=float(lr),
        dataset_builder=SmallOperandBuilder(
            batch_size=8, group_size=8, n_batches=int(steps), model_name_for_tokenizer=model
        ),
        model_name=model,
        recipe_name="atropos_tiny_rl",
        renderer_name=RENDERER,
        lora_rank=int(rank),
        max_tokens=4,
        log_path=log_path,
        eval_every=0,
        save_every=0,
        loss_fn="importance_sampling",
        max_steps=int(steps),
    )
    asyncio.run(rl_train.main(config))


if __name__ == "__main__":
    {"rl": rl}[sys.argv[1]](*sys.argv[2:])
