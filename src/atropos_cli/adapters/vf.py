"""`vf:NAME`: a verifiers (0.4.0, `verifiers.v1`) environment, its tasks played by our model through verifiers'
own harnesses and envs, scored by the task's own `@vf.reward` and `@vf.metric` functions.

NAME is a taskset id as verifiers resolves it (an installed taskset package: `vf:vf_reverse_text`,
`vf:owner/name@version` as the hub names it); the env is built by `vf.load_environment` from
`vf.resolve_env_config({**--env.env_args, "taskset": {"id": NAME, **--env.taskset_args}})`, as `vf-eval`
builds it (`--env.env_args '{"id": "user-sim"}'` pairs the taskset with a multi-agent env).

Two ways a task is played:
- a task that verifiers' `null` harness plays in one chat turn (the single-agent env, no toolsets, no reward
  that needs a runtime) is answered here in-process: the prompt goes through our inference router as a chat,
  `n = group_size` replies in one request, each put into a `vf.Trace` (prompt nodes + the sampled assistant
  node with its token ids) that `task.score(trace)` scores;
- everything else (toolsets, other harnesses, custom and multi-agent `Env` classes with their own `run()`,
  user simulators) runs through verifiers itself: `group_size` concurrent `env.run_episode(task, ...)`,
  each harness program calling verifiers' interception server, whose model client is `vf_policy`'s: every
  turn is sampled by our router from token ids, so the trained tokens are exactly the sampled ones across
  turns. Seats run in verifiers' subprocess runtime with their programs on this interpreter (offline,
  `vf_runtime`) unless `--env.local_runtime false` or `env_args` names a runtime; a seat without a harness
  plays with `null` (the chat loop with the task's MCP tools) rather than verifiers' default `bash`.
A rollout trains the one trainable agent run of its episode (a modeled user is untrainable), on its one token
branch; the score is verifiers' `trace.reward` (the weighted sum of the rewards), the reward parts each
reward function's score and each metric.

Not supported (refused before any model loads): judges that call a model of their own.
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.config import QUICK_GROUPS, EnvConfig
from atropos_cli.env.base import BaseEnv, SimpleEnv
from atropos_cli.env.multiturn import gather_rollouts
from atropos_cli.errors import AtroposError, ConfigError, EnvLoadError, EnvNotFoundError
from atropos_cli.inference.base import Choice
from atropos_cli.tokens import MASKED, MASKED_LOGPROB
from atropos_cli.types import GroupMeta, Message, RolloutMeta, ScoredGroup

__all__ = ["CONFIG", "VerifiersConfig", "VerifiersEnv", "load_env_class"]

INSTALL_HINT = "install verifiers beside atropos: pip install verifiers==0.4.0"


class VerifiersConfig(EnvConfig):
    total_steps: int = Field(QUICK_GROUPS, ge=1, description="Tasks (groups) a run collects (atropos process).")
    taskset_args: dict[str, Any] = Field(
        default_factory=dict,
        description="The taskset's config fields as JSON (vf-eval's --env.taskset.*), e.g. '{\"num_tasks\": 10}'.",
    )
    eval_tasks: int = Field(20, ge=1, description="Tasks of the eval split (atropos evaluate): the taskset's first N.")
    env_args: dict[str, Any] = Field(
        default_factory=dict,
        description="verifiers' env config fields as JSON (vf-eval's --env.*): the env id ('{\"id\": \"user-sim\"}'), "
        'a seat\'s harness, runtime or max_turns (\'{"agent": {"max_turns": 4}}\').',
    )
    tool_parser: str = Field("hermes", description="How the model's reply text becomes tool calls (a tool parser).")
    local_runtime: bool = Field(
        True,
        description="Seats without a runtime in env_args run in verifiers' subprocess runtime, their harness "
        "programs on this interpreter (offline).",
    )


CONFIG = VerifiersConfig


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise EnvLoadError("the vf: adapter needs the verifiers package (0.4.0)", hint=INSTALL_HINT) from None
    return vf


def load_environment(
    taskset_id: str, taskset_args: dict[str, Any], env_args: dict[str, Any] | None = None, local_runtime: bool = False
) -> Any:
    """`vf.load_environment` for a taskset id (and verifiers env fields), with verifiers' errors as one line."""
    vf = _vf()
    data = {**(env_args or {}), "taskset": {"id": taskset_id, **taskset_args}}
    try:
        config = vf.resolve_env_config(data)
        config = vf.resolve_env_config(policy_seats(vf, config, data, local_runtime))
        return vf.load_environment(config)
    except ModuleNotFoundError as exc:
        raise EnvNotFoundError(
            f"vf:{taskset_id}: {exc}", hint="install the taskset's package (or put it on PYTHONPATH)"
        ) from None
    except AtroposError:
        raise
    except Exception as exc:
        message = " ".join(str(exc).split())[:300]
        raise EnvLoadError(
            f"vf:{taskset_id}: vf.load_environment failed: {type(exc).__name__}: {message}",
            hint="check --env.taskset_args and --env.env_args against the taskset's and env's config",
        ) from None


def policy_seats(vf: Any, config: Any, data: dict[str, Any], local_runtime: bool) -> dict[str, Any]:
    """The env config data with our policy's seating: one interception server (its model client is ours); a
    seat with no harness plays with `null` (verifiers would give it `bash`, which runs the model's commands);
    with `local_runtime`, each seat that `data` gives no runtime runs in the subprocess runtime."""
    from verifiers.v1.configs.agent import agent_config_fields

    seated = dict(data)
    interception = dict(seated.get("interception") or {})
    if interception.get("type", "server") != "server":
        raise ConfigError(
            f"vf:{config.taskset.id}: interception type {interception['type']!r} is not supported",
            hint="leave env_args' interception out: the vf: adapter serves every model call from one server",
        )
    seated["interception"] = {**interception, "type": "server"}
    default_is_bash = vf.default_harness_id(config.taskset.id) == "bash"
    for name, seat in agent_config_fields(config).items():
        given = dict(seated.get(name) or {})
        if local_runtime:
            given.setdefault("runtime", {"type": "subprocess"})
        if seat.harness is None and default_is_bash:
            given.setdefault("harness", {"id": "null"})
        seated[name] = given
    return seated


def unsupported(task: Any) -> list[str]:
    """What this adapter cannot run for a task: judges that call a model of their own."""
    return ["judges (they call a model of their own)"] if task.config.judges else []


def plays_in_one_turn(env: Any, task: Any) -> bool:
    """Whether verifiers would play `task` as one chat turn: the single-agent env with the `null` harness, no
    toolsets (task or taskset), no reward or metric that needs the runtime."""
    vf = _vf()
    if type(env) is not vf.SingleAgentEnv or env.config.agent_harnesses()["agent"].id != "null":
        return False
    if type(task).toolsets(task.config) or env.taskset.toolsets(env.taskset.config):
        return False
    return not any(
        (param := inspect.signature(fn).parameters.get("runtime")) is not None
        and param.default is inspect.Parameter.empty
        for fn in (*task.hooks("reward"), *task.hooks("metric"))
    )


def task_messages(task: Any) -> list[Message]:
    """The task's opening chat as plain messages (text content only)."""
    from verifiers.v1.types import content_text

    data = task.data
    messages: list[Message] = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    if isinstance(data.prompt, str):
        messages.append({"role": "user", "content": data.prompt})
    else:
        messages.extend({"role": m.role, "content": content_text(getattr(m, "content", ""))} for m in data.prompt or [])
    return messages


async def score_reply(task: Any, messages: list[Message], text: str, token_ids: list[int] | None) -> dict[str, float]:
    """Score one reply with the task's own rewards and metrics: {"score": trace.reward, name: value, ...}."""
    vf = _vf()
    from verifiers.v1.graph import MessageNode
    from verifiers.v1.state import state_cls

    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        state=state_cls(type(task))(),
        agent=vf.AgentInfo(config=vf.AgentConfig(), name="atropos"),
    )
    kinds = {"system": vf.SystemMessage, "user": vf.UserMessage, "assistant": vf.AssistantMessage}
    for index, message in enumerate(messages):
        node = MessageNode(
            parent=index - 1 if index else None, message=kinds[message["role"]](content=message["content"])
        )
        trace.nodes.append(node)
    reply = vf.AssistantMessage(content=text)
    trace.nodes.append(MessageNode(parent=len(messages) - 1, message=reply, sampled=True, token_ids=token_ids or []))
    await task.score(trace)
    return trace_parts(trace)


def trace_parts(trace: Any) -> dict[str, float]:
    """{"score": trace.reward, each reward's score, each metric (metric_NAME when a reward has its name)}."""
    parts = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
    for name, value in trace.metrics.items():
        if value is not None:
            parts[name if name not in parts else f"metric_{name}"] = float(value)
    return {"score": float(trace.reward), **parts}


class RolloutFailed(AtroposError):
    """A verifiers episode that gives no trainable rollout (its error, or a shape this adapter cannot train)."""


@dataclass
class Played:
    """One episode's trainable run: its token branch and its scores."""

    messages: list[Message]
    tokens: list[int]
    masks: list[int]
    logprobs: list[float] | None
    parts: dict[str, float]
    finish_reason: str | None
    turns: int


def played_from_episode(episode: Any) -> Played:
    """The episode's one trainable agent run, on its one token branch: ids as sampled (masks = id on sampled
    tokens, -100 elsewhere), logprobs where every sampled turn has them."""
    from verifiers.v1.dialects.chat import message_to_wire

    if not episode.ok:
        errors = [*episode.errors, *(e for t in episode.traces for e in t.errors)]
        first = errors[0] if errors else None
        detail = f"{first.type}: {' '.join(first.message.split())[:300]}" if first else "no error recorded"
        raise RolloutFailed(f"verifiers episode failed: {detail}")
    runs = [t for t in episode.traces if t.agent is None or t.agent.trainable]
    if len(runs) != 1:
        raise RolloutFailed(f"the episode has {len(runs)} trainable agent runs; the vf: adapter trains one per rollout")
    trace = runs[0]
    branches = [b for b in trace.branches if b.trainable]
    if len(branches) != 1:
        raise RolloutFailed(
            f"the agent run forked into {len(branches)} token branches (its history was rewritten); "
            "the vf: adapter trains one token sequence per rollout"
        )
    branch = branches[0]
    tokens, sampled = branch.token_ids, branch.sampled_mask
    if not any(sampled):
        raise RolloutFailed("the agent run sampled no tokens")
    sampled_nodes = [n for n in branch.nodes if n.sampled]
    with_logprobs = all(len(n.logprobs) == sum(n.mask) for n in sampled_nodes)
    calls = [c for c in branch.calls if c.finish_reason is not None]
    return Played(
        messages=[message_to_wire(m) for m in branch.messages],
        tokens=list(tokens),
        masks=[t if s else MASKED for t, s in zip(tokens, sampled, strict=True)],
        logprobs=[lp if s else MASKED_LOGPROB for lp, s in zip(branch.logprobs, sampled, strict=True)]
        if with_logprobs
        else None,
        parts=trace_parts(trace),
        finish_reason=calls[-1].finish_reason if calls else None,
        turns=len(sampled_nodes),
    )


class VerifiersEnv(SimpleEnv):
    taskset_id: ClassVar[str] = ""
    env_config_cls = VerifiersConfig

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Build the env and look at its first task (no model loaded yet): what is not supported fails here."""
        env = load_environment(cls.taskset_id, config.taskset_args, config.env_args, config.local_runtime)
        first = next(iter(env.taskset), None)
        if first is None:
            raise ConfigError(f"vf:{cls.taskset_id} has no tasks", hint="check --env.taskset_args")
        missing = unsupported(first)
        if missing:
            raise ConfigError(
                f"vf:{cls.taskset_id} needs {'; '.join(missing)}: not supported by the vf: adapter",
                hint="the vf: adapter's policy is the model under training (docs/envs-verifiers.md)",
            )
        from atropos_cli.compat.tool_parsers import get_parser

        get_parser(config.tool_parser)

    def _vf_env(self) -> Any:
        if not hasattr(self, "_loaded"):
            config: VerifiersConfig = self.config  # type: ignore[assignment]
            if config.local_runtime:
                from atropos_cli.adapters.vf_runtime import run_programs_here

                run_programs_here()
            self._loaded = load_environment(self.taskset_id, config.taskset_args, config.env_args, config.local_runtime)
        return self._loaded

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        taskset = self._vf_env().taskset
        if split == "train":
            tasks = taskset.shuffle(seed=self.config.seed) if taskset.bounded else taskset
        else:
            tasks = itertools.islice(taskset, self.config.eval_tasks)  # type: ignore[attr-defined]
        for task in tasks:
            yield {"id": f"{split}-{task.data.idx}", "task": task}

    def messages_for(self, item: dict[str, Any]) -> list[Message]:
        return task_messages(item["task"])

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[ScoredGroup | None, list[Any]]:
        if plays_in_one_turn(self._vf_env(), item["task"]):
            return await self._one_turn_group(item), []
        return await self._episodes_group(item), []

    async def _one_turn_group(self, item: dict[str, Any]) -> ScoredGroup | None:
        messages = self.messages_for(item)
        started = time.perf_counter()
        generation = await self.server.chat_completion(
            messages=messages, **self.sampling_params().model_dump(exclude_none=True)
        )
        rewards: list[float | dict[str, float] | BaseException] = []
        for choice in generation.choices:
            try:
                rewards.append(await score_reply(item["task"], messages, choice.text, choice.token_ids))
            except Exception as exc:  # a task reward that raises is one failed rollout
                rewards.append(exc)
        elapsed = time.perf_counter() - started
        return self.scored_group(item, messages, generation, rewards, elapsed)

    async def _episodes_group(self, item: dict[str, Any]) -> ScoredGroup | None:
        """`group_size` verifiers episodes of the item's task, every model call sampled by our policy."""
        from atropos_cli.adapters.vf_policy import policy_client, seat_policy

        if self.tokenizer is None:
            raise EnvLoadError(
                f"{self.name}: a multi-turn verifiers rollout is sampled from token ids and needs a tokenizer",
                hint="pass --env.tokenizer_name (the served model's tokenizer)",
            )
        vf = _vf()
        env = self._vf_env()
        ctx = vf.ModelContext(
            model=getattr(self.server, "model_name", None) or "atropos",
            client=vf.TrainClientConfig(base_url="http://127.0.0.1/atropos-policy"),
        )
        policy = policy_client(self.tokenizer, self._sample, self.config.tool_parser)  # type: ignore[attr-defined]
        started = time.perf_counter()
        async with env.serving():
            seat_policy(env._interception, ctx.client, policy)

            async def play() -> Played:
                return played_from_episode(await env.run_episode(item["task"], ctx))

            plays = (play() for _ in range(self.config.group_size))
            played = await gather_rollouts(self.name, self.item_id(item), plays)
        if not played:
            return None
        return self._group(item, played, time.perf_counter() - started)

    async def _sample(self, prompt_ids: list[int]) -> Choice:
        params = self.sampling_params(n=1).model_dump(exclude_none=True)
        generation = await self.server.completion(prompt=prompt_ids, **params)
        return generation.choices[0]

    def _group(self, item: dict[str, Any], played: list[Played], elapsed: float) -> ScoredGroup:
        logprobs = [p.logprobs for p in played]
        return ScoredGroup(
            tokens=[p.tokens for p in played],
            masks=[p.masks for p in played],
            inference_logprobs=logprobs if all(lp is not None for lp in logprobs) else None,
            scores=[p.parts["score"] for p in played],
            messages=[p.messages for p in played],
            meta=GroupMeta(
                env=self.name,
                env_version=self.version,
                item_id=item["id"],
                failed_rollouts=self.config.group_size - len(played),
                duration_s=round(elapsed, 4),
                rollouts=[
                    RolloutMeta(
                        finish_reason=p.finish_reason,
                        reward_parts=p.parts,
                        completion_tokens=sum(m != MASKED for m in p.masks),
                        turns=p.turns,
                    )
                    for p in played
                ],
            ),
        )


def load_env_class(target: str) -> type[BaseEnv]:
    _vf()
    name = target.rsplit("/", 1)[-1].split("@", 1)[0]
    attrs = {
        "name": f"vf:{target}",
        "description": f"verifiers taskset {target} (its harnesses and envs, its own rewards)",
        "taskset_id": target,
        "__module__": __name__,
    }
    return type(f"Verifiers_{name.replace('-', '_')}", (VerifiersEnv,), attrs)
