"""`ors:URL` and `ors:MODULE`: Open Reward Standard env servers as our envs (the `ors` prefix of ADAPTERS).

`wire` speaks ORS (HTTP + server-sent events: splits, tasks, sessions, tool calls with rewards), `local` serves
an ORS env module with openreward's own `Server` on 127.0.0.1, `env` is the env class whose rollouts play tasks
through our inference router. openreward itself is never imported here: the server side runs wherever it is
installed (its own venv, another host). The other direction, any env of ours as an ORS server, is
`atropos export ors` (runs/ors_app).
"""

from atropos_cli.adapters.ors.env import OrsConfig, load_ors_env

__all__ = ["CONFIG", "load_env_class"]

CONFIG = OrsConfig
load_env_class = load_ors_env
