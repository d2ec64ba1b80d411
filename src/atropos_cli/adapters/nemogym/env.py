"""`nemogym:TARGET`: a NeMo Gym resources server as one of our envs, played by NeMo Gym's simple-agent loop.

Items are the task rows of the dataset (`--env.dataset`, default the server folder's task file; the eval
split reads `--env.eval_dataset`, default the same rows). A group is `group_size` rollouts of one row; each
rollout is its own session on the server (wire.ResourcesSession: seed, tool calls, verify) and its own
conversation with the policy, our inference router: the row's input and tools are the chat (the tools
rendered by the chat template), each reply's tool calls are parsed from its text (`--env.tool_parser`), sent
to the server and their outputs become `tool` messages, until a reply calls no tool, stops at the token
limit, or `--env.max_turns` replies were given. The server's `verify` reward is the rollout's score; its
`reward_components` (NeMo Gym's multi-reward answer) and the counts of turns and tool calls are reward parts.

Tokens are exact across turns (`TokenTrace`: the backend's own ids for every reply, the template's bridges
masked), so the groups train; without a tokenizer the rollouts run over chat and the group has no tokens.
The group's first replies are one request for all `group_size` (they share the row's prompt); every later
request carries its own seed (run seed, item, rollout, turn), so a run is repeatable. A rollout whose
session fails (seed or verify refused, the server gone) is that rollout's failure record; the group keeps the
others.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.adapters.episodes import turn_seed
from atropos_cli.adapters.nemogym import wire
from atropos_cli.adapters.nemogym.server import ResourcesServer, find_folder, is_url, server_python
from atropos_cli.config import QUICK_GROUPS, EnvConfig
from atropos_cli.env.base import BaseEnv
from atropos_cli.env.multiturn import MultiTurnEnv, TokenTrace, gather_rollouts
from atropos_cli.errors import ConfigError
from atropos_cli.types import Message, RolloutMeta, ScoredGroup

__all__ = ["NemoGymConfig", "NemoGymEnv", "load_nemogym_env"]


class NemoGymConfig(EnvConfig):
    """Options of a `nemogym:` env (`--env.dataset tasks.jsonl`, ...), beside the usual env fields."""

    total_steps: int = Field(QUICK_GROUPS, ge=1, description="Groups a run collects (atropos process).")
    dataset: str | None = Field(
        None, description="JSONL of NeMo Gym task rows (default: the server folder's data/*.jsonl task file)."
    )
    eval_dataset: str | None = Field(None, description="Task rows of the eval split (default: the dataset's).")
    max_turns: int = Field(8, ge=1, description="Policy replies per rollout (NeMo Gym's max_steps).")
    tool_parser: str = Field("hermes", description="How tool calls are read from a reply's text (compat parsers).")
    timeout_s: float = Field(300.0, gt=0, description="Seconds to wait for one answer of the resources server.")
    python: str | None = Field(
        None, description="A server folder or NAME only: the Python with nemo-gym (default $ATROPOS_NEMOGYM_PYTHON)."
    )
    startup_timeout_s: float = Field(120.0, gt=0, description="A server folder or NAME only: seconds to come up.")


@dataclass
class Rollout:
    """One session's conversation, its output items (what verify reads) and outcome."""

    messages: list[Message]
    trace: TokenTrace | None
    tools: list[dict[str, Any]] | None
    output: list[dict[str, Any]] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    finish_reason: str | None = None
    complete: bool = True
    verified: dict[str, Any] = field(default_factory=dict)


class NemoGymEnv(MultiTurnEnv):
    """A NeMo Gym resources server's tasks as scored groups (made by `load_nemogym_env`, which sets `target`)."""

    name: ClassVar[str] = "nemogym"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = "a NeMo Gym resources server (seed_session, tool calls, verify)"
    env_config_cls = NemoGymConfig
    target: ClassVar[str] = ""

    @classmethod
    def config_init(cls) -> tuple[NemoGymConfig, list[Any]]:
        return NemoGymConfig(max_token_length=256), []

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Before any model loads: the folder and its Python exist, there are tasks, the parser is known."""
        from atropos_cli.compat.tool_parsers import get_parser

        get_parser(config.tool_parser)
        default = None
        if not is_url(cls.target):
            default = find_folder(cls.target, config.python).dataset
            server_python(config.python)
        _rows(config.dataset, default, "dataset")
        if is_url(cls.target):
            wire.check_reachable(cls.target, min(config.timeout_s, 30.0))

    async def setup(self) -> None:
        config: NemoGymConfig = self.config  # type: ignore[assignment]
        from atropos_cli.compat.tool_parsers import get_parser

        self.parser = get_parser(config.tool_parser)
        default = None
        if is_url(self.target):
            self.base_url = self.target
        else:
            folder = find_folder(self.target, config.python)
            default = folder.dataset
            self._server = ResourcesServer(folder, config.python)
            self.base_url = await asyncio.to_thread(self._server.start, config.startup_timeout_s)
        self.rows = {"train": _rows(config.dataset, default, "dataset")}
        evals = config.eval_dataset
        self.rows["eval"] = _rows(evals, None, "eval_dataset") if evals else self.rows["train"]
        await super().setup()

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        if not hasattr(self, "rows"):
            raise RuntimeError("setup() reads the task rows; call it first")
        for index, row in enumerate(self.rows["eval" if split != "train" else "train"]):
            yield {"id": f"{split}-{index}", "row": row}

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredGroup | None, list[Any]]:
        """The group's first replies are one request (every rollout starts from the row's prompt), as a
        SimpleEnv asks; each rollout takes its own, then plays on in its own session."""
        started = time.perf_counter()
        opening = asyncio.ensure_future(self._opening(item))
        plays = (self.play_rollout(item, i, opening) for i in range(self.config.group_size))
        try:
            played = await gather_rollouts(self.name, item["id"], plays)
        finally:
            if not opening.done():
                opening.cancel()
            elif not opening.cancelled():
                opening.exception()  # retrieved: a failed opening is each rollout's failure record already
        if not played:
            return None, []
        return self.group(item, played, time.perf_counter() - started), []

    async def _opening(self, item: dict[str, Any]) -> list[Any]:
        rollout = self._start(item)
        seed = turn_seed(self.config.seed, item["id"], -1, 0)
        return await self._request(rollout, seed, self.config.group_size)

    def _start(self, item: dict[str, Any]) -> Rollout:
        """A rollout before its first reply: the row's chat, and its token trace when there is a tokenizer."""
        params = item["row"]["responses_create_params"]
        tools = wire.chat_tools(params)
        messages = wire.row_messages(params)
        trace = TokenTrace(self.tokenizer, tools) if self.tokenizer is not None else None
        if trace:
            trace.start(messages)
        return Rollout(list(messages), trace, tools)

    async def play_rollout(self, item: dict[str, Any], index: int, opening: asyncio.Future[list[Any]]) -> Rollout:
        """One session: seed, then reply / call tools until a reply calls none, then verify."""
        config: NemoGymConfig = self.config  # type: ignore[assignment]
        row = item["row"]
        rollout = self._start(item)
        names = {t["function"]["name"] for t in rollout.tools or []}
        async with wire.ResourcesSession(self.base_url, config.timeout_s, names) as session:
            await session.seed(row)
            choice = (await asyncio.shield(opening))[index]
            while True:
                calls = self._add_reply(rollout, choice)
                if choice.finish_reason == "length" or not calls:
                    rollout.complete = choice.finish_reason != "length"
                    break
                results = [await self._run_tool(session, rollout, call) for call in calls]
                rollout.messages.extend(results)
                if rollout.turns >= config.max_turns:  # as NeMo Gym's agent: the last calls run, then it stops
                    rollout.complete = False
                    break
                if rollout.trace:
                    rollout.trace.add_messages(results)
                choice = (await self._request(rollout, turn_seed(config.seed, item["id"], index, rollout.turns)))[0]
            params = row["responses_create_params"]
            response = wire.response_body(params, rollout.output, self._model_name(), complete=rollout.complete)
            rollout.verified = await session.verify(row, response)
        return rollout

    async def _request(self, rollout: Rollout, seed: int, n: int = 1) -> list[Any]:
        """As token ids when a trace gives them (the template rendered the tools), else as the chat (our router's
        chat requests carry no tool list: the policy sees the tools only through a tokenizer)."""
        return await self.sample(rollout.messages, rollout.trace.prompt_ids() if rollout.trace else None, n, seed)

    def _add_reply(self, rollout: Rollout, choice: Any) -> list[dict[str, Any]]:
        """Record the reply (its own tokens; the text as the assistant turn) and its output items; its calls."""
        if rollout.trace:
            rollout.trace.add_reply(choice.text, choice.token_ids, choice.logprobs, choice.finish_reason)
        rollout.messages.append({"role": "assistant", "content": choice.text})
        rollout.turns += 1
        rollout.finish_reason = choice.finish_reason
        tools = rollout.tools
        content, calls = self.parser.parse(choice.text, tools) if tools else (choice.text, None)
        calls = [{**c, "id": f"call_{rollout.tool_calls + i}"} for i, c in enumerate(calls or [])]
        if content:
            rollout.output.append(wire.message_item(content, rollout.turns))
        rollout.output.extend(wire.call_item(c) for c in calls)
        return calls

    async def _run_tool(self, session: wire.ResourcesSession, rollout: Rollout, call: dict[str, Any]) -> Message:
        function = call["function"]
        output = await session.call_tool(function["name"], function["arguments"])
        rollout.tool_calls += 1
        rollout.output.append(wire.call_output_item(call["id"], output))
        return {"role": "tool", "tool_call_id": call["id"], "content": output}

    def _model_name(self) -> str:
        return str(getattr(self.server, "model_name", None) or "policy")

    def group(self, item: dict[str, Any], played: list[Rollout], elapsed: float) -> ScoredGroup:
        rollouts = [RolloutMeta(finish_reason=r.finish_reason, reward_parts=_reward_parts(r)) for r in played]
        scores = [float(r.verified["reward"]) for r in played]
        return self.traced_group(
            item["id"], [r.trace for r in played], scores, [r.messages for r in played], rollouts, elapsed
        )


def _reward_parts(rollout: Rollout) -> dict[str, float]:
    parts = {"reward": float(rollout.verified["reward"])}
    components = rollout.verified.get("reward_components")
    if isinstance(components, dict):
        parts.update({k: float(v) for k, v in components.items() if isinstance(v, int | float)})
    parts.update(turns=float(rollout.turns), tool_calls=float(rollout.tool_calls), complete=float(rollout.complete))
    return parts


def _rows(path: str | Path | None, default: Path | None, option: str) -> list[dict[str, Any]]:
    """The task rows of a JSONL file: every line an object with `responses_create_params`."""
    chosen = Path(path) if path else default
    if chosen is None:
        raise ConfigError("a nemogym: env needs its task rows", hint=f"--env.{option} FILE.jsonl (NeMo Gym task rows)")
    try:
        lines = chosen.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise ConfigError(f"cannot read the task rows {chosen}: {exc.strerror}", hint=f"check --env.{option}") from None
    rows = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            hint = "one task row (a JSON object) per line"
            raise ConfigError(f"{chosen}:{number}: not JSON ({exc.msg})", hint=hint) from None
        if not isinstance(row, dict) or not isinstance(row.get("responses_create_params"), dict):
            raise ConfigError(
                f"{chosen}:{number}: a task row needs a responses_create_params object",
                hint='NeMo Gym\'s rows: {"responses_create_params": {"input": [...], "tools": [...]}, ...}',
            )
        rows.append(row)
    if not rows:
        raise ConfigError(f"{chosen} has no task rows", hint=f"check --env.{option}")
    return rows


def load_nemogym_env(target: str) -> type[BaseEnv]:
    """The env class of `nemogym:TARGET` (a server URL, a resources server folder, or a shipped server's NAME)."""
    attrs: dict[str, Any] = {"target": target, "name": f"nemogym:{target}", "__module__": __name__}
    return type("NemoGymEnv", (NemoGymEnv,), attrs)
