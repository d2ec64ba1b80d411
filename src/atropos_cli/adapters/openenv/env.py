"""`openenv:URL` / `openenv:PACKAGE`: an OpenEnv env server as one of our envs (`load_openenv_env(target)`).

An `EpisodeEnv` (adapters/episodes: the items, the group record, step rewards in meta), with OpenEnv's own
turn loop. An item is one episode; its seed is the episode's index (train: 0, 1, 2, ...; eval:
`eval_episodes` of them, `split="eval"` in the reset), so `atropos export openenv` servers replay item k for
seed k. Each rollout of a group opens its own session (`/ws`; at most `max_sessions` at once), resets with the
item's seed, and plays: the observation becomes chat messages (`wire.observation_messages`: a chat the env
sends is kept as a chat), the model replies, the reply text is the action's text field, and `step` answers
with a reward, `done` and the next observation, until `done` or `max_turns` replies. The score is the episode
return (the sum of the step rewards, a missing reward counts 0).

Tokens are exact across turns (`TokenTrace`: the model's own token ids, masked bridges), so the groups train.
The first turn of a group is one request for all `group_size` replies (as a SimpleEnv asks), shared by the
rollouts whose reset observation is the same; it is seeded by the run seed, the item's seed and the item id
the server reports (`metadata.item_id`, which `atropos export openenv` sends), so an exported env read back
here samples what it samples when run directly. A session that fails (the server's error, a dropped socket)
is that rollout's failure record; the group keeps the others.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.adapters.episodes import EpisodeConfig, Played
from atropos_cli.adapters.openenv.local import LocalServer, is_url
from atropos_cli.adapters.openenv.wire import (
    OpenEnvSession,
    StepResult,
    fetch_schema,
    observation_messages,
    pick_action_field,
)
from atropos_cli.adapters.served import Opening, ServedEpisodeEnv, chat_added
from atropos_cli.env.base import BaseEnv
from atropos_cli.env.multiturn import TokenTrace
from atropos_cli.types import Message

__all__ = ["OpenEnvConfig", "OpenEnvEnv", "load_openenv_env"]


class OpenEnvConfig(EpisodeConfig):
    """Options of an `openenv:` env (`--env.max_turns 4`, ...), beside the usual env fields."""

    action_field: str | None = Field(
        None, description="Action field that takes the model's text (default: the action's only string field)."
    )
    observation_field: str | None = Field(
        None,
        description="Observation field shown to the model (default: its messages, else prompt, else its only "
        "string field, else the observation as JSON).",
    )
    max_sessions: int = Field(
        1, ge=1, description="Episodes open at once on the server (OpenEnv's create_app allows 1 unless raised)."
    )
    timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for one reset/step answer.")
    python: str | None = Field(
        None, description="openenv:PACKAGE only: the Python that has the package (default $ATROPOS_OPENENV_PYTHON)."
    )
    startup_timeout_s: float = Field(120.0, gt=0, description="openenv:PACKAGE only: seconds for it to come up.")


class OpenEnvEnv(ServedEpisodeEnv):
    """An OpenEnv server's episodes as scored groups (made by `load_openenv_env`, which sets `target`)."""

    name: ClassVar[str] = "openenv"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "an OpenEnv env server (reset/step over its WebSocket API)"
    env_config_cls = OpenEnvConfig
    target: ClassVar[str] = ""

    @classmethod
    def config_init(cls) -> tuple[OpenEnvConfig, list[Any]]:
        return OpenEnvConfig(max_token_length=256), []

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Before any model loads: a URL serves an action schema we can fill; a package is installed."""
        if is_url(cls.target):
            pick_action_field(fetch_schema(cls.target, min(config.timeout_s, 30.0))["action"], config.action_field)
        else:
            LocalServer(cls.target, config.python).check()

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        """Seed = the episode's index in its split (what an exported env maps back to its item k)."""
        count = None if split == "train" else self.config.eval_episodes  # type: ignore[attr-defined]
        index = 0
        while count is None or index < count:
            yield {"id": f"{split}-{index}", "seed": index, "split": split}
            index += 1

    async def setup(self) -> None:
        config: OpenEnvConfig = self.config  # type: ignore[assignment]
        if is_url(self.target):
            self.base_url = self.target
        else:
            self._local = LocalServer(self.target, config.python)
            self.base_url = await asyncio.to_thread(self._local.start, config.startup_timeout_s)
        schema = await asyncio.to_thread(fetch_schema, self.base_url, config.timeout_s)
        self.action_field = pick_action_field(schema["action"], config.action_field)
        self._sessions = asyncio.Semaphore(config.max_sessions)
        await super().setup()

    async def play_rollout(self, item: dict[str, Any], index: int, opening: Opening) -> Played:
        """One episode on its own session: reset with the item's seed, then reply/step until done or max_turns."""
        config: OpenEnvConfig = self.config  # type: ignore[assignment]
        reset = {"seed": item["seed"], "episode_id": item["id"]}
        if item["split"] != "train":
            reset["split"] = item["split"]
        async with self._sessions, OpenEnvSession(self.base_url, config.timeout_s) as session:
            result = await session.reset(**reset)
            messages = self._first_messages(result)
            trace = TokenTrace(self.tokenizer) if self.tokenizer is not None else None
            if trace:
                trace.start(messages)
            played = Played(list(messages), [], False, trace, None)
            seeding = (item["seed"], result.metadata["item_id"]) if "item_id" in result.metadata else None
            choice = await self.opening_reply(opening, index, played, seeding, item["id"])
            while True:
                self.add_reply(played, choice)
                result = await session.step({self.action_field: choice.text})
                played.rewards.append(result.reward or 0.0)
                if result.done or len(played.rewards) >= config.max_turns:
                    played.truncated = not result.done
                    return played
                self._add_observation(played, result)
                choice = await self.next_reply(played, item["id"], index)

    def _first_messages(self, result: StepResult) -> list[Message]:
        shown = observation_messages(result.observation, self.config.observation_field)  # type: ignore[attr-defined]
        messages: list[Message] = [{"role": "user", "content": shown}] if isinstance(shown, str) else shown
        system = self.config.system_prompt  # type: ignore[attr-defined]
        if system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def _add_observation(self, played: Played, result: StepResult) -> None:
        """The env's answer as new messages: what a full chat adds after ours, else its text as a user turn."""
        shown = observation_messages(result.observation, self.config.observation_field)  # type: ignore[attr-defined]
        if isinstance(shown, str):
            self.add_messages(played, [{"role": "user", "content": shown}])
        else:
            self.add_messages(played, chat_added(played.messages, shown))


def load_openenv_env(target: str) -> type[BaseEnv]:
    """The env class of `openenv:TARGET` (TARGET: the server's http(s) URL, or an env package to start)."""
    if not target:
        from atropos_cli.errors import EnvNotFoundError

        raise EnvNotFoundError(
            "openenv: needs a target", hint="openenv:http://HOST:PORT (a running server) or openenv:PACKAGE"
        )
    if not is_url(target):
        from atropos_cli.adapters.openenv.local import app_path

        app_path(target)  # a bad package name fails here, before any config is read
    attrs: dict[str, Any] = {"target": target, "name": f"openenv:{target}", "__module__": __name__}
    return type("OpenEnv", (OpenEnvEnv,), attrs)
