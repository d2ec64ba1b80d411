"""A multi-turn tool-calling env in Atropos' style: ManagedServer with a tool parser chosen by
`--env.tool_parser` (set on self.server as Atropos' t1 env does), tools passed to chat_completion, the parsed
`tool_calls` answered by a `tool` message, the final node's tokens/masks/logprobs as the group."""

import asyncio
import json

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers",
            "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
        },
    }
]


class ToolsConfig(BaseEnvConfig):
    tool_parser: str = "hermes"


class ManagedToolsEnv(BaseEnv):
    name = "managed_tools"
    env_config_cls = ToolsConfig

    def __init__(self, config, server_configs, slurm=False, testing=False):
        super().__init__(config, server_configs, slurm, testing)
        self.server.tool_parser = config.tool_parser

    @classmethod
    def config_init(cls):
        config = ToolsConfig(group_size=2, use_wandb=False, max_token_length=2048, total_steps=2)
        return config, [
            APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1", server_type="vllm")
        ]

    async def setup(self):
        pass

    async def get_next_item(self):
        return {"question": "What is 2 plus 3? Use the add tool."}

    async def rollout(self, item):
        messages = [{"role": "user", "content": item["question"]}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            first = await managed.chat_completion(messages=messages, tools=TOOLS, n=1, max_tokens=600)
            message = first.choices[0].message
            if not message.tool_calls:
                return None
            call = message.tool_calls[0]
            args = json.loads(call.function.arguments)
            messages.append(
                {
                    "role": "assistant",
                    "content": message.content,
                    "tool_calls": [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.function.name, "arguments": call.function.arguments},
                        }
                    ],
                }
            )
            messages.append({"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])})
            final = await managed.chat_completion(messages=messages, tools=TOOLS, n=1, max_tokens=40)
            node = managed.get_state()["nodes"][0]
        score = 1.0 if "The answer is 5" in (final.choices[0].message.content or "") else 0.0
        return node, score

    async def collect_trajectories(self, item):
        group = ScoredDataGroup(tokens=[], masks=[], inference_logprobs=[], scores=[])
        for played in await asyncio.gather(*[self.rollout(item) for _ in range(self.config.group_size)]):
            if played is not None:
                node, score = played
                group["tokens"].append(node.tokens)
                group["masks"].append(node.masked_tokens)
                group["inference_logprobs"].append(node.logprobs)
                group["scores"].append(score)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ManagedToolsEnv.cli()
