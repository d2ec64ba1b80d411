"""atroposlib.envs.reward_fns: reward functions env files create by name (`registry.create(...)`), with
atroposlib 0.4.0's names, parameters and scores: accuracy, format, r1 (+ formatreasoning, accuracyx),
reasoning_steps, repetition_penalty, crossword_format, cascading_r1_math, cosine_scaled, chandas_meter, and
`CombinedReward`. accuracy and cascading_r1_math need math-verify; cosine_scaled needs torch, transformers and
scipy (and its embedding model); chandas_meter scores 0.0 without the `chandas` package, as atroposlib's does.
"""

from atropos_cli.compat.atroposlib.envs.reward_fns.combined_reward import CombinedReward
from atropos_cli.compat.atroposlib.envs.reward_fns.registry import registry
from atropos_cli.compat.atroposlib.envs.reward_fns.reward_function import RewardFunction

__all__ = ["RewardFunction", "registry", "CombinedReward"]
