"""`harness:PROGRAM`: an agent program as the policy, its model calls recorded token by token by a proxy.

- `session`: one rollout's calls as token-exact segments, the drift between them, trainable rows;
- `proxy`: the OpenAI-compatible endpoint per session in front of the policy's backend (`atropos proxy`);
- `env`: the env whose rollouts run the program against the proxy and score it (`process`, `serve`, `train`).

The adapter contract (`CONFIG`, `load_env_class`) is the one of every `adapters` module; docs/envs-harness.md
is the user's page.
"""

from __future__ import annotations

from pathlib import Path

from atropos_cli.adapters.harness.env import HarnessConfig, HarnessEnv, check_program
from atropos_cli.env.base import BaseEnv
from atropos_cli.errors import ConfigError, EnvNotFoundError

__all__ = ["CONFIG", "HarnessEnv", "load_env_class"]

CONFIG = HarnessConfig


def load_env_class(target: str) -> type[BaseEnv]:
    """The env of `harness:PROGRAM` (a .py file runs with this Python; anything else must be executable)."""
    try:
        check_program(target, "harness")
    except ConfigError as exc:
        raise EnvNotFoundError(f"harness:{target}: {exc.message}", hint=exc.hint) from None
    stem = Path(target).stem
    attrs = {"name": f"harness:{stem}", "program": str(Path(target).expanduser().resolve()), "__module__": __name__}
    attrs["description"] = f"the agent program {target} as the policy, through the recording proxy"
    return type(f"Harness_{stem}", (HarnessEnv,), attrs)
