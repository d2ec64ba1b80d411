"""atropos: rollouts, scored datasets and a GRPO loop for RL with LLMs, offline-first.

The public record is `ScoredGroup`; environments subclass `BaseEnv` or `SimpleEnv`.
Heavy stacks (torch, transformers, datasets, vllm) are imported only by the commands that need them.
"""

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
