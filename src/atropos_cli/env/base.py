"""The environment contract: `BaseEnv` (Atropos' names) and `SimpleEnv` (items + prompt + reward).

Flow: `get_next_item()` -> `collect_trajectories(item)` -> a `ScoredGroup` (or an Atropos-style dict, which
the runner validates into one). `self.server` is the router over the configured inference servers and
`self.tokenizer` is loaded from `config.tokenizer_name` (or the local backend's model) on first use.

An Atropos env ports by changing its imports: `BaseEnv`, `EnvConfig` (alias `BaseEnvConfig`),
`ServerConfig` (alias `APIServerConfig`), `ScoredGroup` (alias `ScoredDataGroup`), and the same method names.

A failed rollout is data: `record_failure()` files it into the group's failure list (a context variable the
runner sets per group), and the runner writes it to failures.jsonl.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import random
import time
import traceback
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, ClassVar

from pydantic import ValidationError

from atropos_cli.config import EnvConfig, ServerConfig
from atropos_cli.env.shape import pair_problem, shape_error
from atropos_cli.errors import AtroposError, ConfigError, EnvLoadError
from atropos_cli.inference.base import Generation, SamplingParams
from atropos_cli.tokens import build_rollout_tokens
from atropos_cli.types import GroupMeta, Message, RolloutFailure, RolloutMeta, ScoredGroup, describe_validation_error

__all__ = [
    "BaseEnv",
    "SimpleEnv",
    "Item",
    "record_failure",
    "failure_sink",
    "filter_sink",
    "record_filtered",
    "env_error",
    "BaseEnvConfig",
    "APIServerConfig",
    "ScoredDataGroup",
]

Item = Any
BaseEnvConfig = EnvConfig
APIServerConfig = ServerConfig
ScoredDataGroup = ScoredGroup

failure_sink: contextvars.ContextVar[list[RolloutFailure] | None] = contextvars.ContextVar(
    "atropos_failure_sink", default=None
)
# the reasons the env (or a layer on it, such as atroposlib's handle_send_to_api) dropped groups of the current item
filter_sink: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("atropos_filter_sink", default=None)


_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def record_filtered(reason: str) -> None:
    """Count one group of the current item as filtered by the env for `reason` (not a failure)."""
    sink = filter_sink.get()
    if sink is not None:
        sink.append(reason)


def record_failure(exc: BaseException, *, env: str | None, item_id: str | None, rollout_index: int | None) -> None:
    """File a failed rollout into the current group's failure list (or drop it if no runner is listening)."""
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    if isinstance(exc, AtroposError):
        summary = f"{type(exc).__name__}: {exc}"
    frames = traceback.extract_tb(exc.__traceback__)
    ours = bool(frames) and _PACKAGE_DIR in Path(frames[-1].filename).resolve().parents
    if frames and not (ours and isinstance(exc, AtroposError)):  # our own errors name what they are about
        last = frames[-1]
        summary += f" (at {last.filename.rsplit('/', 1)[-1]}:{last.lineno} in {last.name})"
    failure = RolloutFailure(
        kind="rollout" if rollout_index is not None else "group",
        env=env,
        item_id=item_id,
        rollout_index=rollout_index,
        error_type=type(exc).__name__,
        error=summary,
        created_at=time.time(),
    )
    sink = failure_sink.get()
    if sink is not None:
        sink.append(failure)


class BaseEnv:
    """Atropos' BaseEnv contract. Subclass and implement `setup`, `get_next_item` and one of
    `collect_trajectories` / `collect_trajectory`; `evaluate` is optional."""

    name: ClassVar[str] = "env"
    version: ClassVar[str] = "0"
    description: ClassVar[str] = ""
    env_config_cls: ClassVar[type[EnvConfig]] = EnvConfig
    # Set by `atropos serve` from the trajectory API's registration answer (Atropos' names): the trainer's
    # checkpoint directory, this env's unique name under it, and the current trainer step.
    checkpoint_dir: str | None = None
    wandb_prepend: str | None = None
    curr_step: int = 0

    def __init__(self, config: EnvConfig, server: Any, tokenizer: Any | None = None) -> None:
        self.config = config
        self.server = server
        self._tokenizer = tokenizer
        self._tokenizer_loaded = tokenizer is not None
        self.rng = random.Random(config.seed)

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[ServerConfig]]:
        return cls.env_config_cls(), []

    @classmethod
    def check_config(cls, config: EnvConfig) -> None:
        """Cheap checks run before any server or model loads (raise ConfigError): e.g. that a hub dataset is
        reachable, so a run that cannot start fails in seconds. Optional; not part of Atropos' API."""

    # ---- hooks of the loader and the runner (the Atropos compatibility layer overrides them) ----------------
    @classmethod
    def mode_defaults(cls, mode: str) -> dict[str, Any]:
        """Env config values a run mode ("process", "evaluate", "serve") sets below YAML and flags."""
        return {}

    @classmethod
    def server_defaults(cls, servers: Any) -> list[ServerConfig]:
        """config_init's second value as a list of server configs."""
        return list(servers)

    @classmethod
    def teacher_defaults(cls) -> list[ServerConfig]:
        """The distillation teacher's servers an env declares (none here; TeacherDistillationEnv has them)."""
        return []

    @classmethod
    def build(cls, config: EnvConfig, servers: list[ServerConfig], teacher: Sequence[ServerConfig] = ()) -> BaseEnv:
        """The env over a router of `servers` (what `atropos process|serve|evaluate|train` run)."""
        from atropos_cli.inference.router import ServerManager

        if teacher:
            raise ConfigError(
                f"env {cls.name!r} takes no teacher server (--teacher.* / YAML teacher:)",
                hint="only a TeacherDistillationEnv uses a teacher",
            )
        return cls(config, ServerManager(servers))

    async def after_group(self, result: Any, item: Item) -> Any:
        """Called by the runner with what postprocess_histories returned; returns the group(s) to keep."""
        return result

    @property
    def tokenizer(self) -> Any | None:
        """The tokenizer of `config.tokenizer_name` (or of the local model); None when there is none."""
        if not self._tokenizer_loaded:
            self._tokenizer_loaded = True
            name = self.config.tokenizer_name or getattr(self.server, "tokenizer_name", None)
            if name and name != "none":
                from atropos_cli.inference.tokenizer import load_tokenizer

                self._tokenizer = load_tokenizer(name)
            else:
                self._tokenizer = getattr(self.server, "tokenizer", None)
        return self._tokenizer

    async def setup(self) -> None:
        """Load datasets and anything else the env needs; called once before the first item."""

    async def get_next_item(self) -> Item | None:
        raise NotImplementedError(f"{type(self).__name__} must implement get_next_item()")

    def restart_items(self) -> bool:
        """Start the train items over (one more epoch) once `get_next_item` returned None; False when this env
        cannot (`atropos train --on-exhausted cycle` then stops, and says why). Not part of Atropos' API."""
        return False

    async def collect_trajectory(self, item: Item) -> tuple[dict[str, Any] | None, list[Item]]:
        raise NotImplementedError(
            f"{type(self).__name__} must implement collect_trajectories() or collect_trajectory()"
        )

    async def collect_trajectories(self, item: Item) -> tuple[ScoredGroup | dict | list | None, list[Item]]:
        """Default: run `collect_trajectory` group_size times concurrently and stack the results."""
        results = await asyncio.gather(
            *(self.collect_trajectory(item) for _ in range(self.config.group_size)), return_exceptions=True
        )
        stacked: dict[str, list[Any]] = {}
        group_overrides: dict[str, Any] = {}
        backlog: list[Item] = []
        for index, result in enumerate(results):
            if isinstance(result, BaseException):
                record_failure(result, env=self.name, item_id=None, rollout_index=index)
                continue
            if problem := pair_problem(result, "rollout or None"):
                raise shape_error(self, "collect_trajectory", problem)
            rollout, more = result
            backlog.extend(more or [])
            if rollout is None:
                continue
            for key, value in dict(rollout).items():
                if key == "group_overrides":
                    group_overrides.update(value or {})
                elif key in ("scores", "score"):
                    stacked.setdefault("scores", []).append(value)
                elif value is not None:
                    stacked.setdefault(key, []).append(value)
        if not stacked.get("scores"):
            return None, backlog
        group: dict[str, Any] = dict(stacked)
        if group_overrides:
            group["group_overrides"] = group_overrides
        return group, backlog

    async def postprocess_histories(self, trajectories: Any) -> Any:
        return trajectories

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float] | None:
        return None

    # ---- env checkpoints (Atropos' hooks; `atropos serve` calls them every `checkpoint_interval` steps) --------
    def save_checkpoint(self, step: int, data: dict[str, Any] | None = None) -> None:
        """Persist `data` (JSON) as this env's state at trainer step `step`. The base env has no state of its
        own, so it writes nothing without `data`; an env with state overrides this and calls
        `super().save_checkpoint(step, {"iter": self.iter})`. Written atomically (temp file, then rename)."""
        path = self._checkpoint_path(step)
        if data is None or path is None:
            return
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data), encoding="utf-8")
        tmp.replace(path)

    def load_checkpoint(self) -> None:
        """Restore the state saved for `curr_step` (each key becomes an attribute); nothing if none was saved."""
        path = self._checkpoint_path(self.curr_step)
        if path is None or not path.is_file():
            return
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(
                f"env checkpoint {str(path)!r} is not valid JSON: {exc}", hint="delete it to start fresh"
            ) from None
        if not isinstance(data, dict):
            raise ConfigError(f"env checkpoint {str(path)!r} is not a JSON object", hint="delete it to start fresh")
        for key, value in data.items():
            setattr(self, key, value)

    def _checkpoint_path(self, step: int) -> Path | None:
        if not self.checkpoint_dir:
            return None
        folder = Path(self.checkpoint_dir) / "env_checkpoints" / (self.wandb_prepend or self.name)
        return folder / f"step-{step}.json"

    async def cleanup(self) -> None:
        """Called after every group."""

    def item_id(self, item: Item) -> str | None:
        if isinstance(item, dict):
            for key in ("id", "item_id", "idx"):
                if key in item:
                    return str(item[key])
        return None

    def sampling_params(self, n: int | None = None, **overrides: Any) -> SamplingParams:
        params: dict[str, Any] = {
            "n": n or self.config.group_size,
            "temperature": self.config.temperature,
            "top_p": self.config.top_p,
            "max_tokens": self.config.max_token_length,
        }
        params.update(overrides)
        return SamplingParams(**params)


class SimpleEnv(BaseEnv):
    """The short path: define `items(split)`, `prompt(item)` and `reward(completion, item)`.

    `reward` returns a float or a dict of named parts (summed into the score unless it has a "score" key).
    A reward that raises marks that rollout failed (recorded with its traceback summary); the group keeps
    the others.
    """

    system_prompt: ClassVar[str | None] = None
    stop: ClassVar[list[str] | None] = None

    def items(self, split: str) -> Iterable[Item]:
        raise NotImplementedError(f"{type(self).__name__} must implement items(split)")

    def prompt(self, item: Item) -> list[Message] | str:
        raise NotImplementedError(f"{type(self).__name__} must implement prompt(item)")

    def reward(self, completion: str, item: Item) -> float | dict[str, float]:
        raise NotImplementedError(f"{type(self).__name__} must implement reward(completion, item)")

    async def setup(self) -> None:
        self._train_items: Iterator[Item] = iter(self.items("train"))

    async def get_next_item(self) -> Item | None:
        return next(self._train_items, None)

    def restart_items(self) -> bool:
        self._train_items = iter(self.items("train"))
        return True

    def messages_for(self, item: Item) -> list[Message]:
        prompt = self.prompt(item)
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt and not any(m.get("role") == "system" for m in messages):
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    async def collect_trajectories(self, item: Item) -> tuple[ScoredGroup | None, list[Item]]:
        messages = self.messages_for(item)
        started = time.perf_counter()
        generation = await self.server.chat_completion(
            messages=messages, **self.sampling_params(stop=self.stop).model_dump(exclude_none=True)
        )
        elapsed = time.perf_counter() - started
        return self.score(item, messages, generation, elapsed), []

    def score(
        self, item: Item, messages: list[Message], generation: Generation, elapsed: float = 0.0
    ) -> ScoredGroup | None:
        """Score each choice with `reward`; failed rewards are recorded and left out of the group."""
        rewards: list[float | dict[str, float] | BaseException] = []
        for choice in generation.choices:
            try:
                rewards.append(self.reward(choice.text, item))
            except Exception as exc:  # a reward that raises is one failed rollout, not a crashed run
                rewards.append(exc)
        return self.scored_group(item, messages, generation, rewards, elapsed)

    def scored_group(
        self,
        item: Item,
        messages: list[Message],
        generation: Generation,
        rewards: Sequence[float | dict[str, float] | BaseException],
        elapsed: float = 0.0,
    ) -> ScoredGroup | None:
        """The group of a generation's choices and their rewards (one per choice, as `reward` returns them; an
        exception marks that rollout failed: recorded and left out). Envs whose rewards are computed otherwise
        (async, by another framework) build their group here too."""
        item_id = self.item_id(item)
        kept: list[tuple[int, float, dict[str, float] | None]] = []
        for index, value in enumerate(rewards):
            try:
                if isinstance(value, BaseException):
                    record_failure(value, env=self.name, item_id=item_id, rollout_index=index)
                    continue
                score, parts = _split_reward(value)
            except Exception as exc:
                record_failure(exc, env=self.name, item_id=item_id, rollout_index=index)
                continue
            kept.append((index, score, parts))
        if not kept:
            return None
        choices = [generation.choices[i] for i, _, _ in kept]
        chats = [[*messages, {"role": "assistant", "content": c.text}] for c in choices]
        tokens = build_rollout_tokens(self.tokenizer, messages, generation, [i for i, _, _ in kept])
        return ScoredGroup(
            tokens=tokens.tokens if tokens else [],
            masks=tokens.masks if tokens else [],
            inference_logprobs=tokens.logprobs if tokens else None,
            scores=[s for _, s, _ in kept],
            messages=chats,
            meta=GroupMeta(
                env=self.name,
                env_version=self.version,
                item_id=item_id,
                model=generation.model,
                failed_rollouts=len(generation.choices) - len(kept),
                duration_s=round(elapsed, 4),
                tokens_missing=tokens is None,
                rollouts=[
                    RolloutMeta(
                        finish_reason=c.finish_reason,
                        reward_parts=parts,
                        completion_tokens=len(c.token_ids) if c.token_ids is not None else None,
                    )
                    for c, (_, _, parts) in zip(choices, kept, strict=True)
                ],
            ),
        )

    async def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float] | None:
        return None


def _split_reward(value: float | dict[str, float]) -> tuple[float, dict[str, float] | None]:
    """(score, parts) of what `reward` returned; a score no trainer can use (non-finite, beyond ±1e6: see
    `api.trainable`) raises, and so fails that rollout with the reason."""
    from atropos_cli.types import value_problem

    if isinstance(value, dict):
        parts = {str(k): float(v) for k, v in value.items()}
        score = float(parts["score"] if "score" in parts else sum(parts.values()))
        problem = value_problem("reward", [score, *parts.values()])
    elif isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"reward must return a float or a dict of floats, got {type(value).__name__}")
    else:
        score, parts = float(value), None
        problem = value_problem("reward", [score])
    if problem is not None:
        raise ValueError(f"{problem}: rewards must be finite and within that bound")
    return score, parts


def env_error(env_cls: type, step: str, exc: BaseException, hint: str) -> EnvLoadError:
    """One line for an exception raised by env code: the env file and line it came from, the step, the error."""
    import inspect

    try:
        source = inspect.getfile(env_cls)
    except (TypeError, OSError):
        source = ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f.filename == source]
    where = f"{source}:{frames[-1].lineno}" if frames else source or env_cls.__name__
    return EnvLoadError(f"{where}: {env_cls.__name__}.{step} failed: {_one_line(exc)}", hint=hint)


def _one_line(exc: BaseException) -> str:
    """`Type: message` on one line (a pydantic error: its first field path and message)."""
    if isinstance(exc, ValidationError):
        return f"{type(exc).__name__}: {describe_validation_error(exc)}"
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
