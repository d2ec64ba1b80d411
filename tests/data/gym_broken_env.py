"""A Gymnasium text env whose step() raises (the adapters' conformance battery: an env error is a failure
record, never a crash). Registered on import as `Broken/RaiseOnStep-v0`."""

from __future__ import annotations

import string

import gymnasium as gym
from gymnasium import spaces


class RaiseOnStepEnv(gym.Env[str, str]):
    def __init__(self) -> None:
        self.observation_space = spaces.Text(max_length=64, min_length=0, charset=string.printable)
        self.action_space = spaces.Text(max_length=4096, min_length=0, charset=string.printable)

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[str, dict]:
        super().reset(seed=seed)
        return "Say anything", {}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict]:
        raise RuntimeError("the broken env's step() failed on purpose")


gym.register(id="Broken/RaiseOnStep-v0", entry_point=RaiseOnStepEnv)
