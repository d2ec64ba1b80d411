"""atropos: rollouts, scored datasets and a GRPO loop for RL with LLMs, offline-first.

The public record is `ScoredGroup`; environments subclass `BaseEnv` or `SimpleEnv`.
Heavy stacks (torch, transformers, datasets, vllm) are imported only by the commands that need them; the
names below load on first use (PEP 562), so `import atropos_cli.cli.app` (and `atropos --help`) stays cheap.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from atropos_cli.config import EnvConfig, ServerConfig
    from atropos_cli.env.base import BaseEnv, SimpleEnv
    from atropos_cli.errors import AtroposError
    from atropos_cli.inference.base import Generation, SamplingParams
    from atropos_cli.types import RolloutFailure, ScoredGroup

__version__ = "0.1.0"

__all__ = [
    "AtroposError",
    "BaseEnv",
    "EnvConfig",
    "Generation",
    "RolloutFailure",
    "SamplingParams",
    "ScoredGroup",
    "ServerConfig",
    "SimpleEnv",
    "__version__",
]

# Where each public name lives; imported on first attribute access.
_LAZY = {
    "AtroposError": "atropos_cli.errors",
    "BaseEnv": "atropos_cli.env.base",
    "EnvConfig": "atropos_cli.config",
    "Generation": "atropos_cli.inference.base",
    "RolloutFailure": "atropos_cli.types",
    "SamplingParams": "atropos_cli.inference.base",
    "ScoredGroup": "atropos_cli.types",
    "ServerConfig": "atropos_cli.config",
    "SimpleEnv": "atropos_cli.env.base",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'atropos_cli' has no attribute {name!r}")
