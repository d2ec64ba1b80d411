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
import json
import time
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.adapters.episodes import EpisodeConfig, EpisodeEnv, Played, turn_seed
from atropos_cli.adapters.openenv.local import LocalServer, is_url
from atropos_cli.adapters.openenv.wire import (
    OpenEnvSession,
    StepResult,
    fetch_schema,
    observation_messages,
    pick_action_field,
)
from atropos_cli.env.base import BaseEnv
from atropos_cli.env.multiturn import TokenTrace, gather_rollouts
from atropos_cli.inference.base import Choice, seeded_requests
from atropos_cli.types import Message, ScoredGroup

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


@dataclass
class Opening:
    """The group's first-turn request: one call for every rollout, shared by those with the same first prompt."""

    size: int
    key: Any = None
    task: asyncio.Task[list[Choice]] | None = None
    taken: set[int] = field(default_factory=set)


class OpenEnvEnv(EpisodeEnv):
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

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredGroup | None, list[Any]]:
        started = time.perf_counter()
        opening = Opening(self.config.group_size)
        plays = (self.play_rollout(item, i, opening) for i in range(self.config.group_size))
        played = await gather_rollouts(self.name, item["id"], plays)
        if not played:
            return None, []
        return self.group(item, played, time.perf_counter() - started), []

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
            choice = await self._opening_reply(opening, index, played, seeding, item["id"])
            while True:
                self._add_reply(played, choice)
                result = await session.step({self.action_field: choice.text})
                played.rewards.append(result.reward or 0.0)
                if result.done or len(played.rewards) >= config.max_turns:
                    played.truncated = not result.done
                    return played
                self._add_observation(played, result)
                seed = turn_seed(self.config.seed, item["id"], index, len(played.rewards))
                choice = (await self._sample(played, 1, seed))[0]

    async def _opening_reply(
        self, opening: Opening, index: int, played: Played, seeding: tuple[int, Any] | None, item_id: str
    ) -> Choice:
        """Reply `index` of the group's shared first request when this rollout's first prompt is the shared one
        (a rollout whose reset differs samples its own)."""
        key = (played.trace.prompt_ids() if played.trace else None, json.dumps(played.messages, sort_keys=True))
        if opening.task is None:
            opening.key = key
            opening.task = asyncio.ensure_future(self._first_request(played, opening.size, seeding))
        if opening.key == key and index not in opening.taken:
            opening.taken.add(index)
            return (await opening.task)[index]
        return (await self._sample(played, 1, turn_seed(self.config.seed, item_id, index, 0)))[0]

    async def _first_request(self, played: Played, n: int, seeding: tuple[int, Any] | None) -> list[Choice]:
        """The group's one opening request, seeded like the first request of a direct run of the item."""
        with seeded_requests(self.config.seed, f"{seeding[0]}:{seeding[1]}") if seeding else nullcontext():
            return await self._sample(played, n, None)

    async def _sample(self, played: Played, n: int, seed: int | None) -> list[Choice]:
        return await self.sample(played.messages, played.trace.prompt_ids() if played.trace else None, n, seed)

    def _first_messages(self, result: StepResult) -> list[Message]:
        shown = observation_messages(result.observation, self.config.observation_field)  # type: ignore[attr-defined]
        messages: list[Message] = [{"role": "user", "content": shown}] if isinstance(shown, str) else shown
        system = self.config.system_prompt  # type: ignore[attr-defined]
        if system and not any(m["role"] == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": system})
        return messages

    def _add_reply(self, played: Played, choice: Choice) -> None:
        if played.trace:
            played.trace.add_reply(choice.text, choice.token_ids, choice.logprobs, choice.finish_reason)
        played.messages.append({"role": "assistant", "content": choice.text})
        played.finish_reason = choice.finish_reason

    def _add_observation(self, played: Played, result: StepResult) -> None:
        """The env's answer as new messages: what a full chat adds after ours, else its text as a user turn."""
        shown = observation_messages(result.observation, self.config.observation_field)  # type: ignore[attr-defined]
        if isinstance(shown, str):
            new: list[Message] = [{"role": "user", "content": shown}]
        elif shown[: len(played.messages)] == played.messages:
            new = shown[len(played.messages) :]
        else:
            last = max((i for i, m in enumerate(shown) if m["role"] == "assistant"), default=-1)
            new = shown[last + 1 :]
        if played.trace:
            played.trace.add_messages(new)
        played.messages.extend(new)


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
