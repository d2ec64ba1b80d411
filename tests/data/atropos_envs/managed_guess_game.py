"""Conformance env 3: a multi-turn guessing game tracked by ManagedServer (tokens, masks, logprobs).

Uses: self.server.managed_server(tokenizer=...), ManagedServer.chat_completion over several turns (the node
is extended turn by turn), get_state()["nodes"] (tokens, masked_tokens, logprobs), inference_logprobs.
"""

import asyncio
import re

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Item

RULES = "Guess my number between 1 and 9. Reply GUESS n."


class GuessGameEnv(BaseEnv):
    name = "guess_game"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=24, total_steps=2)
        server = APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1", server_type="vllm")
        return config, [server]

    async def setup(self):
        self.targets = [6, 2, 8, 4]
        self.n = 0

    async def get_next_item(self) -> Item:
        self.n += 1
        return {"target": self.targets[(self.n - 1) % len(self.targets)], "max_turns": 3}

    async def play(self, item):
        messages = [{"role": "user", "content": RULES}]
        won = False
        turns = 0
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            for _ in range(item["max_turns"]):
                turns += 1
                completion = await managed.chat_completion(messages=messages, n=1, max_tokens=12, temperature=1.0)
                reply = completion.choices[0].message.content
                messages.append({"role": "assistant", "content": reply})
                found = re.search(r"GUESS (\d+)", reply)
                guess = int(found.group(1)) if found else -1
                if guess == item["target"]:
                    won = True
                    break
                hint = "Too low." if guess < item["target"] else "Too high."
                messages.append({"role": "user", "content": f"{hint} Guess again."})
            node = managed.get_state()["nodes"][0]
        score = 1.0 - 0.25 * (turns - 1) if won else -1.0
        return node, score

    async def collect_trajectories(self, item):
        played = await asyncio.gather(*[self.play(item) for _ in range(self.config.group_size)])
        group = ScoredDataGroup()
        group["tokens"] = [node.tokens for node, _ in played]
        group["masks"] = [node.masked_tokens for node, _ in played]
        group["inference_logprobs"] = [node.logprobs for node, _ in played]
        group["scores"] = [score for _, score in played]
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    GuessGameEnv.cli()
