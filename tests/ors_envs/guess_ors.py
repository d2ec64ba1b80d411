"""ORS envs written in the `openreward` SDK's own style (what `orwd init` generates), for tests/test_ors.py and
the adapters' conformance battery: served by openreward's `Server` in its own venv (`ors:guess_ors`).

- `GuessEnv` (the default): guess a number from 1 to 9 in at most three tries. The answer is the model's plain
  message (the `@terminal` tool `guess`): right is reward 1 and the end, wrong is "higher"/"lower" (reward 0)
  and another try.
- `HintEnv`: the same, plus a tool the model may call, `hint`: whether the number is even (reward 0.1, once).
- `BrokenEnv`: its terminal tool raises (an env failing mid-episode).
"""

from openreward.environments import Environment, JSONObject, Server, Split, TextBlock, ToolOutput, terminal, tool
from pydantic import BaseModel

TASKS = {
    "train": [{"id": f"guess-{k}", "secret": (k * 4) % 9 + 1} for k in range(6)],
    "test": [{"id": f"exam-{k}", "secret": (k * 2) % 9 + 1} for k in range(3)],
}


class Guess(BaseModel):
    answer: str


class Empty(BaseModel):
    pass


class GuessEnv(Environment):
    def __init__(self, task_spec: JSONObject, secrets: dict[str, str] | None = None) -> None:
        super().__init__(task_spec)
        self.secret = int(task_spec["secret"])
        self.tries = 0

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train"), Split(name="test", type="test")]

    @classmethod
    def list_tasks(cls, split: str) -> list[JSONObject]:
        return TASKS[split]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text="Guess my number from 1 to 9. Reply with one digit.")]

    @terminal
    @tool
    async def guess(self, params: Guess) -> ToolOutput:
        """Your guess: one digit."""
        self.tries += 1
        digits = [c for c in params.answer if c.isdigit()]
        value = int(digits[0]) if digits else 0
        if value == self.secret:
            return ToolOutput(blocks=[TextBlock(text="right")], reward=1.0, finished=True)
        text = "higher" if value < self.secret else "lower"
        return ToolOutput(blocks=[TextBlock(text=text)], reward=0.0, finished=self.tries >= 3)


class HintEnv(GuessEnv):
    hinted = False

    @tool
    async def hint(self, params: Empty) -> ToolOutput:
        """Say whether the number is even."""
        reward = 0.0 if self.hinted else 0.1
        self.hinted = True
        return ToolOutput(blocks=[TextBlock(text="even" if self.secret % 2 == 0 else "odd")], reward=reward)


class BrokenEnv(GuessEnv):
    @terminal
    @tool
    async def guess(self, params: Guess) -> ToolOutput:
        """Your guess (this env fails)."""
        raise RuntimeError("failed on purpose")


if __name__ == "__main__":
    Server([GuessEnv, HintEnv, BrokenEnv]).run()
