"""A whole env in a few lines: `atropos process examples/parity_env.py --num-groups 8` (docs/envs.md)."""

import random

from atropos_cli import SimpleEnv


class Parity(SimpleEnv):
    name = "parity"
    description = "say whether a number is even or odd; reward 1 when right"

    def items(self, split):
        rng = random.Random(f"{self.config.seed}:{split}")
        for index in range(10_000 if split == "train" else 100):
            yield {"id": f"{split}-{index}", "n": rng.randint(0, 999)}

    def prompt(self, item):
        return f"Is {item['n']} even or odd? Answer with one word."

    def reward(self, completion, item):
        want = "even" if item["n"] % 2 == 0 else "odd"
        return {"score": float(want in completion.lower()), "short": float(len(completion) < 10)}
