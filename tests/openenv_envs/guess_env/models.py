"""Action and observation of the guess env, as OpenEnv models."""

from openenv.core.env_server.types import Action, Observation
from pydantic import Field


class GuessAction(Action):
    guess: str = Field(..., description="The player's reply; its last integer is the guess")


class GuessObservation(Observation):
    prompt: str = Field(default="", description="What the player is told")
    attempts_left: int = Field(default=0, description="Guesses left in this episode")
