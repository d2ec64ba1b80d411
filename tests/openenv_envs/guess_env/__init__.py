"""Guess the number: an OpenEnv env (multi-turn, text actions) used by atropos' tests."""

from .models import GuessAction, GuessObservation

__all__ = ["GuessAction", "GuessObservation"]
