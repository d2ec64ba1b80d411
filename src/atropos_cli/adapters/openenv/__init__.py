"""`openenv:URL` and `openenv:PACKAGE`: OpenEnv env servers as our envs (the `openenv` prefix of ADAPTERS).

`wire` speaks OpenEnv's protocol (WebSocket sessions, `/schema`), `local` starts an env package's server on
127.0.0.1, `env` is the env class whose rollouts play episodes through our inference router. openenv itself is
never imported here: the server side runs wherever openenv is installed (its own venv, another host).
The other direction, any env of ours as an OpenEnv server, is `atropos export openenv` (runs/openenv_export).
"""

from atropos_cli.adapters.openenv.env import OpenEnvConfig, load_openenv_env

__all__ = ["CONFIG", "load_env_class"]

CONFIG = OpenEnvConfig
load_env_class = load_openenv_env
