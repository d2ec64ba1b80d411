"""Conformance env 1: single-turn arithmetic, one chat request with n=group_size choices.

Uses: config_init returning a list of APIServerConfig, BaseEnvConfig fields, chat_completion(n=...),
tokenize_for_trainer, ScoredDataGroup built empty then key by key, Item.
"""

import random

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

SYSTEM = "You are a calculator. Reply with the number only."


class ArithmeticEnv(BaseEnv):
    name = "arith_n_choices"

    @classmethod
    def config_init(cls) -> tuple[BaseEnvConfig, list[APIServerConfig]]:
        config = BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=64, total_steps=3)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        rng = random.Random(7)
        self.problems = [(rng.randint(2, 30), rng.choice("+-*"), rng.randint(2, 9)) for _ in range(20)]
        self.iter = 0

    async def get_next_item(self) -> Item:
        problem = self.problems[self.iter % len(self.problems)]
        self.iter += 1
        return problem

    def answer(self, item) -> int:
        a, op, b = item
        return a + b if op == "+" else a - b if op == "-" else a * b

    async def collect_trajectories(self, item) -> tuple[ScoredDataGroup | None, list]:
        a, op, b = item
        user = {"role": "user", "content": f"What is {a} {op} {b}?"}
        completions = await self.server.chat_completion(
            messages=[{"role": "system", "content": SYSTEM}, user],
            n=self.config.group_size,
            max_tokens=self.config.max_token_length,
            temperature=1.0,
        )
        scores = ScoredDataGroup()
        scores["tokens"] = []
        scores["masks"] = []
        scores["scores"] = []
        for choice in completions.choices:
            chat = [{"role": "system", "content": SYSTEM}, user]
            chat.append({"role": "assistant", "content": choice.message.content})
            out = tokenize_for_trainer(self.tokenizer, chat)
            scores["tokens"].append(out["tokens"])
            scores["masks"].append(out["masks"])
            correct = choice.message.content.strip() == str(self.answer(item))
            scores["scores"].append(1.0 if correct else -1.0)
        return scores, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ArithmeticEnv.cli()
