"""Conformance env 6: a policy server and a second (judge) server.

Uses: ServerManager / APIServerConfig / ServerBaseline from server_manager, isinstance(server, OpenAIServer)
to pick a mode (as the agent envs that continue Atropos do), split="eval" routing, the judge's verdict as score.
"""

import re

from atroposlib.envs.base import BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.envs.server_handling.openai_server import OpenAIServer
from atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerBaseline, ServerManager
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from pydantic import Field


class JudgeConfig(BaseEnvConfig):
    judge_base_url: str = Field(default="http://localhost:9002/v1", description="the judge's server")
    judge_model: str = Field(default="fake-model")


class JudgeEnv(BaseEnv):
    name = "judged_answers"
    env_config_cls = JudgeConfig

    @classmethod
    def config_init(cls):
        config = JudgeConfig(group_size=4, use_wandb=False, max_token_length=64, total_steps=2)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        baseline = ServerBaseline(model_name=self.config.judge_model, num_requests_for_eval=4)
        judge = APIServerConfig(base_url=self.config.judge_base_url, api_key="x", **baseline.model_dump())
        self.judge = ServerManager([judge])
        self.mode = "text" if isinstance(self.server.servers[0], OpenAIServer) else "tokens"
        self.questions = ["What is 11 + 5?", "What is 3 * 7?", "What is 20 - 8?"]
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return self.questions[(self.i - 1) % len(self.questions)]

    async def judge_answer(self, question, answer) -> float:
        prompt = f"JUDGE the answer to: {question} CANDIDATE: {answer}"
        verdict = await self.judge.chat_completion(
            messages=[{"role": "user", "content": prompt}], n=1, max_tokens=16, split="eval"
        )
        text = verdict.choices[0].message.content
        return 1.0 if re.search(r"VERDICT: good", text) else 0.0

    async def collect_trajectories(self, item):
        completions = await self.server.chat_completion(
            messages=[{"role": "user", "content": item}], n=self.config.group_size, max_tokens=32
        )
        group = ScoredDataGroup()
        group["tokens"], group["masks"], group["scores"] = [], [], []
        for choice in completions.choices:
            chat = [{"role": "user", "content": item}, {"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, chat)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(await self.judge_answer(item, choice.message.content))
        group["group_overrides"] = {"judge_mode": self.mode}
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    JudgeEnv.cli()
