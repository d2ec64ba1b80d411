"""Conformance env 2: `collect_trajectory` per rollout (letter counting); the default
`collect_trajectories` stacks the ScoredDataItems.

Uses: ScoredDataItem built key by key,
collect_trajectory, tokenize_for_trainer(include_messages=True), a custom BaseEnvConfig subclass.
"""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataItem
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from pydantic import Field

WORDS = ["banana", "strawberry", "mississippi", "bookkeeper", "assess", "committee"]


class LetterConfig(BaseEnvConfig):
    letter_reward: float = Field(default=1.0, description="reward for a right count")


class LetterCountEnv(BaseEnv):
    name = "letter_count"
    env_config_cls = LetterConfig

    @classmethod
    def config_init(cls) -> tuple[LetterConfig, list[APIServerConfig]]:
        config = LetterConfig(group_size=3, use_wandb=False, max_token_length=32, total_steps=3)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1", api_key="x")]

    async def setup(self):
        self.i = 0

    async def get_next_item(self) -> Item:
        word = WORDS[self.i % len(WORDS)]
        letter = sorted(set(word))[self.i % len(set(word))]
        self.i += 1
        return {"word": word, "letter": letter}

    async def collect_trajectory(self, item) -> tuple[ScoredDataItem | None, list]:
        prompt = f"Count the letter '{item['letter']}' in \"{item['word']}\". Reply with a number."
        chat = [{"role": "user", "content": prompt}]
        completion = await self.server.chat_completion(messages=chat, n=1, max_tokens=self.config.max_token_length)
        reply = completion.choices[0].message.content
        chat.append({"role": "assistant", "content": reply})
        out = tokenize_for_trainer(self.tokenizer, chat, include_messages=True)
        item_out = ScoredDataItem()
        item_out["tokens"] = out["tokens"]
        item_out["masks"] = out["masks"]
        item_out["messages"] = out["messages"]
        right = reply.strip() == str(item["word"].count(item["letter"]))
        item_out["scores"] = self.config.letter_reward if right else 0.0
        return item_out, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    LetterCountEnv.cli()
