from vf_guess_user.env import GuessEnv
from vf_guess_user.taskset import GuessTaskset

__all__ = ["GuessEnv", "GuessTaskset"]
