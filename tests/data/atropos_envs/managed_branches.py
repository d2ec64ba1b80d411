"""Conformance env 4: ManagedServer with n > 1 in one call: one node per branch.

Uses: managed_server(tokenizer=...), chat_completion(n=group_size), get_state()["nodes"] with one node per
choice, masked_tokens -100 on the prompt, logprobs 1.0 on the prompt, metadata finish_reason.
"""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup


class BranchesEnv(BaseEnv):
    name = "managed_branches"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=16, total_steps=2)
        return config, [
            APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1", server_type="vllm")
        ]

    async def setup(self):
        self.k = 0

    async def get_next_item(self):
        self.k += 1
        return (3 + self.k, 4 + 2 * self.k)

    async def collect_trajectories(self, item):
        a, b = item
        messages = [{"role": "user", "content": f"What is {a} + {b}?"}]
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            completion = await managed.chat_completion(messages=messages, n=self.config.group_size, max_tokens=8)
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup()
        group["tokens"] = []
        group["masks"] = []
        group["scores"] = []
        group["inference_logprobs"] = []
        for choice, node in zip(completion.choices, nodes, strict=True):
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            right = choice.message.content.strip() == str(a + b)
            truncated = node.metadata["finish_reason"] == "length"
            group["scores"].append(1.0 if right else (-0.5 if truncated else -1.0))
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    BranchesEnv.cli()
