"""Conformance env 11: collect_trajectories returning a LIST of groups, group_overrides["group_size"],
think-block handling and best-of-n selection helpers.

Uses: list-of-ScoredDataGroup results, group_overrides group_size, utils.message_history_utils.strip_thinking,
utils.best_of_n_selection.select_best_index, messages in the group, type_definitions.Message.
"""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Message
from atroposlib.utils.best_of_n_selection import select_best_index
from atroposlib.utils.message_history_utils import strip_thinking
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class GroupListEnv(BaseEnv):
    name = "group_list"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=4, use_wandb=False, total_steps=2, max_token_length=32)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return (self.i + 10, self.i + 2)

    async def collect_trajectories(self, item):
        a, b = item
        question = f"What is {a} + {b}?"
        completions = await self.server.chat_completion(messages=[{"role": "user", "content": question}], n=4)
        rows = []
        for choice in completions.choices:
            answer = strip_thinking(f"<think>adding {a} and {b}</think>{choice.message.content}").strip()
            chat: list[Message] = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
            out = tokenize_for_trainer(self.tokenizer, chat)
            rows.append((out, 1.0 if answer == str(a + b) else 0.0, chat))
        best = select_best_index([r[1] for r in rows], [len(r[0]["tokens"]) for r in rows])
        groups = []
        for part in (rows[:2], rows[2:]):
            group = ScoredDataGroup()
            group["tokens"] = [r[0]["tokens"] for r in part]
            group["masks"] = [r[0]["masks"] for r in part]
            group["scores"] = [r[1] for r in part]
            group["messages"] = [r[2] for r in part]
            group["group_overrides"] = {"group_size": 2, "best_index": best}
            groups.append(group)
        return groups, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    GroupListEnv.cli()
