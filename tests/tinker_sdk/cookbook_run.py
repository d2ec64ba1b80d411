"""tinker-cookbook's own training loops, unchanged, against `atropos serve-trainer` on the shipped tiny model:

    python cookbook_run.py sl MODEL_DIR LOG_DIR CONVERSATIONS.jsonl EPOCHS
    python cookbook_run.py rl MODEL_DIR LOG_DIR STEPS LORA_RANK LEARNING_RATE     (rank 0: full fine-tuning)

`sl` is `tinker_cookbook.supervised.train.main` on a conversations file (the cookbook's FromConversationFileBuilder,
as sl_basic's "your own dataset" branch); `rl` is `tinker_cookbook.rl.train.main` (rollouts, group-centred
advantages, the importance-sampling loss, a fresh sampler after every step) on the cookbook's arithmetic env
(tiny_cookbook.SmallOperandBuilder). Both build the loops' Config here: the recipes' scripts pick a renderer from
the cookbook's table of hub models (sl_basic, rl_basic), and `python -m tinker_cookbook.supervised.train` fails
in 0.6.1 (chz: "Nested entrypoints must take a type annotated argument")."""

from __future__ import annotations

import asyncio
import sys

from tinker_cookbook.rl import train as rl_train
from tinker_cookbook.supervised import train as sl_train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig
from tiny_cookbook import RENDERER, SmallOperandBuilder


def sl(model: str, log_path: str, conversations: str, epochs: str) -> None:
    common = ChatDatasetBuilderCommonConfig(
        model_name_for_tokenizer=model, renderer_name=RENDERER, max_length=64, batch_size=16
    )
    config = sl_train.Config(
        log_path=log_path,
        model_name=model,
        recipe_name="atropos_tiny_sl",
        renderer_name=RENDERER,
        dataset_builder=FromConversationFileBuilder(common_config=common, file_path=conversations),
        learning_rate=1e-2,
        lr_schedule="constant",
        num_epochs=int(epochs),
        lora_rank=8,
        save_every=0,
        eval_every=0,
    )
    asyncio.run(sl_train.main(config))


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
    {"sl": sl, "rl": rl}[sys.argv[1]](*sys.argv[2:])
