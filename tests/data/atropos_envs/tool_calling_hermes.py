"""Conformance env 5: tool calling in the hermes format (<tool_call>{json}</tool_call>), two turns.

Uses: utils.tool_call_parser.parse_tool_call / extract_tool_call, tokenize_for_trainer with
train_on_all_assistant_turns=True, chat_completion with n=1 per turn, Message.
"""

import asyncio
import json

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.type_definitions import Message
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from atroposlib.utils.tool_call_parser import extract_tool_call, parse_tool_call

TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
SYSTEM = "You can call tools. <tools>" + json.dumps(TOOLS) + "</tools> Wrap calls in <tool_call></tool_call>."


class ToolCallingEnv(BaseEnv):
    name = "tool_calling"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=3, use_wandb=False, max_token_length=128, total_steps=2)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        self.items = ["12*7", "9+16", "40-13"]
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return self.items[(self.i - 1) % len(self.items)]

    async def rollout(self, expression):
        chat: list[Message] = [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Use the calculator tool to compute: {expression}"},
        ]
        first = await self.server.chat_completion(messages=chat, n=1, max_tokens=96)
        reply = first.choices[0].message.content
        chat.append({"role": "assistant", "content": reply})
        name, args, error = parse_tool_call(reply, TOOLS, ["tool_call"])
        if error or extract_tool_call(reply) is None:
            return chat, -1.0
        result = eval(args["expression"], {"__builtins__": {}})  # the fake tool: trusted test expressions
        chat.append({"role": "user", "content": f"Tool result: {result}"})
        second = await self.server.chat_completion(messages=chat, n=1, max_tokens=32)
        final = second.choices[0].message.content
        chat.append({"role": "assistant", "content": final})
        return chat, 1.0 if str(result) in final else 0.0

    async def collect_trajectories(self, item):
        rollouts = await asyncio.gather(*[self.rollout(item) for _ in range(self.config.group_size)])
        group = ScoredDataGroup()
        group["tokens"], group["masks"], group["scores"], group["messages"] = [], [], [], []
        for chat, score in rollouts:
            out = tokenize_for_trainer(self.tokenizer, chat, train_on_all_assistant_turns=True)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(score)
            group["messages"].append(chat)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ToolCallingEnv.cli()
