"""`openenv:URL` / `openenv:PACKAGE`: an OpenEnv env server as one of our envs (`load_openenv_env(target)`).

An item is one episode seed (train: 0, 1, 2, ...; eval: `eval_size` seeds with `split="eval"` in the reset).
Each rollout of a group opens its own session (`/ws`), resets with the item's seed, and plays: the observation
becomes chat messages (`wire.observation_messages`), the model replies, the reply text is the action's
text field, and `step` answers with a reward, `done` and the next observation, until `done` or `max_turns`
replies. The rollout's score is the episode return (the sum of the step rewards, a missing reward counts 0);
the step rewards, turns and truncation are in the group's `meta.rollouts`.

Tokens are exact across turns (`TokenTrace`: the model's own token ids, masked bridges), so the groups train.
The first turn of a group is one request for all `group_size` replies (as a SimpleEnv asks), shared by the
rollouts whose reset observation is the same; it is seeded by the run seed, the item's seed and the episode id
the server reports (`metadata.item_id`, which `atropos export openenv` sends), so an exported env read back
here samples what it samples when run directly. A session that fails (the server's error, a dropped socket)
is that rollout's failure record; the group keeps the others.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.adapters.openenv.local import LocalServer, is_url
from atropos_cli.adapters.openenv.wire import (
    OpenEnvSession,
    StepResult,
    fetch_schema,
    observation_messages,
    pick_action_field,
)
from atropos_cli.config import EnvConfig
from atropos_cli.env.base import BaseEnv, record_failure
from atropos_cli.env.multiturn import TokenTrace
from atropos_cli.errors import ServerUnreachableError
from atropos_cli.inference.base import Choice, seeded_requests
from atropos_cli.types import GroupMeta, Message, RolloutMeta, ScoredGroup

__all__ = ["OpenEnvConfig", "OpenEnvEnv", "load_openenv_env"]


class OpenEnvConfig(EnvConfig):
    """Options of an `openenv:` env (`--env.max_turns 4`, ...), beside the usual env fields."""

    max_turns: int = Field(8, ge=1, description="Model replies per episode before it is cut (truncated).")
    action_field: str | None = Field(
        None, description="Action field that takes the model's text (default: the action's only string field)."
    )
    observation_field: str | None = Field(
        None,
        description="Observation field shown to the model (default: its messages, else prompt, else its only "
        "string field, else the observation as JSON).",
    )
    system_prompt: str | None = Field(None, description="System message put before a text observation.")
    max_sessions: int = Field(
        1, ge=1, description="Episodes open at once on the server (OpenEnv's create_app allows 1 unless raised)."
    )
    eval_size: int = Field(100, ge=0, description="Episodes of the eval split (`atropos evaluate`).")
    timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for one reset/step answer.")
    python: str | None = Field(
        None, description="openenv:PACKAGE only: the Python that has the package (default $ATROPOS_OPENENV_PYTHON)."
    )
    startup_timeout_s: float = Field(120.0, gt=0, description="openenv:PACKAGE only: seconds for it to come up.")


@dataclass
class Played:
    messages: list[Message]
    rewards: list[float]
    trace: TokenTrace | None
    finish_reason: str | None
    truncated: bool
    remote_id: str | None = None


@dataclass
class Opening:
    """The group's first-turn request: one call for every rollout, shared by those with the same first prompt."""

    size: int
    key: Any = None
    task: asyncio.Task[list[Choice]] | None = None
    taken: set[int] = field(default_factory=set)


class OpenEnvEnv(BaseEnv):
    """An OpenEnv server's episodes as scored groups (made by `load_openenv_env`, which sets `target`)."""

    name: ClassVar[str] = "openenv"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "an OpenEnv env server (reset/step over its WebSocket API)"
    env_config_cls = OpenEnvConfig
    target: ClassVar[str] = ""

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return OpenEnvConfig(max_token_length=256), []

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        count = None if split == "train" else self.config.eval_size  # type: ignore[attr-defined]
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
        schema = await fetch_schema(self.base_url, config.timeout_s)
        self.action_field = pick_action_field(schema["action"], config.action_field)
        self._sessions = asyncio.Semaphore(config.max_sessions)
        self._train = self.items("train")

    async def get_next_item(self) -> dict[str, Any] | None:
        if not hasattr(self, "_train"):
            await self.setup()
        return next(self._train, None)

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredGroup | None, list[Any]]:
        started = time.perf_counter()
        size = self.config.group_size
        opening = Opening(size)
        results = await asyncio.gather(*(self.play(item, i, opening) for i in range(size)), return_exceptions=True)
        played: list[Played] = []
        for index, result in enumerate(results):
            if isinstance(result, ServerUnreachableError):
                raise result
            if isinstance(result, BaseException):
                record_failure(result, env=self.name, item_id=item["id"], rollout_index=index)
            else:
                played.append(result)
        if not played:
            return None, []
        return self._group(item, played, time.perf_counter() - started), []

    async def play(self, item: dict[str, Any], index: int, opening: Opening) -> Played:
        """One episode on its own session: reset with the item's seed, then reply/step until done or max_turns."""
        config: OpenEnvConfig = self.config  # type: ignore[assignment]
        reset = {"seed": item["seed"], "episode_id": item["id"]}
        if item["split"] != "train":
            reset["split"] = item["split"]
        async with self._sessions, OpenEnvSession(self.base_url, config.timeout_s) as session:
            result = await session.reset(**reset)
            remote_id = result.metadata.get("item_id")
            messages = self._first_messages(result)
            trace = TokenTrace(self.tokenizer) if self.tokenizer is not None else None
            if trace:
                trace.start(messages)
            played = Played(list(messages), [], trace, None, truncated=False, remote_id=remote_id)
            key = (trace.prompt_ids() if trace else None, messages)
            choice = await self._opening_reply(opening, index, key, played, item)
            for turn in range(1, config.max_turns + 1):
                self._add_reply(played, choice)
                result = await session.step({self.action_field: choice.text})
                played.rewards.append(result.reward or 0.0)
                if result.done:
                    return played
                if turn == config.max_turns:
                    played.truncated = True
                    return played
                self._add_observation(played, result)
                choice = (await self._generate(played, n=1))[0]
        raise AssertionError("unreachable: the loop returns")

    async def _opening_reply(
        self, opening: Opening, index: int, key: Any, played: Played, item: dict[str, Any]
    ) -> Choice:
        """Reply i of the group's shared first request when this rollout's first prompt is the shared one."""
        if opening.task is None:
            opening.key = key

            async def first() -> list[Choice]:
                if played.remote_id is None:
                    return await self._generate(played, n=opening.size)
                with seeded_requests(self.config.seed, f"{item['seed']}:{played.remote_id}"):
                    return await self._generate(played, n=opening.size)

            opening.task = asyncio.ensure_future(first())
        if opening.key == key and index not in opening.taken:
            opening.taken.add(index)
            return (await opening.task)[index]
        return (await self._generate(played, n=1))[0]

    async def _generate(self, played: Played, n: int) -> list[Choice]:
        params = self.sampling_params(n=n).model_dump(exclude_none=True)
        if played.trace is not None:
            generation = await self.server.completion(prompt=played.trace.prompt_ids(), **params)
        else:
            generation = await self.server.chat_completion(messages=played.messages, **params)
        return list(generation.choices)

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

    def _group(self, item: dict[str, Any], played: list[Played], elapsed: float) -> ScoredGroup:
        traces = [p.trace for p in played]
        with_tokens = all(t is not None for t in traces)
        logprobs = [t.logprobs for t in traces] if with_tokens else None  # type: ignore[union-attr]
        return ScoredGroup(
            tokens=[t.tokens for t in traces] if with_tokens else [],  # type: ignore[union-attr]
            masks=[t.masks for t in traces] if with_tokens else [],  # type: ignore[union-attr]
            inference_logprobs=logprobs if logprobs and all(lp is not None for lp in logprobs) else None,
            scores=[sum(p.rewards) for p in played],
            messages=[p.messages for p in played],
            meta=GroupMeta(
                env=self.name,
                env_version=self.version,
                item_id=item["id"],
                failed_rollouts=self.config.group_size - len(played),
                duration_s=round(elapsed, 4),
                tokens_missing=not with_tokens,
                rollouts=[
                    RolloutMeta(
                        finish_reason=p.finish_reason,
                        step_rewards=p.rewards,
                        turns=len(p.rewards),
                        truncated=p.truncated,
                        episode_id=p.remote_id,
                    )
                    for p in played
                ],
            ),
        )


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
