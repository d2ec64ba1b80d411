"""An Atropos-style env that scores with atroposlib's reward registry, as dataset_env.py does: a
CombinedReward of accuracy and format (normalised by their weights) over the group's completions."""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.reward_fns import registry
from atroposlib.envs.reward_fns.combined_reward import CombinedReward
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class RegistryEnv(BaseEnv):
    name = "reward_registry"

    def __init__(self, config, server_configs, slurm=False, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        rewards = [{"type": "accuracy", "weight": 1.0}, {"type": "format", "weight": 0.5}]
        self.reward_function = CombinedReward(rewards=rewards, normalization="sum")
        registry.load_required_functions(self.config)

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=4, use_wandb=False, total_steps=2, max_token_length=256)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1", api_key="x")]

    async def setup(self):
        pass

    async def get_next_item(self):
        return {"question": "What is 2 + 3? Put the answer in \\boxed{}.", "answer": "5"}

    async def collect_trajectories(self, item):
        chat = [{"role": "user", "content": item["question"]}]
        completion = await self.server.chat_completion(messages=chat, n=self.config.group_size, max_tokens=32)
        answers = [{"role": "assistant", "content": c.message.content} for c in completion.choices]
        scores = self.reward_function(answers, solution=item["answer"])
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for answer, score in zip(answers, scores, strict=True):
            tokens = tokenize_for_trainer(self.tokenizer, chat + [answer])
            group["tokens"].append(tokens["tokens"])
            group["masks"].append(tokens["masks"])
            group["scores"].append(score)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    RegistryEnv.cli()
