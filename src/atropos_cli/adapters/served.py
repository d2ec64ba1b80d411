"""Episodes played on an env server (OpenEnv, ORS): the turn machinery their adapters share.

`ServedEpisodeEnv` is an `EpisodeEnv` whose rollouts each run on their own server session
(`play_rollout(item, index, opening)`, written by the adapter). What it adds:

- the group's first turn is one request for all `group_size` replies (as a SimpleEnv asks), shared by the
  rollouts whose first prompt is the same (`Opening`); seeded by the run seed, the item's index and the item id
  the server reports, so an env that `atropos export` serves, read back here, samples what it samples when run
  directly (`opening_reply(..., seeding=(index, item_id))`);
- later turns carry their own seed (`turn_seed`: the sessions answer in any order, a shared seed stream would
  hand out seeds in that order);
- requests go as token ids when a `TokenTrace` gives them, else as the chat; replies and the env's new messages
  are added to the trace and the chat together (`add_reply`, `add_messages`);
- `chat_added(before, after)` (env/multiturn): the messages a server's whole chat adds after ours.
"""

from __future__ import annotations

import asyncio
import json
import time
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any

from atropos_cli.adapters.episodes import EpisodeEnv, Played, turn_seed
from atropos_cli.env.multiturn import chat_added, gather_rollouts
from atropos_cli.inference.base import Choice, seeded_requests
from atropos_cli.types import Message, ScoredGroup

__all__ = ["Opening", "ServedEpisodeEnv", "chat_added", "turn_seed"]


@dataclass
class Opening:
    """The group's first-turn request: one call for every rollout, shared by those with the same first prompt."""

    size: int
    key: Any = None
    task: asyncio.Task[list[Choice]] | None = None
    taken: set[int] = field(default_factory=set)


class ServedEpisodeEnv(EpisodeEnv):
    """Episodes on server sessions: `play_rollout(item, index, opening)` plays one (see the module doc)."""

    async def play_rollout(self, item: dict[str, Any], index: int, opening: Opening) -> Played:
        raise NotImplementedError(f"{type(self).__name__} must implement play_rollout(item, index, opening)")

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredGroup | None, list[Any]]:
        started = time.perf_counter()
        opening = Opening(self.config.group_size)
        plays = (self.play_rollout(item, i, opening) for i in range(self.config.group_size))
        played = await gather_rollouts(self.name, item["id"], plays)
        if not played:
            return None, []
        return self.group(item, played, time.perf_counter() - started), []

    async def opening_reply(
        self, opening: Opening, index: int, played: Played, seeding: tuple[int, Any] | None, item_id: str
    ) -> Choice:
        """Reply `index` of the group's shared first request when this rollout's first prompt is the shared one
        (a rollout whose first prompt differs samples its own)."""
        key = (played.trace.prompt_ids() if played.trace else None, json.dumps(played.messages, sort_keys=True))
        if opening.task is None:
            opening.key = key
            opening.task = asyncio.ensure_future(self._first_request(played, opening.size, seeding))
        if opening.key == key and index not in opening.taken:
            opening.taken.add(index)
            return (await opening.task)[index]
        return (await self.request(played, 1, turn_seed(self.config.seed, item_id, index, 0)))[0]

    async def next_reply(self, played: Played, item_id: str, index: int) -> Choice:
        """A later turn's reply, with that turn's own seed."""
        return (await self.request(played, 1, turn_seed(self.config.seed, item_id, index, len(played.rewards))))[0]

    async def _first_request(self, played: Played, n: int, seeding: tuple[int, Any] | None) -> list[Choice]:
        """The group's one opening request, seeded like the first request of a direct run of the item."""
        with seeded_requests(self.config.seed, f"{seeding[0]}:{seeding[1]}") if seeding else nullcontext():
            return await self.request(played, n, None)

    async def request(self, played: Played, n: int, seed: int | None) -> list[Choice]:
        """Sent as token ids when a trace gives them, else as the chat."""
        params = self.sampling_params(n=n, seed=seed).model_dump(exclude_none=True)
        if played.trace is not None:
            generation = await self.server.completion(prompt=played.trace.prompt_ids(), **params)
        else:
            generation = await self.server.chat_completion(messages=played.messages, **params)
        return list(generation.choices)

    def add_reply(self, played: Played, choice: Choice) -> None:
        if played.trace:
            played.trace.add_reply(choice.text, choice.token_ids, choice.logprobs, choice.finish_reason)
        played.messages.append({"role": "assistant", "content": choice.text})
        played.finish_reason = choice.finish_reason

    def add_messages(self, played: Played, new: list[Message]) -> None:
        if played.trace:
            played.trace.add_messages(new)
        played.messages.extend(new)
