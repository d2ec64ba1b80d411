"""`gym:ID`: a Gymnasium (1.x) env whose observations and actions are text, played by our model.

`ID` is what `gymnasium.make` takes: a registered id (`TextGames/GuessNumber-v0`) or `module:ID`, which
imports `module` first so its `gymnasium.register(...)` calls run (`gym:my_games:Wordle-v0`). Both spaces must
be `gymnasium.spaces.Text`: the observation is the user's message, the model's whole reply is the action
(the env parses it). Each rollout makes its own env (`gymnasium.make(ID, **--env.make_kwargs)`) and resets it
with the item's seed; the turn loop, tokens and scores are `adapters.episodes`' (return = sum of rewards).

Not supported: non-text spaces (Box, Discrete, Dict...: say so before any model loads), vector envs,
`render()`, and an env's own `info` (kept out of the record).
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.adapters.episodes import Episode, EpisodeConfig, EpisodeEnv, Step
from atropos_cli.env.base import BaseEnv
from atropos_cli.errors import ConfigError, EnvLoadError, EnvNotFoundError

__all__ = ["CONFIG", "GymConfig", "GymTextEnv", "load_env_class"]

INSTALL_HINT = "install Gymnasium beside atropos: pip install 'gymnasium>=1,<2'"


class GymConfig(EpisodeConfig):
    make_kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments of gymnasium.make, as JSON ('{\"max_number\": 50}')."
    )


CONFIG = GymConfig


def _gymnasium() -> Any:
    try:
        import gymnasium
    except ImportError:
        raise EnvLoadError("the gym: adapter needs the gymnasium package", hint=INSTALL_HINT) from None
    return gymnasium


def _make(env_id: str, kwargs: dict[str, Any]) -> Any:
    """`gymnasium.make` with its errors as one line (a bad id, a module that fails, a constructor that raises)."""
    gymnasium = _gymnasium()
    try:
        return gymnasium.make(env_id, **kwargs)
    except gymnasium.error.Error as exc:  # NameNotFound, VersionNotFound, NamespaceNotFound, ...
        close = difflib.get_close_matches(env_id.rpartition(":")[2], list(gymnasium.registry), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise EnvNotFoundError(
            f"gym:{env_id}: {exc}",
            hint=hint + "an env registers with gymnasium.register; name its module to import it: gym:MODULE:ID",
        ) from None
    except ModuleNotFoundError as exc:
        raise EnvNotFoundError(f"gym:{env_id}: no module named {exc.name!r}", hint="check the module:ID") from None
    except Exception as exc:
        raise EnvLoadError(
            f"gym:{env_id}: gymnasium.make failed: {type(exc).__name__}: {exc}", hint="check --env.make_kwargs"
        ) from None


def check_text_spaces(env: Any, env_id: str) -> None:
    from gymnasium.spaces import Text

    for what in ("observation", "action"):
        space = getattr(env, f"{what}_space")
        if not isinstance(space, Text):
            raise ConfigError(
                f"gym:{env_id} has {type(space).__name__} {what}s, not text",
                hint="the gym: adapter runs envs whose observation and action spaces are gymnasium.spaces.Text",
            )


class GymEpisode:
    """One gymnasium env instance played as one episode (the env's calls are synchronous and fast)."""

    def __init__(self, env: Any, seed: int) -> None:
        self.env, self.seed = env, seed

    async def reset(self) -> str:
        observation, _info = self.env.reset(seed=self.seed)
        return observation  # type: ignore[no-any-return]

    async def step(self, action: str) -> Step:
        observation, reward, terminated, truncated, _info = self.env.step(action)
        return Step(observation, float(reward), bool(terminated or truncated))

    async def close(self) -> None:
        self.env.close()


class GymTextEnv(EpisodeEnv):
    gym_id: ClassVar[str] = ""
    env_config_cls = GymConfig

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Make the env once (no model loaded yet): a bad id, kwargs or non-text spaces fail here, in seconds."""
        env = _make(cls.gym_id, config.make_kwargs)
        try:
            check_text_spaces(env, cls.gym_id)
        finally:
            env.close()

    async def open_episode(self, item: dict[str, Any]) -> Episode:
        return GymEpisode(_make(self.gym_id, self.config.make_kwargs), item["seed"])  # type: ignore[attr-defined]


def load_env_class(target: str) -> type[BaseEnv]:
    gymnasium = _gymnasium()
    module, _, env_id = target.rpartition(":")
    if module:
        import importlib

        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise EnvNotFoundError(
                f"gym:{target}: cannot import {module!r}: {exc}", hint="check the module:ID"
            ) from None
    if env_id not in gymnasium.registry:
        _make(target, {}).close()  # raises gymnasium's own "not found" with our hint
    description = f"Gymnasium env {env_id} (text observations and actions)"
    attrs = {"name": f"gym:{target}", "description": description, "gym_id": target, "__module__": __name__}
    return type(f"Gym_{env_id.replace('/', '_').replace('-', '_')}", (GymTextEnv,), attrs)
