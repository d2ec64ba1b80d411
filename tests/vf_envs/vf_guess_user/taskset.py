"""vf_guess_user's taskset: guess a secret number. Reward `solved` (some guess was the secret); metric `guesses`."""

import re

import verifiers.v1 as vf

SECRETS = [3, 7, 5, 9]


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward(weight=1.0)
    async def solved(self, trace: vf.Trace) -> float:
        guesses = [guess(m.content or "") for m in trace.assistant_messages]
        return 1.0 if self.data.secret in guesses else 0.0

    @vf.metric
    async def guesses(self, trace: vf.Trace) -> float:
        return float(len(trace.assistant_messages))


def guess(text: str) -> int | None:
    found = re.findall(r"-?\d+", text)
    return int(found[-1]) if found else None


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self) -> list[GuessTask]:
        return [
            GuessTask(GuessData(prompt="I think of a number from 1 to 9. Guess it.", secret=s), self.config.task)
            for s in SECRETS
        ]
