"""In the style of Atropos' env files, an env with nothing to train on (tests/test_train_empty_draws.py): even
items return None from collect_trajectories, odd items a group whose scores are all equal (which the env's
`ensure_scores_are_not_same` filter drops), so every draw is empty."""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class FilteredEnv(BaseEnv):
    name = "filtered"

    @classmethod
    def config_init(cls):
        servers = [APIServerConfig(model_name="my-model", base_url="http://localhost:9001/v1")]
        return BaseEnvConfig(group_size=2, max_token_length=4), servers

    async def setup(self):
        self.drawn = 0

    async def get_next_item(self):
        self.drawn += 1
        return self.drawn - 1

    async def collect_trajectories(self, item):
        if item % 2 == 0:
            return None, []
        chat = [{"role": "user", "content": f"Repeat {item}"}]
        completions = await self.server.chat_completion(messages=chat, n=2, max_tokens=4)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for choice in completions.choices:
            tokenized = tokenize_for_trainer(
                self.tokenizer, [*chat, {"role": "assistant", "content": choice.message.content}]
            )
            group["tokens"].append(tokenized["tokens"])
            group["masks"].append(tokenized["masks"])
            group["scores"].append(1.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None
