"""In the style of Atropos' env files (tests/test_train_atropos_env.py trains it): its own item counter, a server
config of its own, chat_completion with n, tokenize_for_trainer; the first rollout of each group scores 1."""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class SayEnv(BaseEnv):
    name = "say"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=2, max_token_length=4)
        return config, [APIServerConfig(model_name="my-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        self.iter = 0

    async def get_next_item(self):
        self.iter += 1
        return ("Say " + str(self.iter - 1), self.iter - 1)

    async def collect_trajectories(self, item):
        chat = [{"role": "user", "content": item[0]}]
        completions = await self.server.chat_completion(
            messages=chat, n=self.config.group_size, max_tokens=self.config.max_token_length
        )
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for i, choice in enumerate(completions.choices):
            answer = {"role": "assistant", "content": choice.message.content}
            out = tokenize_for_trainer(self.tokenizer, [*chat, answer])
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(1.0 if i == 0 else -1.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None
