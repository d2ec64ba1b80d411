"""A reward even a random model gets, on long completions: 1 for an even number of characters.

The async loop's tests and `benchmarks/bench_async.py` train on it (`atropos train examples/count_env.py`):
completions run to their token budget, so weight pushes land mid-sequence and generation dominates the step.
"""

from atropos_cli.env.base import SimpleEnv


class CountEnv(SimpleEnv):
    """Reward 1 for an even number of characters: long completions, a signal even a random model gets."""

    name = "count"

    def items(self, split):
        i = 0
        while True:
            yield {"id": i, "q": str(i)}
            i += 1

    def prompt(self, item):
        return "Count to " + item["q"]

    def reward(self, completion, item):
        return float(len(completion) % 2 == 0)
