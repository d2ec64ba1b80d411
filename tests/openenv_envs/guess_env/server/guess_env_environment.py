"""Guess a number from 1 to 9 in at most 3 tries: "higher"/"lower" after each wrong guess.

Reward 1.0 on the step that guesses right (the episode ends), 0.0 otherwise; the episode also ends after the
third guess. The secret comes from the reset seed. For failure tests, the seeds listed in the environment
variable GUESS_ENV_FAIL_SEEDS (comma-separated) make reset raise.
"""

import os
import random
import re
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import State

from ..models import GuessAction, GuessObservation

MAX_GUESSES = 3


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS: bool = True

    def __init__(self):
        self._state = State(episode_id=str(uuid4()), step_count=0)
        self._secret = 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        failing = {int(s) for s in os.environ.get("GUESS_ENV_FAIL_SEEDS", "").split(",") if s.strip()}
        if seed in failing:
            raise RuntimeError(f"seed {seed} is configured to fail")
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self._secret = random.Random(seed).randint(1, 9)
        return GuessObservation(
            prompt=f"I picked a number from 1 to 9. You have {MAX_GUESSES} guesses. Reply with one number.",
            attempts_left=MAX_GUESSES,
            done=False,
            reward=0.0,
        )

    def step(self, action: GuessAction) -> GuessObservation:  # type: ignore[override]
        self._state.step_count += 1
        numbers = re.findall(r"-?\d+", action.guess)
        left = MAX_GUESSES - self._state.step_count
        if numbers and int(numbers[-1]) == self._secret:
            return GuessObservation(prompt="Correct!", attempts_left=left, done=True, reward=1.0)
        hint = "That is not a number." if not numbers else "Higher." if int(numbers[-1]) < self._secret else "Lower."
        return GuessObservation(prompt=f"{hint} Guess again.", attempts_left=left, done=left <= 0, reward=0.0)

    @property
    def state(self) -> State:
        return self._state
