"""vf_reverse_text: a verifiers (v1) taskset in verifiers' own style: reverse a short word. Rewards: `exact`
(the reply is the reversed word) and `overlap` (weight 0.5: the share of characters in the right place);
metric `length_ratio`. Run it with `atropos process vf:vf_reverse_text` (PYTHONPATH=examples/verifiers)."""

import random

import verifiers.v1 as vf

WORDS = ["atropos", "verifier", "gradient", "token", "reward", "policy", "sample", "rollout", "trainer", "model"]


class ReverseData(vf.TaskData):
    """One word to reverse."""

    word: str


class ReverseTask(vf.Task[ReverseData]):
    def _reply(self, trace: vf.Trace) -> str:
        return trace.last_reply.strip()

    @vf.reward(weight=1.0)
    async def exact(self, trace: vf.Trace) -> float:
        return 1.0 if self._reply(trace) == self.data.word[::-1] else 0.0

    @vf.reward(weight=0.5)
    async def overlap(self, trace: vf.Trace) -> float:
        target, reply = self.data.word[::-1], self._reply(trace)
        return sum(a == b for a, b in zip(target, reply, strict=False)) / len(target)

    @vf.metric
    async def length_ratio(self, trace: vf.Trace) -> float:
        return len(self._reply(trace)) / len(self.data.word)


class ReverseTextConfig(vf.TasksetConfig):
    num_tasks: int = 20
    """How many words to ask for."""


class ReverseTextTaskset(vf.Taskset[ReverseTask, ReverseTextConfig]):
    def load(self) -> list[ReverseTask]:
        rng = random.Random(0)
        return [
            ReverseTask(ReverseData(prompt=f"Reverse the word: {word}", word=word), self.config.task)
            for word in (rng.choice(WORDS) for _ in range(self.config.num_tasks))
        ]
