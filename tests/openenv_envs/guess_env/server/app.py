"""The guess env's FastAPI app (OpenEnv's create_app), served with `uvicorn guess_env.server.app:app`."""

from openenv.core.env_server.http_server import create_app

from ..models import GuessAction, GuessObservation
from .guess_env_environment import GuessEnvironment

app = create_app(GuessEnvironment, GuessAction, GuessObservation, env_name="guess_env", max_concurrent_envs=8)
