"""An env in the style of Atropos' verifiers_server.py: an OpenAI-client-shaped `ManagedServerAdapter` over
the ManagedServer handed to code that calls `client.chat.completions.create(...)`; the tracked nodes give
the group's tokens, masks and logprobs."""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.managed_server import ManagedServerAdapter


async def third_party_rollout(client, question):
    """What a library that only knows AsyncOpenAI does."""
    response = await client.chat.completions.create(
        messages=[{"role": "user", "content": question}], n=2, max_tokens=8, temperature=1.0
    )
    return [choice.message.content for choice in response.choices]


class AdapterEnv(BaseEnv):
    name = "adapter_env"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=2, use_wandb=False, total_steps=2, max_token_length=64)
        server = APIServerConfig(model_name="policy", base_url="http://localhost:9001/v1", server_type="vllm")
        return config, [server]

    async def setup(self):
        pass

    async def get_next_item(self):
        return "What is 2 + 2?"

    async def collect_trajectories(self, item):
        async with self.server.managed_server(tokenizer=self.tokenizer) as managed:
            client = ManagedServerAdapter(managed_server=managed, base_url=self.server.servers[0].config.base_url)
            answers = await third_party_rollout(client, item)
            nodes = managed.get_state()["nodes"]
        group = ScoredDataGroup(tokens=[], masks=[], scores=[], inference_logprobs=[])
        for node, answer in zip(nodes, answers, strict=True):
            group["tokens"].append(node.tokens)
            group["masks"].append(node.masked_tokens)
            group["inference_logprobs"].append(node.logprobs)
            group["scores"].append(1.0 if answer.strip() == "4" else 0.0)
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    AdapterEnv.cli()
