"""Reset/step envs (Gymnasium, OpenEnv, ...) as our env: the model plays episodes of text observations and
text actions, and a group is `group_size` episodes of the same seeded start.

An adapter subclasses `EpisodeEnv` and implements `open_episode(item)`: an `Episode` with `reset()` (the first
observation) and `step(action)` (a `Step`: next observation, reward, done). The rest is shared:

- items: `{"id": "train-3", "seed": N}`, N derived from (`--env.seed`, split, index), so the same seed gives
  the same episode starts, and every rollout of a group starts from the same state (GRPO compares decisions);
- the turn loop: the observation is the user's message, the model's whole reply is the action, until the
  env says done or `--env.max_turns` replies were given (then the episode is truncated);
- tokens: `TokenTrace` turn by turn, the next prompt sent as token ids (`server.completion(prompt=ids)`), so
  the trained tokens are exactly the ones the backend sampled; without a tokenizer the episode runs over chat
  and the group has messages and scores only (`meta.tokens_missing`);
- scores: the episode return (sum of step rewards); reward parts `return`, `turns`, `truncated`; each rollout's
  `meta.rollouts[i].step_rewards` lists the per-step rewards;
- an env that raises (reset, step, a non-text observation) fails that rollout only: a failure record, never a
  crash; the group keeps the others.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from pydantic import Field

from atropos_cli.config import QUICK_GROUPS, EnvConfig
from atropos_cli.env.multiturn import MultiTurnEnv, TokenTrace
from atropos_cli.types import Message, RolloutMeta, ScoredGroup

__all__ = ["EpisodeConfig", "EpisodeEnv", "Episode", "Step", "episode_seed", "turn_seed"]


class EpisodeConfig(EnvConfig):
    total_steps: int = Field(QUICK_GROUPS, ge=1, description="Episodes (groups) a run collects (atropos process).")
    max_turns: int = Field(8, ge=1, description="Model replies per episode; the episode is truncated after them.")
    system_prompt: str | None = Field(None, description="A system message before the first observation.")
    eval_episodes: int = Field(20, ge=1, description="Episodes of the eval split (atropos evaluate).")


@dataclass
class Step:
    observation: str | None
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Episode(Protocol):
    async def reset(self) -> str: ...

    async def step(self, action: str) -> Step: ...

    async def close(self) -> None: ...


@dataclass
class Played:
    messages: list[Message]
    rewards: list[float]
    truncated: bool
    trace: TokenTrace | None
    finish_reason: str | None
    calls: list[str] = field(default_factory=list)  # the tool of each reward, where rewards come from tool calls


def episode_seed(seed: int, split: str, index: int) -> int:
    """A stable 31-bit seed of (run seed, split, index) (not Python's salted hash)."""
    import hashlib

    digest = hashlib.sha256(f"{seed}:{split}:{index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


def turn_seed(run_seed: int, item_id: str, rollout: int, turn: int) -> int:
    """The sampling seed of one rollout's turn (a stable hash, not Python's salted one): rollouts that run at
    once answer in any order, so a shared seed stream would hand out seeds in that order."""
    import hashlib

    digest = hashlib.blake2b(f"{run_seed}:{item_id}:{rollout}:{turn}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFF


def text_observation(value: Any, where: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{where} returned a {type(value).__name__} observation, not text")
    return value


class EpisodeEnv(MultiTurnEnv):
    """The shared turn loop of reset/step envs; subclasses implement `open_episode`."""

    env_config_cls = EpisodeConfig

    async def open_episode(self, item: dict[str, Any]) -> Episode:
        raise NotImplementedError(f"{type(self).__name__} must implement open_episode(item)")

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        count = None if split == "train" else self.config.eval_episodes  # type: ignore[attr-defined]
        index = 0
        while count is None or index < count:
            yield {"id": f"{split}-{index}", "seed": episode_seed(self.config.seed, split, index)}
            index += 1

    async def play(self, item: dict[str, Any]) -> Played:
        """One episode: alternate model replies (actions) and env observations until done or max_turns."""
        episode = await self.open_episode(item)
        try:
            return await self._play(episode)
        finally:
            await episode.close()

    async def _play(self, episode: Episode) -> Played:
        config: EpisodeConfig = self.config  # type: ignore[assignment]
        first = text_observation(await episode.reset(), "reset()")
        messages: list[Message] = [{"role": "system", "content": config.system_prompt}] if config.system_prompt else []
        messages.append({"role": "user", "content": first})
        trace = TokenTrace(self.tokenizer) if self.tokenizer is not None else None
        prompt_ids = trace.start(messages) if trace else None
        rewards: list[float] = []
        while True:
            choice = await self.reply(messages, prompt_ids)
            if trace:
                trace.add_reply(choice.text, choice.token_ids, choice.logprobs, choice.finish_reason)
            messages.append({"role": "assistant", "content": choice.text})
            step = await episode.step(choice.text)
            rewards.append(float(step.reward))
            if step.done or len(rewards) >= config.max_turns:
                return Played(messages, rewards, not step.done, trace, choice.finish_reason)
            observation = {"role": "user", "content": text_observation(step.observation, "step()")}
            messages.append(observation)
            prompt_ids = trace.add_messages([observation]) if trace else None

    def group(self, item: dict[str, Any], played: list[Played], elapsed: float) -> ScoredGroup:
        rollouts = [
            RolloutMeta(finish_reason=p.finish_reason, reward_parts=_parts(p), step_rewards=p.rewards) for p in played
        ]
        traces = [p.trace for p in played]
        scores = [sum(p.rewards) for p in played]
        return self.traced_group(
            item["id"], traces, scores, [p.messages for p in played], rollouts, elapsed, episode_seed=item["seed"]
        )


def _parts(played: Played) -> dict[str, float]:
    return {"return": sum(played.rewards), "turns": float(len(played.rewards)), "truncated": float(played.truncated)}
