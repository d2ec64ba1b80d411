"""An unmodified-API Atropos environment (atroposlib 0.4.0) for the live compatibility tests.

Run by atroposlib's own CLI, `python atropos_env.py serve --env.rollout_server_url URL`, in atroposlib's venv:
its env loop (register-env, /info, /status-env GET with a body, gzip'd /scored_data) talks to `atropos api`.
Rollouts need no inference server: groups are built from the item number (tokens, masks, scores).
"""

import os

from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig


class CountingAtroposEnv(BaseEnv):
    name = "counting_atropos"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(
            tokenizer_name=os.environ["ATROPOS_TEST_TOKENIZER"],
            group_size=2,
            use_wandb=False,
            wandb_name="counting_atropos",  # sent as desired_name; atroposlib's own run-api also needs it set
            max_token_length=64,
            total_steps=1000,
            batch_size=4,
            steps_per_eval=10**6,
            ensure_scores_are_not_same=False,
            include_messages=False,
        )
        server = APIServerConfig(model_name="none", base_url="http://127.0.0.1:9/v1", api_key="x", health_check=False)
        return config, [server]

    async def setup(self):
        self.next_item = 0

    async def get_next_item(self):
        self.next_item += 1
        return self.next_item

    async def collect_trajectories(self, item):
        first = 20 + item % 200  # ids stay inside the shipped tokenizer's 269-token vocab
        tokens = [[first, 7, 100 + i] for i in range(2)]
        group = {
            "tokens": tokens,
            "masks": [[-100, 7, 100 + i] for i in range(2)],
            "scores": [1.0, -1.0],
        }
        # 600 more tokens make the body pass 1 KiB, so atroposlib gzips it
        group["tokens"] = [t + [5] * 600 for t in tokens]
        group["masks"] = [m + [5] * 600 for m in group["masks"]]
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    CountingAtroposEnv.cli()
