"""A single-turn math env shaped like Atropos main's gsm8k_server.py: its own `__init__(config, server_configs,
slurm=True, testing=False)` that calls `super().__init__(config, server_configs, slurm, testing)`
positionally, completions scored by the last number, groups with equal scores dropped (`None`)."""

import re

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

QUESTIONS = [("What is 12 + 7?", 19), ("What is 6 * 3?", 18), ("What is 9 - 4?", 5)]


class GSM8kLikeEnv(BaseEnv):
    name = "gsm8k_like"

    def __init__(self, config: BaseEnvConfig, server_configs, slurm=True, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.percent_correct_buffer = []

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=4, use_wandb=False, total_steps=2, max_token_length=128)
        return config, APIServerConfig(model_name="policy", base_url="http://localhost:9001/v1", api_key="x")

    async def setup(self):
        self.iter = 0

    async def get_next_item(self):
        self.iter += 1
        return QUESTIONS[(self.iter - 1) % len(QUESTIONS)]

    async def collect_trajectories(self, item):
        chat = [{"role": "user", "content": item[0]}]
        completions = await self.server.chat_completion(messages=chat, n=self.config.group_size, max_tokens=16)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for choice in completions.choices:
            numbers = re.findall(r"-?\d+", choice.message.content or "")
            out = tokenize_for_trainer(
                self.tokenizer, chat + [{"role": "assistant", "content": choice.message.content}]
            )
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(1.0 if numbers and int(numbers[-1]) == item[1] else -1.0)
            self.percent_correct_buffer.append(max(group["scores"][-1], 0))
        if len(set(group["scores"])) == 1:
            return None, []
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    GSM8kLikeEnv.cli()
