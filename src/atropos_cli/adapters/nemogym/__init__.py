"""`nemogym:DIR`, `nemogym:NAME`, `nemogym:URL`: NeMo Gym resources servers as our envs (the `nemogym` prefix of
ADAPTERS).

`wire` speaks NeMo Gym's protocol (task rows, the Responses API items verify reads, one session's seed / tool
calls / verify), `server` finds a resources server folder and starts it on 127.0.0.1 as NeMo Gym's launcher
does, `env` is the env class whose rollouts play NeMo Gym's simple-agent loop through our inference router.
nemo-gym itself is never imported here: the server runs with the Python that has it (its own venv).
"""

from atropos_cli.adapters.nemogym.env import NemoGymConfig, load_nemogym_env

__all__ = ["CONFIG", "load_env_class"]

CONFIG = NemoGymConfig
load_env_class = load_nemogym_env
