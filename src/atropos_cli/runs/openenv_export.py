"""Any env we run, played one episode at a time by another framework's client: an OpenEnv client (`atropos
export openenv ENV`, runs/openenv_app.py) or an ORS one (`atropos export ors ENV`, runs/ors_app.py, where an
episode is a session and a step is a call of its reply tool).

How an episode maps (the env runs exactly as `atropos process` runs it, one rollout per item):
- `reset(seed=k)` takes item k of the env's train stream (the same k gives the same item, so every rollout of
  a trainer's group plays the same problem); `reset()` without a seed takes the next item not handed out yet;
  `reset(split="eval", seed=k)` takes item k of `items("eval")`. The env's `collect_trajectories` starts on
  that item with `group_size` 1, over an inference "server" that is the client itself (`BridgeBackend`).
- Each request the env makes to the model ends the current call with an observation: `messages` (the chat
  the env sent), `prompt` (the text of its last message, or the completion prompt), reward 0.0, done false.
- `step(message=TEXT)` is the model's reply to that request. The env goes on: either it asks again (a
  multi-turn env: the next observation), or it scores the rollout: reward = the rollout's score, done true,
  the observation has the whole conversation and `metadata.reward_parts`.
- A rollout the env fails (its reward raises, it returns no group) answers the step with OpenEnv's error
  message (`EXECUTION_ERROR`) and ends the episode; the next `reset` starts a new one.
Every observation's metadata names the item (`item_id`, `index`, `split`).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from atropos_cli.config import ServerConfig
from atropos_cli.env.base import BaseEnv
from atropos_cli.errors import AtroposError, BadRequestError, ConfigError
from atropos_cli.inference.base import Choice, Generation, SamplingParams
from atropos_cli.types import Message

__all__ = ["BridgeBackend", "Episode", "EpisodeError", "Exported", "build_exported_env"]

CLIENT_MODEL = "openenv-client"
MAX_AHEAD = 1_000  # items one reset may draw to reach its seed (a random 31-bit seed is an error, not a hang)
MAX_KEPT = 20_000  # train items the server keeps in all (what any number of clients' seeds can make it hold)
_episode: contextvars.ContextVar[Episode | None] = contextvars.ContextVar("openenv_episode", default=None)


class EpisodeError(AtroposError):
    """What an OpenEnv client did wrong (step before reset, an unknown item) or the env's failed rollout."""


@dataclass
class Observation:
    messages: list[Message]
    prompt: str
    reward: float | None
    done: bool
    metadata: dict[str, Any]

    def wire(self) -> dict[str, Any]:
        """OpenEnv's serialize_observation shape: observation fields, reward, done, metadata beside them."""
        observation = {"messages": self.messages, "prompt": self.prompt, "metadata": self.metadata}
        return {"observation": observation, "reward": self.reward, "done": self.done, "metadata": self.metadata}


class BridgeBackend:
    """The exported env's inference backend: each request waits for the OpenEnv client's next action."""

    model_name = CLIENT_MODEL
    tokenizer = None

    def __init__(self) -> None:
        self.env: BaseEnv | None = None

    async def chat(self, messages: list[dict[str, Any]], params: SamplingParams, top_logprobs: int = 0) -> Generation:
        text = _text(messages[-1].get("content")) if messages else ""
        return await _current().ask(
            [{"role": m["role"], "content": _text(m.get("content"))} for m in messages], text, params
        )

    async def complete(self, prompt: str | list[int], params: SamplingParams, top_logprobs: int = 0) -> Generation:
        if not isinstance(prompt, str):
            tokenizer = self.env.tokenizer if self.env is not None else None
            if tokenizer is None:
                raise BadRequestError(
                    "the env sent token ids to the exported env's client and has no tokenizer to turn them into text",
                    hint="set --env.tokenizer_name",
                )
            prompt = str(tokenizer.decode(prompt))
        return await _current().ask([], prompt, params)

    async def aclose(self) -> None:
        return None


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def _current() -> Episode:
    episode = _episode.get()
    if episode is None:
        raise BadRequestError("a model request outside an exported episode", hint="this is a bug in atropos")
    return episode


@dataclass
class _Ended:
    observation: Observation | None = None
    error: str | None = None


class Episode:
    """One reset-to-done run of the env on one item, stepping with the client's actions."""

    def __init__(self, env: BaseEnv, item: Any, index: int, split: str) -> None:
        self.env, self.item, self.index, self.split = env, item, index, split
        self.item_id = env.item_id(item)
        self.metadata = {"item_id": self.item_id, "index": index, "split": split}
        self.step_count = 0
        self.done = False
        self._events: asyncio.Queue[Observation | _Ended] = asyncio.Queue()
        self._replies: asyncio.Queue[str] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Observation:
        context = contextvars.copy_context()
        context.run(_episode.set, self)
        self._task = asyncio.get_running_loop().create_task(self._run(), context=context)
        return await self._next()

    async def step(self, text: str) -> Observation:
        if self.done:
            raise EpisodeError("the episode is over", hint="call reset to start the next one")
        self.step_count += 1
        await self._replies.put(text)
        return await self._next()

    def cancel(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def ask(self, messages: list[Message], prompt: str, params: SamplingParams) -> Generation:
        """The env's model request: hand it to the client as an observation, return the client's reply."""
        if params.n != 1:
            raise BadRequestError(
                f"the env asked for {params.n} completions at once; one step carries one reply",
                hint="export runs the env with --env.group_size 1; an env that fixes n itself cannot be exported",
            )
        await self._events.put(Observation(messages, prompt, 0.0, False, self.metadata))
        text = await self._replies.get()
        return Generation(model=CLIENT_MODEL, choices=[Choice(text=text, finish_reason="stop")])

    async def _next(self) -> Observation:
        event = await self._events.get()
        if isinstance(event, Observation):
            return event
        self.done = True
        if event.error is not None:
            raise EpisodeError(event.error, hint="the env failed this rollout; reset to start the next episode")
        assert event.observation is not None
        return event.observation

    async def _run(self) -> None:
        from atropos_cli.runs.rollout import collect_group

        try:
            outcome = await collect_group(self.env, self.item, self.index)
        except Exception as exc:  # noqa: BLE001 - the client gets it as the step's error, the server stays up
            await self._events.put(_Ended(error=f"{type(exc).__name__}: {exc}"))
            return
        if not outcome.groups:
            failures = [*outcome.failures, *outcome.filtered]
            reason = f"{failures[0].error_type}: {failures[0].error}" if failures else "the env returned no group"
            await self._events.put(_Ended(error=f"rollout failed: {reason}"))
            return
        group = outcome.groups[0]
        rollout = group.meta.rollouts[0] if group.meta and group.meta.rollouts else None
        metadata = {**self.metadata, "reward_parts": rollout.reward_parts if rollout else None}
        messages = list(group.messages[0]) if group.messages else []
        observation = Observation(messages, "", float(group.scores[0]), True, metadata)
        await self._events.put(_Ended(observation=observation))


@dataclass
class Exported:
    """The exported env and where its items come from (train stream drawn lazily, eval split listed once)."""

    env: BaseEnv
    description: str
    _train: list[Any] = field(default_factory=list)
    _eval: list[Any] | None = None
    _next: int = 0
    _lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    _exhausted: bool = False

    async def item(self, seed: int | None, split: str) -> tuple[int, Any]:
        if split == "eval":
            return self._eval_item(seed)
        if split != "train":
            raise EpisodeError(f"unknown split {split!r}", hint="reset(split='train') or reset(split='eval')")
        async with self._lock:
            index = self._next if seed is None else seed
            if index - len(self._train) > MAX_AHEAD:
                raise EpisodeError(
                    f"seed {index} is item {index} of the env's stream; only {len(self._train)} are drawn so far",
                    hint=f"a seed names an item: reset with seeds below {len(self._train) + MAX_AHEAD} (or none)",
                )
            if index >= MAX_KEPT:
                raise EpisodeError(
                    f"seed {index} is item {index} of the env's stream; this server keeps the first {MAX_KEPT}",
                    hint=f"reset with seeds below {MAX_KEPT}",
                )
            self._next = max(self._next, index + 1)
            await self._draw(index + 1)
            if index >= len(self._train):
                raise EpisodeError(
                    f"the env has {len(self._train)} train items; there is no item {index}", hint="reset a lower seed"
                )
            return index, self._train[index]

    async def _draw(self, count: int) -> None:
        """Draw the train stream until it holds `count` items (or it ends)."""
        from atropos_cli.runs.envcall import call_env

        while len(self._train) < count and not self._exhausted:
            if len(self._train) % 100 == 99:
                await asyncio.sleep(0)  # a long draw lets the other sessions' messages through
            item = await call_env(self.env, "get_next_item", self.env.get_next_item())
            if item is None:
                self._exhausted = True
            else:
                self._train.append(item)

    async def count(self, split: str, limit: int) -> int:
        """How many items `split` has: the eval split's all, the train stream's first `limit` at most."""
        if split == "eval":
            return len(self._eval_items())
        async with self._lock:
            await self._draw(limit)
            return min(len(self._train), limit)

    def has_eval(self) -> bool:
        return getattr(self.env, "items", None) is not None

    def _eval_items(self) -> list[Any]:
        if self._eval is None:
            items = getattr(self.env, "items", None)
            if items is None:
                raise EpisodeError(f"env {self.env.name!r} has no eval split", hint="reset without split")
            self._eval = list(itertools.islice(items("eval"), 100_000))
        return self._eval

    def _eval_item(self, seed: int | None) -> tuple[int, Any]:
        items = self._eval_items()
        index = seed or 0
        if index >= len(items):
            raise EpisodeError(f"the eval split has {len(items)} items; no item {index}", hint="a lower seed")
        return index, items[index]

    async def episode(self, seed: int | None, split: str = "train") -> Episode:
        index, item = await self.item(seed, split)
        return Episode(self.env, item, index, split)


@contextmanager
def _bridged(bridge: BridgeBackend) -> Iterator[None]:
    """While the env is built, every inference backend it makes is the bridge (also inside Atropos envs)."""
    import atropos_cli.inference.factory as factory

    original = factory.make_backend
    factory.make_backend = lambda config: bridge  # type: ignore[assignment]
    try:
        yield
    finally:
        factory.make_backend = original


def env_lifespan(
    exported: Exported,
    on_ready: Callable[[], None] | None,
    on_error: Callable[[AtroposError], None] | None,
    cleanup: Callable[[], Any],
) -> Callable[[Any], Any]:
    """A served env's FastAPI lifespan: the env's `setup()` at startup (in the server's event loop; a failure goes
    to `on_error`, which stops the server and reports it, or raises without one), then `on_ready`; at shutdown
    `cleanup()` (awaited when it returns an awaitable)."""
    from atropos_cli.runs.envcall import call_env

    @asynccontextmanager
    async def lifespan(_: Any) -> AsyncIterator[None]:
        try:
            await call_env(exported.env, "setup", exported.env.setup())
        except AtroposError as exc:
            if on_error is None:
                raise
            on_error(exc)
            yield
            return
        if on_ready is not None:
            on_ready()
        yield
        done = cleanup()
        if asyncio.iscoroutine(done):
            await done

    return lifespan


def build_exported_env(env_spec: str, dotted_args: list[str], config_path: str | None) -> Exported:
    """Resolve ENV with its layered config and build it over the bridge: one rollout per episode."""
    from atropos_cli.env.base import env_error
    from atropos_cli.env.loading import resolve_run_config

    env_cls, _, env_config = resolve_run_config(env_spec, dotted_args, config_path, mode="process")
    if env_config.group_size != 1 and "--env.group_size" in " ".join(dotted_args):
        raise ConfigError(
            "an exported env plays one rollout per episode", hint="drop --env.group_size (the client makes groups)"
        )
    env_config = env_config.model_copy(update={"group_size": 1, "ensure_scores_are_not_same": False})
    check = getattr(env_cls, "check_config", None)
    if check is not None:
        check(env_config)
    bridge = BridgeBackend()
    server = ServerConfig(model_name=CLIENT_MODEL, base_url="openenv://client", max_retries=0, health_check=False)
    try:
        with _bridged(bridge):
            env = env_cls.build(env_config, [server])
    except AtroposError:
        raise
    except Exception as exc:
        raise env_error(env_cls, "__init__", exc, "fix the env's constructor") from None
    bridge.env = env
    description = env_cls.description or f"{env_cls.__name__} exported by atropos"
    return Exported(env=env, description=description)
