"""Conformance env 10: the text-completion API, postprocess_histories, and evaluate() with evaluate_log.

Uses: self.server.completion(prompt=..., n=...), ServerBaseline fields turned into one APIServerConfig,
postprocess_histories (rescaling scores), evaluate(split="eval") writing metrics.json via evaluate_log,
EvalHandlingEnum.NONE, data_dir_to_save_evals.
"""

import time

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, EvalHandlingEnum, ScoredDataGroup
from atroposlib.envs.server_handling.server_baseline import ServerBaseline


class CompletionEnv(BaseEnv):
    name = "completion_eval"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(
            group_size=4, use_wandb=False, total_steps=2, eval_handling=EvalHandlingEnum.NONE, max_token_length=16
        )
        baseline = ServerBaseline(model_name="fake-model", timeout=30)
        return config, [APIServerConfig(base_url="http://localhost:9001/v1", **baseline.model_dump())]

    async def setup(self):
        self.pairs = [(2, 9), (14, 3), (6, 6), (1, 25)]
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return self.pairs[(self.i - 1) % len(self.pairs)]

    async def collect_trajectories(self, item):
        a, b = item
        prompt = f"Q: What is {a} * {b}?\nA:"
        completion = await self.server.completion(prompt=prompt, n=self.config.group_size, max_tokens=8)
        prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        group = ScoredDataGroup()
        group["tokens"], group["masks"], group["scores"] = [], [], []
        for choice in completion.choices:
            out_ids = self.tokenizer.encode(choice.text, add_special_tokens=False) + [self.tokenizer.eos_token_id]
            group["tokens"].append(prompt_ids + out_ids)
            group["masks"].append([-100] * len(prompt_ids) + out_ids)
            group["scores"].append(1.0 if choice.text.strip() == str(a * b) else 0.0)
        return group, []

    async def postprocess_histories(self, trajectories):
        trajectories["scores"] = [2.0 * s - 1.0 for s in trajectories["scores"]]
        return trajectories

    async def evaluate(self, *args, **kwargs):
        start = time.time()
        right, samples = 0, []
        for a, b in self.pairs:
            prompt = f"Q: What is {a} * {b}?\nA:"
            out = await self.server.completion(prompt=prompt, n=1, max_tokens=8, split="eval")
            ok = out.choices[0].text.strip() == str(a * b)
            right += ok
            samples.append({"prompt": prompt, "response": out.choices[0].text, "correct": ok})
        metrics = {"eval/accuracy": right / len(self.pairs)}
        await self.evaluate_log(metrics, samples=samples, start_time=start, end_time=start + 1.0, verbose=False)
        return metrics


if __name__ == "__main__":
    CompletionEnv.cli()
