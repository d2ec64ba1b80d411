"""Two text games written as Gymnasium envs, in Gymnasium's own style, for `atropos process gym:...`.

Importing this module registers them (`gymnasium.register`), so `gym:gym_text_games:TextGames/Arithmetic-v0`
(module:ID: gymnasium imports the module first) runs them with PYTHONPATH=examples, or with the file beside you:

- `TextGames/Arithmetic-v0`: one question ("What is 3 + 4?"), one answer; reward 1 for the right number.
- `TextGames/GuessNumber-v0`: find a secret number in 1..max_number; after each guess the env answers
  "higher" or "lower"; reward 1 on the right guess, -0.1 for an invalid reply; 6 guesses at most (TimeLimit).
"""

from __future__ import annotations

import re
import string

import gymnasium as gym
from gymnasium import spaces

_INT = re.compile(r"-?\d+")
CHARSET = string.printable


def last_int(text: str) -> int | None:
    found = _INT.findall(text)
    return int(found[-1]) if found else None


class ArithmeticEnv(gym.Env[str, str]):
    metadata = {"render_modes": []}

    def __init__(self, max_operand: int = 30) -> None:
        self.max_operand = max_operand
        self.observation_space = spaces.Text(max_length=64, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=4096, min_length=0, charset=CHARSET)
        self.answer = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        a, b = (int(x) for x in self.np_random.integers(0, self.max_operand + 1, size=2))
        op = str(self.np_random.choice(["+", "-"]))
        self.answer = a + b if op == "+" else a - b
        return f"What is {a} {op} {b}?", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        correct = last_int(action) == self.answer
        return "", 1.0 if correct else 0.0, True, False, {"answer": self.answer}


class GuessNumberEnv(gym.Env[str, str]):
    metadata = {"render_modes": []}

    def __init__(self, max_number: int = 16) -> None:
        self.max_number = max_number
        self.observation_space = spaces.Text(max_length=128, min_length=0, charset=CHARSET)
        self.action_space = spaces.Text(max_length=4096, min_length=0, charset=CHARSET)
        self.secret = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        self.secret = int(self.np_random.integers(1, self.max_number + 1))
        return f"I picked a number from 1 to {self.max_number}. Guess it: answer with one number.", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        guess = last_int(action)
        if guess is None:
            return "That is not a number. Guess again.", -0.1, False, False, {}
        if guess == self.secret:
            return "Correct!", 1.0, True, False, {}
        hint = "higher" if guess < self.secret else "lower"
        return f"{guess} is wrong: the number is {hint}. Guess again.", 0.0, False, False, {}


gym.register(id="TextGames/Arithmetic-v0", entry_point=ArithmeticEnv)
gym.register(id="TextGames/GuessNumber-v0", entry_point=GuessNumberEnv, max_episode_steps=6)
