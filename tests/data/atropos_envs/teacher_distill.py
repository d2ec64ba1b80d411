"""Conformance env 9: on-policy distillation written against atroposlib 0.4.0 (before TeacherDistillationEnv):
a teacher server scores each sampled sequence, its top-k prompt logprobs go into distill_token_ids /
distill_logprobs ([sequence][position][k]).

Uses: a second ServerManager of server_type vllm, ServerManager.get_logprobs(input_ids=..., top_k=...) ->
{prompt_tokens, prompt_topk_token_ids, prompt_topk_logprobs}, the distill_* fields of ScoredDataGroup.
"""

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.server_manager import ServerManager
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from pydantic import Field


class DistillConfig(BaseEnvConfig):
    teacher_base_url: str = Field(default="http://localhost:9010/v1")
    distill_top_k: int = Field(default=2, ge=1)


class TeacherDistillEnv(BaseEnv):
    name = "teacher_distill"
    env_config_cls = DistillConfig

    @classmethod
    def config_init(cls):
        config = DistillConfig(group_size=2, use_wandb=False, max_token_length=32, total_steps=2)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        teacher = APIServerConfig(
            base_url=self.config.teacher_base_url,
            model_name="fake-teacher",
            api_key="x",
            server_type="vllm",
            tokenizer_name=self.config.tokenizer_name,
        )
        self.teacher = ServerManager([teacher])
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return (self.i * 3, self.i + 4)

    async def collect_trajectories(self, item):
        a, b = item
        question = f"What is {a} - {b}?"
        completions = await self.server.chat_completion(
            messages=[{"role": "user", "content": question}], n=self.config.group_size, max_tokens=16
        )
        group = ScoredDataGroup()
        for key in ("tokens", "masks", "scores", "distill_token_ids", "distill_logprobs"):
            group[key] = []
        for choice in completions.choices:
            chat = [{"role": "user", "content": question}, {"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, chat)
            teacher = await self.teacher.get_logprobs(input_ids=out["tokens"], top_k=self.config.distill_top_k)
            assert teacher["prompt_tokens"] == out["tokens"], "teacher saw other tokens"
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(1.0 if choice.message.content.strip() == str(a - b) else 0.0)
            group["distill_token_ids"].append(teacher["prompt_topk_token_ids"])
            group["distill_logprobs"].append(teacher["prompt_topk_logprobs"])
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    TeacherDistillEnv.cli()
