"""Token bookkeeping for multi-turn rollouts: ids, masks and logprobs that stay exact across turns.

The bug this prevents (the most reported one in peers): re-rendering and re-tokenising the whole chat at
every turn can tokenise the model's earlier replies differently from how the model produced them (BPE
merges across a boundary, templates that rewrite or strip past assistant turns), so the trained tokens are
not the sampled ones and the logprobs no longer line up.

`TokenTrace` never re-tokenises what is already there. It appends:
- the first prompt, rendered with the chat template (masked, -100);
- each reply's tokens exactly as the backend returned them (trained: mask = token id, with their logprobs),
  or, for backends without token ids, the reply text encoded once;
- between turns, only the *bridge*: the template text after the assistant's content up to the next
  assistant header (end-of-turn marker, the env's new messages, the generation prompt), found by rendering
  the chat with a sentinel in place of the reply and cut at the sentinel. Bridges are masked.

So the ids of turn k's prompt are a prefix of turn k+1's (`prompt_ids()` after each `add_messages`), and
`tokens`/`masks`/`logprobs` line up one to one for the trainer (masked logprob = 1.0, Atropos' convention).
Used by the multi-turn envs (blackjack, the reset/step adapters); sits between the env and `ScoredGroup`.
`MultiTurnEnv` is their shared frame: items from `items(split)`, a group = `group_size` concurrent `play(item)`
(one that raises is a failure record), assembled by `group(...)`; `trace_fields` turns the rollouts' traces
into the group's tokens, masks and logprobs.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from atropos_cli.env.base import BaseEnv, record_failure
from atropos_cli.errors import ServerUnreachableError
from atropos_cli.tokens import MASKED, MASKED_LOGPROB, chat_prompt_ids
from atropos_cli.types import GroupMeta, Message, RolloutMeta, ScoredGroup

__all__ = [
    "TokenTrace",
    "MultiTurnEnv",
    "ScoredPlay",
    "bridge_ids",
    "chat_added",
    "gather_rollouts",
    "trace_fields",
]

T = TypeVar("T")

_SENTINEL = "\u2063ATROPOS_REPLY\u2063"
MIN_TURN_TOKENS = 16  # a turn with less room than this (or than max_token_length) is not sampled
MAX_STATED_CONTEXT = 10_000_000  # a tokenizer's model_max_length above this is its "no limit" sentinel


class TokenTrace:
    """One rollout's conversation and its aligned tokens, masks and logprobs."""

    def __init__(self, tokenizer: Any, tools: list[dict[str, Any]] | None = None) -> None:
        self.tokenizer = tokenizer
        self.tools = tools or None  # the OpenAI tool list every rendering of this chat shows the model
        self.messages: list[Message] = []
        self.tokens: list[int] = []
        self.masks: list[int] = []
        self.logprobs: list[float] | None = []
        self._reply_had_eos = False

    def start(self, messages: list[Message]) -> list[int]:
        """Render the opening messages (ending with the assistant header); return the first prompt's ids."""
        if self.messages:
            raise ValueError("TokenTrace.start() was already called; use add_messages() for later turns")
        self.messages = [dict(m) for m in messages]
        self._append(chat_prompt_ids(self.tokenizer, self.messages, self.tools), trained=False)
        return self.prompt_ids()

    def add_reply(
        self,
        text: str,
        token_ids: list[int] | None = None,
        logprobs: list[float] | None = None,
        finish_reason: str | None = None,
    ) -> None:
        """Append the model's reply: its own token ids when the backend gave them, else the text encoded once."""
        if token_ids is None:
            token_ids = list(self.tokenizer.encode(text, add_special_tokens=False))
            if logprobs is not None and len(logprobs) != len(token_ids):
                logprobs = None  # the server tokenised differently: its logprobs do not line up with ours
        if logprobs is not None and len(logprobs) != len(token_ids):
            raise ValueError(f"reply has {len(token_ids)} token ids but {len(logprobs)} logprobs")
        eos = getattr(self.tokenizer, "eos_token_id", None)
        self._reply_had_eos = bool(token_ids) and token_ids[-1] == eos
        self._append(list(token_ids), trained=True, logprobs=logprobs)
        self.messages.append({"role": "assistant", "content": text})

    def bridge(self, new_messages: list[Message]) -> list[int]:
        """The masked ids `add_messages(new_messages)` would append (nothing is appended): how long the next
        prompt would be, before committing to it."""
        if not self.messages or self.messages[-1].get("role") != "assistant":
            raise ValueError("add_messages() follows add_reply(): the last message must be the model's")
        return bridge_ids(
            self.tokenizer, self.messages[:-1], new_messages, reply_had_eos=self._reply_had_eos, tools=self.tools
        )

    def add_messages(self, new_messages: list[Message]) -> list[int]:
        """Append the env's messages after a reply (masked); return the next prompt's ids (old ids + bridge)."""
        self._append(self.bridge(new_messages), trained=False)
        self.messages.extend(dict(m) for m in new_messages)
        return self.prompt_ids()

    def prompt_ids(self) -> list[int]:
        return list(self.tokens)

    def _append(self, ids: list[int], *, trained: bool, logprobs: list[float] | None = None) -> None:
        self.tokens.extend(ids)
        self.masks.extend(ids if trained else [MASKED] * len(ids))
        if self.logprobs is None:
            return
        if not trained:
            self.logprobs.extend([MASKED_LOGPROB] * len(ids))
        elif logprobs is not None:
            self.logprobs.extend(float(x) for x in logprobs)
        else:
            self.logprobs = None  # one reply without logprobs: the rollout has none (never half-filled)


def bridge_ids(
    tokenizer: Any,
    before_reply: list[Message],
    new_messages: list[Message],
    *,
    reply_had_eos: bool,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """The masked ids between a sampled reply and the next generation: the template text after the reply's
    content (end-of-turn marker, `new_messages`, the generation prompt), found by rendering the chat with a
    sentinel in place of the reply and cut at the sentinel. `before_reply` is the chat the reply answered;
    when the reply's own tokens ended with EOS, the template's copy of that marker is left out."""
    chat = [*before_reply, {"role": "assistant", "content": _SENTINEL}, *new_messages]
    extra = {"tools": tools} if tools else {}
    rendered = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False, **extra)
    if rendered.count(_SENTINEL) != 1:
        raise ValueError("the chat template drops or repeats the assistant's reply; cannot bridge turns")
    bridge = rendered.split(_SENTINEL, 1)[1]
    eos_text = getattr(tokenizer, "eos_token", None)
    if reply_had_eos and eos_text and bridge.startswith(eos_text):
        bridge = bridge[len(eos_text) :]  # the model already emitted the end-of-turn token
    return list(tokenizer.encode(bridge, add_special_tokens=False))


async def gather_rollouts(env_name: str, item_id: str | None, plays: Iterable[Awaitable[T]]) -> list[T]:
    """Run a group's rollouts concurrently. One that raises becomes a failure record and the group keeps the
    others; an unreachable server propagates (no other rollout can succeed either)."""
    results = await asyncio.gather(*plays, return_exceptions=True)
    kept: list[T] = []
    for index, result in enumerate(results):
        if isinstance(result, ServerUnreachableError):
            raise result
        if isinstance(result, BaseException):
            record_failure(result, env=env_name, item_id=item_id, rollout_index=index)
        else:
            kept.append(result)
    return kept


def trace_fields(traces: list[TokenTrace | None]) -> dict[str, Any]:
    """A group's `tokens`, `masks` and `inference_logprobs` from its rollouts' traces: empty when a rollout has
    no trace (no tokenizer), logprobs None unless every rollout has them."""
    kept = [t for t in traces if t is not None]
    if len(kept) != len(traces):
        return {"tokens": [], "masks": [], "inference_logprobs": None}
    logprobs = [t.logprobs for t in kept]
    return {
        "tokens": [t.tokens for t in kept],
        "masks": [t.masks for t in kept],
        "inference_logprobs": logprobs if logprobs and all(lp is not None for lp in logprobs) else None,
    }


def chat_added(before: list[Message], after: list[Message]) -> list[Message]:
    """What a whole chat `after` (an env server's, or an exported env's next request) adds to `before`: its tail
    past `before` when it extends it, else what follows its last assistant message."""
    if after[: len(before)] == before:
        return after[len(before) :]
    last = max((i for i, m in enumerate(after) if m["role"] == "assistant"), default=-1)
    return after[last + 1 :]


@dataclass
class ScoredPlay:
    """One rollout scored as a whole (blackjack, tool_agent): its chat, score, reward parts, token trace (None
    without a tokenizer) and its last reply's finish reason; `MultiTurnEnv.group` assembles a group of them."""

    messages: list[Message]
    score: float
    parts: dict[str, float]
    trace: TokenTrace | None
    finish_reason: str | None


class MultiTurnEnv(BaseEnv):
    """A group is `group_size` independent plays of one item: implement `items(split)`, `play(item)` (one
    rollout, e.g. with a `TokenTrace`) and, unless `play` returns `ScoredPlay`s, `group(item, played, elapsed)`
    (the ScoredGroup of the kept plays)."""

    def items(self, split: str) -> Iterator[Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement items(split)")

    async def play(self, item: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement play(item)")

    def group(self, item: Any, played: list[Any], elapsed: float) -> ScoredGroup:
        """The group of `ScoredPlay`s: their scores, chats, traces, and reward parts per rollout."""
        if not all(isinstance(p, ScoredPlay) for p in played):
            raise NotImplementedError(f"{type(self).__name__} must implement group(item, played, elapsed)")
        rollouts = [RolloutMeta(finish_reason=p.finish_reason, reward_parts=p.parts) for p in played]
        traces = [p.trace for p in played]
        messages = [p.messages for p in played]
        return self.traced_group(self.item_id(item), traces, [p.score for p in played], messages, rollouts, elapsed)

    def traced_group(
        self,
        item_id: str | None,
        traces: list[TokenTrace | None],
        scores: list[float],
        messages: list[list[Message]],
        rollouts: list[RolloutMeta],
        elapsed: float,
        **meta: Any,
    ) -> ScoredGroup:
        """The group of the kept rollouts: tokens from their traces (none when one has no trace), the usual meta
        (`meta` adds fields, e.g. the episode's seed)."""
        return ScoredGroup(
            **trace_fields(traces),
            scores=scores,
            messages=messages,
            meta=GroupMeta(
                env=self.name,
                env_version=self.version,
                item_id=item_id,
                failed_rollouts=self.config.group_size - len(scores),
                duration_s=round(elapsed, 4),
                tokens_missing=any(t is None for t in traces),
                rollouts=rollouts,
                **meta,
            ),
        )

    async def reply(self, messages: list[Message], prompt_ids: list[int] | None, max_tokens: int | None = None) -> Any:
        """One sampled reply (a `Choice`): sent as token ids when a trace gives them, else as the chat."""
        return (await self.sample(messages, prompt_ids, max_tokens=max_tokens))[0]

    async def sample(
        self,
        messages: list[Message],
        prompt_ids: list[int] | None,
        n: int = 1,
        seed: int | None = None,
        max_tokens: int | None = None,
    ) -> list[Any]:
        """`n` sampled replies (`Choice`s) of one prompt: its token ids when a trace gives them (the trained
        tokens stay the backend's own), else the chat. `seed` pins the request's sampling (rollouts that run at
        once ask in any order; None takes the run's next seed); `max_tokens` caps this turn (`turn_budget`)."""
        overrides = {"max_tokens": max_tokens} if max_tokens is not None else {}
        params = self.sampling_params(n=n, seed=seed, **overrides).model_dump(exclude_none=True)
        if prompt_ids is not None:
            generation = await self.server.completion(prompt=prompt_ids, **params)
        else:
            generation = await self.server.chat_completion(messages=messages, **params)
        return list(generation.choices)

    def context_length(self) -> int | None:
        """The model's context in tokens as its tokenizer states it (`model_max_length`); None when unknown
        (no tokenizer, or the 'no limit' sentinel some tokenizers carry)."""
        length = getattr(self.tokenizer, "model_max_length", None)
        return length if isinstance(length, int) and 0 < length <= MAX_STATED_CONTEXT else None

    def turn_budget(self, prompt_len: int | None, context: int | None) -> int | None:
        """The next reply's `max_tokens`: the env's `max_token_length`, capped by what `context` leaves after
        a prompt of `prompt_len` tokens; None when less than `min(MIN_TURN_TOKENS, max_token_length)` is left
        (the rollout ends there rather than send a request the backend refuses or cuts to nothing)."""
        budget = self.config.max_token_length
        if context is None or prompt_len is None:
            return budget
        room = context - prompt_len
        return min(budget, room) if room >= min(MIN_TURN_TOKENS, budget) else None

    async def setup(self) -> None:
        self._train = self.items("train")

    async def get_next_item(self) -> Any:
        if not hasattr(self, "_train"):
            await self.setup()
        return next(self._train, None)

    def restart_items(self) -> bool:
        self._train = self.items("train")
        return True

    async def collect_trajectories(self, item: Any) -> tuple[ScoredGroup | None, list[Any]]:
        started = time.perf_counter()
        plays = (self.play(item) for _ in range(self.config.group_size))
        played = await gather_rollouts(self.name, self.item_id(item), plays)
        if not played:
            return None, []
        return self.group(item, played, time.perf_counter() - started), []
