"""Conformance env 7: process supervision: per-step rewards -> per-token advantages.

Uses: utils.advantages.compute_grpo_process_supervision_advantages / compute_discounted_returns /
compute_stats / allclose_to_first, group["advantages"] (per token), tokenize_for_trainer.
"""

import numpy as np
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.advantages import (
    allclose_to_first,
    compute_discounted_returns,
    compute_grpo_process_supervision_advantages,
    compute_stats,
)
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class ProcessSupervisionEnv(BaseEnv):
    name = "process_supervision"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=4, use_wandb=False, max_token_length=64, total_steps=2)
        return config, [APIServerConfig(model_name="fake-model", base_url="http://localhost:9001/v1")]

    async def setup(self):
        self.items = [(5, 6, 2), (9, 3, 4), (7, 8, 1)]
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return self.items[(self.i - 1) % len(self.items)]

    async def collect_trajectories(self, item):
        a, b, c = item
        question = f"What is {a} + {b}?"
        completions = await self.server.chat_completion(
            messages=[{"role": "user", "content": question}], n=self.config.group_size, max_tokens=16
        )
        step_rewards, tokenized = [], []
        for choice in completions.choices:
            reply = choice.message.content.strip()
            steps = [1.0 if reply.lstrip("-").isdigit() else 0.0, 1.0 if reply == str(a + b) else -1.0]
            step_rewards.append(steps)
            chat = [{"role": "user", "content": question}, {"role": "assistant", "content": reply}]
            tokenized.append(tokenize_for_trainer(self.tokenizer, chat))
        if allclose_to_first([sum(s) for s in step_rewards]):
            return None, []
        advantages = compute_grpo_process_supervision_advantages(step_rewards, gamma=0.5 if c % 2 else None)
        stats = compute_stats(step_rewards)
        group = ScoredDataGroup()
        group["tokens"] = [t["tokens"] for t in tokenized]
        group["masks"] = [t["masks"] for t in tokenized]
        group["scores"] = [float(compute_discounted_returns(np.array(s), 0.9)[0]) for s in step_rewards]
        group["advantages"] = []
        for t, adv in zip(tokenized, advantages, strict=True):
            # the first step's advantage on the first half of the completion, the second's on the rest
            completion = [i for i, m in enumerate(t["masks"]) if m != -100]
            half = completion[: len(completion) // 2]
            per_token = [0.0] * len(t["tokens"])
            for i in completion:
                per_token[i] = round(float(adv[0] if i in half else adv[1]), 6)
            group["advantages"].append(per_token)
        group["group_overrides"] = {"reward_mean": round(stats["mean"], 6)}
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    ProcessSupervisionEnv.cli()
