"""`ors:URL` / `ors:MODULE`: an Open Reward Standard env server as one of our envs (`load_ors_env(target)`).

A `ServedEpisodeEnv` (adapters/served: the group's shared first request, per-turn seeds, exact tokens across
turns). Items are the server's tasks: train item k is task k of the train split (`--env.train_split`; the
split's tasks in order, again from the start when they run out), eval items the tasks of the eval split
(`--env.eval_split`, default the server's split of type test, else validation; at most `eval_episodes`).

Each rollout opens its own session on its task (`/create_session` + `/create`; at most `max_sessions` at once),
reads the task's prompt (`/messages`, else `/prompt`) and tools (`/task_tools`), and plays:

- the model's reply, parsed with `--env.tool_parser` (hermes by default) when the task has tools: each tool
  call goes through the session (`/call`), its result comes back to the model as the next user turn
  (`[tool NAME] text`, ORS puts tool results in user turns); the tools are listed for the model in the system
  message (names, descriptions, argument schemas, and the call format the parser reads);
- a reply without a tool call goes to the env's terminal tool when it has one (ORS: a plain assistant message
  is the answer); without one, that reply ends the rollout;
- every call's reward is kept in order (`meta.rollouts[i].step_rewards`); the score is their sum; the reward
  parts are `return`, `turns` (model replies), `calls`, `truncated` and `reward:TOOL` (the sum per tool);
- the rollout ends when a call says `finished`, or after `max_turns` replies (then it is truncated).

A task spec with `item_id` (what `atropos export ors` serves) seeds the group's first request as a direct run
of that item does, so an exported env read back here gives the groups of a direct run. A session that fails
(the server's error event, a refused request) is that rollout's failure record; the group keeps the others.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.adapters.episodes import EpisodeConfig, Played
from atropos_cli.adapters.openenv.local import is_url
from atropos_cli.adapters.ors.local import OrsLocalServer
from atropos_cli.adapters.ors.wire import OrsClient, OrsSession, Tools, check_reachable
from atropos_cli.adapters.served import Opening, ServedEpisodeEnv
from atropos_cli.env.base import BaseEnv
from atropos_cli.env.multiturn import TokenTrace
from atropos_cli.errors import EnvLoadError
from atropos_cli.types import Message, ScoredGroup

__all__ = ["OrsConfig", "OrsEnv", "load_ors_env"]


class OrsConfig(EpisodeConfig):
    """Options of an `ors:` env (`--env.max_turns 4`, ...), beside the usual env fields."""

    env_name: str | None = Field(None, description="The server's env to play (default: its first, the default one).")
    train_split: str = Field("train", description="The split whose tasks are the train items.")
    eval_split: str | None = Field(
        None, description="The split of `atropos evaluate` (default: the split of type test, else validation)."
    )
    tool_parser: str = Field("hermes", description="How the model writes tool calls (atropos' tool-call parsers).")
    max_sessions: int = Field(8, ge=1, description="Sessions open at once on the server.")
    timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for one answer (a tool call included).")
    deployment: str | None = Field(None, description="Sent as X-Deployment (hosted ORS servers route by it).")
    python: str | None = Field(
        None, description="ors:MODULE only: the Python with openreward and the module (default $ATROPOS_ORS_PYTHON)."
    )
    startup_timeout_s: float = Field(120.0, gt=0, description="ors:MODULE only: seconds for it to come up.")


class OrsEnv(ServedEpisodeEnv):
    """An ORS server's tasks as scored groups (made by `load_ors_env`, which sets `target`)."""

    name: ClassVar[str] = "ors"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "an Open Reward Standard env server (tasks, sessions, tool calls with rewards)"
    env_config_cls = OrsConfig
    target: ClassVar[str] = ""

    @classmethod
    def config_init(cls) -> tuple[OrsConfig, list[Any]]:
        return OrsConfig(max_token_length=256), []

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Before any model loads: a URL answers as an ORS server with the env; a module is installed."""
        from atropos_cli.compat.tool_parsers import get_parser

        get_parser(config.tool_parser)
        if is_url(cls.target):
            names = check_reachable(cls.target, min(config.timeout_s, 30.0))
            if config.env_name and config.env_name.lower() not in [n.lower() for n in names]:
                hint = f"its envs: {', '.join(names)}"
                raise EnvLoadError(f"the ORS server has no env {config.env_name!r}", hint=hint)
        else:
            OrsLocalServer(cls.target, config.python).check()

    async def setup(self) -> None:
        from atropos_cli.compat.tool_parsers import get_parser

        config: OrsConfig = self.config  # type: ignore[assignment]
        if is_url(self.target):
            base_url = self.target
        else:
            self._local = OrsLocalServer(self.target, config.python)
            base_url = await asyncio.to_thread(self._local.start, config.startup_timeout_s)
        self.client = OrsClient(base_url, config.timeout_s, config.deployment)
        names = await self.client.environments()
        self.client.env_name = next((n for n in names if n.lower() == (config.env_name or "").lower()), names[0])
        self.splits = await self._resolve_splits(config)
        self.counts = {split: await self.client.num_tasks(split) for split in set(self.splits.values())}
        if self.counts[self.splits["train"]] == 0:
            hint = "name another: --env.train_split"
            raise EnvLoadError(f"the split {self.splits['train']!r} has no tasks", hint=hint)
        self.parser = get_parser(config.tool_parser)
        self._sessions = asyncio.Semaphore(config.max_sessions)
        self._tasks: dict[tuple[str, int], Any] = {}
        await super().setup()

    async def _resolve_splits(self, config: OrsConfig) -> dict[str, str]:
        listed = await self.client.splits()
        names = [s["name"] for s in listed]
        typed = {s.get("type"): s["name"] for s in reversed(listed)}
        splits = {"train": config.train_split}
        eval_split = config.eval_split or typed.get("test") or typed.get("validation")
        if eval_split is not None:
            splits["eval"] = eval_split
        for split in splits.values():
            if split not in names:
                raise EnvLoadError(f"the ORS env has no split {split!r}", hint=f"its splits: {', '.join(names)}")
        return splits

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        """Train: task 0, 1, ... of the train split, round and round; eval: the eval split's tasks once."""
        if split not in self.splits:
            raise EnvLoadError("the ORS env has no split of type test or validation", hint="name one: --env.eval_split")
        name = self.splits[split]
        count = self.counts[name]
        limit = None if split == "train" else min(count, self.config.eval_episodes)  # type: ignore[attr-defined]
        k = 0
        while limit is None or k < limit:
            yield {"id": f"{name}-{k % count}", "seed": k % count, "split": name, "index": k % count}
            k += 1

    async def play_rollout(self, item: dict[str, Any], index: int, opening: Opening) -> Played:
        """One task on its own session: reply, act (tool calls or the terminal tool) until finished or max_turns."""
        config: OrsConfig = self.config  # type: ignore[assignment]
        async with self._sessions, OrsSession(self.client, item["split"], item["index"]) as session:
            tools = await session.tools()
            messages = self._opening_messages(await session.messages(), tools)
            trace = TokenTrace(self.tokenizer) if self.tokenizer is not None else None
            if trace:
                trace.start(messages)
            played = Played(list(messages), [], False, trace, None)
            task = await self._task(item)
            seeding = (item["index"], task["item_id"]) if isinstance(task, dict) and "item_id" in task else None
            choice = await self.opening_reply(opening, index, played, seeding, item["id"])
            turns = 1
            while True:
                self.add_reply(played, choice)
                new, finished = await self._act(session, tools, choice.text, played)
                if finished or new is None or turns >= config.max_turns:
                    played.truncated = not finished and new is not None
                    return played
                self.add_messages(played, new)
                choice = await self.next_reply(played, item["id"], index)
                turns += 1

    async def _task(self, item: dict[str, Any]) -> Any:
        key = (item["split"], item["index"])
        if key not in self._tasks:
            self._tasks[key] = await self.client.task(*key)
        return self._tasks[key]

    async def _act(
        self, session: OrsSession, tools: Tools, text: str, played: Played
    ) -> tuple[list[Message] | None, bool]:
        """The reply's effect: (the next user turn, None when the rollout ends here; whether a call finished it)."""
        content, calls = self.parser.parse(text, tools.specs) if tools.specs else (text, None)
        if calls:
            from atropos_cli.compat.tool_parsers.base import call_parts

            results = []
            for call in calls:
                name, arguments = call_parts(call)
                result = await session.call_tool(name, arguments if isinstance(arguments, dict) else {})
                played.rewards.append(float(result.reward or 0.0))
                played.calls.append(name)
                results.append(f"[tool {name}] {result.text}")
                if result.finished:
                    return None, True
            return [{"role": "user", "content": "\n".join(results)}], False
        if tools.terminal is None:
            return None, False
        name, arg = tools.terminal
        result = await session.call_tool(name, {} if arg is None else {arg: text})
        played.rewards.append(float(result.reward or 0.0))
        played.calls.append(name)
        return ([{"role": "user", "content": result.text}], False) if not result.finished else (None, True)

    def _opening_messages(self, messages: list[Message], tools: Tools) -> list[Message]:
        """The task's messages, with our system prompt and the tools' description in the system message."""
        config: OrsConfig = self.config  # type: ignore[assignment]
        extra = [text for text in (config.system_prompt, self._tools_text(tools)) if text]
        if not extra:
            return messages
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": "\n\n".join([messages[0]["content"], *extra])}, *messages[1:]]
        return [{"role": "system", "content": "\n\n".join(extra)}, *messages]

    def _tools_text(self, tools: Tools) -> str:
        if not tools.specs:
            return ""
        from atropos_cli.compat.tool_parsers.base import tool_call

        listed = "\n".join(json.dumps(_untitled(spec), ensure_ascii=False, sort_keys=True) for spec in tools.specs)
        example = self.parser.render(None, [tool_call(0, tools.specs[0]["name"], {"ARGUMENT": "VALUE"})])
        return f"You can call these tools:\n{listed}\nTo call a tool, write:\n{example}"

    def group(self, item: dict[str, Any], played: list[Played], elapsed: float) -> ScoredGroup:
        """The episode group, with ORS' reward parts: replies, calls, and the reward of each tool."""
        group = super().group(item, played, elapsed)
        assert group.meta is not None and group.meta.rollouts is not None
        for rollout, play in zip(group.meta.rollouts, played, strict=True):
            parts = dict(rollout.reward_parts or {})
            parts["turns"] = float(sum(m["role"] == "assistant" for m in play.messages))
            parts["calls"] = float(len(play.calls))
            for name, reward in zip(play.calls, play.rewards, strict=True):
                parts[f"reward:{name}"] = parts.get(f"reward:{name}", 0.0) + reward
            rollout.reward_parts = parts
        return group


def _untitled(value: Any) -> Any:
    """A JSON schema without its `title`s (pydantic's class names: tokens the model need not read)."""
    if isinstance(value, dict):
        return {k: _untitled(v) for k, v in value.items() if k != "title" or not isinstance(v, str)}
    return [_untitled(v) for v in value] if isinstance(value, list) else value


def load_ors_env(target: str) -> type[BaseEnv]:
    """The env class of `ors:TARGET` (TARGET: the server's http(s) URL, or a module to serve with openreward)."""
    if not target:
        from atropos_cli.errors import EnvNotFoundError

        raise EnvNotFoundError("ors: needs a target", hint="ors:http://HOST:PORT (a running server) or ors:MODULE")
    if not is_url(target):
        OrsLocalServer.resolve(target)  # a bad module name fails here, before any config is read
    attrs: dict[str, Any] = {"target": target, "name": f"ors:{target}", "__module__": __name__}
    return type("Ors", (OrsEnv,), attrs)
