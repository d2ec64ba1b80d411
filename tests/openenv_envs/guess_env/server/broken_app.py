"""The guess env whose every step raises (the adapters' conformance battery: an env error is a failure record)."""

from openenv.core.env_server.http_server import create_app

from ..models import GuessAction, GuessObservation
from .guess_env_environment import GuessEnvironment


class BrokenGuessEnvironment(GuessEnvironment):
    def step(self, action: GuessAction) -> GuessObservation:  # type: ignore[override]
        raise RuntimeError("the guess env failed on purpose")


app = create_app(
    BrokenGuessEnvironment, GuessAction, GuessObservation, env_name="guess_env_broken", max_concurrent_envs=8
)
