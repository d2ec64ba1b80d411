"""Conformance env 8: an env with state: save_checkpoint / load_checkpoint, plus the W&B and API hooks.

Uses: save_checkpoint(step, data) with super(), load_checkpoint(), checkpoint_dir / wandb_prepend / curr_step,
wandb_log override calling super, create_rollout_table, add_rollouts_for_wandb, handle_send_to_api override,
cleanup, EvalHandlingEnum.
"""

import json
import os

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from pydantic import Field


class CheckpointConfig(BaseEnvConfig):
    ckpt_dir: str = Field(default="ckpts", description="where env checkpoints go")
    resume_step: int = Field(default=0, description="load the checkpoint of this step first")


class CheckpointingEnv(BaseEnv):
    name = "checkpointing"
    env_config_cls = CheckpointConfig

    @classmethod
    def config_init(cls):
        config = CheckpointConfig(
            group_size=2, use_wandb=False, total_steps=3, eval_handling=EvalHandlingEnum.LIMIT_TRAIN
        )
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        self.iter = 0
        self.table_rows = 0
        self.checkpoint_dir = self.config.ckpt_dir
        self.wandb_prepend = self.wandb_prepend or self.name
        self.curr_step = self.config.resume_step
        self.load_checkpoint()  # sets self.iter from the saved JSON when there is one

    async def get_next_item(self):
        self.iter += 1
        return self.iter

    async def collect_trajectories(self, item):
        question = f"What is {item} * {item + 1}?"
        completions = await self.server.chat_completion(messages=[{"role": "user", "content": question}], n=2)
        group = ScoredDataGroup()
        group["tokens"], group["masks"], group["scores"] = [], [], []
        for choice in completions.choices:
            chat = [{"role": "user", "content": question}, {"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, chat)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(1.0 if choice.message.content.strip() == str(item * (item + 1)) else 0.0)
        return group, []

    def save_checkpoint(self, step, data=None):
        if data is None:
            data = {}
        data["iter"] = self.iter
        super().save_checkpoint(step, data)

    async def handle_send_to_api(
        self, scored_data, item=None, do_send_to_api=True, abort_on_any_max_length_exceeded=True
    ):
        scored_data["overrides"] = [{"iter": self.iter} for _ in scored_data["tokens"]]
        return await super().handle_send_to_api(scored_data, item, do_send_to_api, abort_on_any_max_length_exceeded)

    async def add_rollouts_for_wandb(self, scored_data, item=None):
        await super().add_rollouts_for_wandb(scored_data, item)
        self.table_rows += 1

    async def create_rollout_table(self, wandb_metrics):
        wandb_metrics = await super().create_rollout_table(wandb_metrics)
        wandb_metrics["train/table_rows"] = self.table_rows
        return wandb_metrics

    async def wandb_log(self, wandb_metrics=None):
        wandb_metrics = wandb_metrics or {}
        wandb_metrics["train/iter"] = self.iter
        self.save_checkpoint(self.iter)
        path = os.path.join(self.checkpoint_dir, "env_checkpoints", self.wandb_prepend, f"step-{self.iter}.json")
        with open(path) as f:
            assert json.load(f) == {"iter": self.iter}
        await super().wandb_log(wandb_metrics)

    async def cleanup(self):
        self.table_rows = max(self.table_rows, 0)

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    CheckpointingEnv.cli()
