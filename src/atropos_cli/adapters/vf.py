"""`vf:NAME`: a verifiers (0.4.0, `verifiers.v1`) environment, its tasks answered by our model and scored by the
task's own `@vf.reward` and `@vf.metric` functions.

NAME is a taskset id as verifiers resolves it (an installed taskset package: `vf:vf_reverse_text`,
`vf:owner/name@version` as the hub names it); the env is built by `vf.load_environment` from
`vf.resolve_env_config({"taskset": {"id": NAME, **--env.taskset_args}})`, exactly as `vf-eval` builds it.
Each task is one chat turn, as verifiers' `null` harness plays a task without tools: the prompt (the task's
system prompt + prompt) goes through our inference router, the backend's own token ids are the rollout's
tokens (so they train), and each reply is put into a `vf.Trace` (prompt nodes + the sampled assistant node
with its token ids) that `task.score(trace)` scores: the score is verifiers' `trace.reward` (the weighted sum
of the rewards), the reward parts are each reward function's score and each metric.

Not supported (refused before any model loads, or a failed rollout): toolsets/MCP tools, harness programs
(bash, codex, ...) and sandbox runtimes (rewards that need a runtime), judges that call a model, multi-agent
or custom `Env` classes with their own `run()`, and multi-turn play (user simulators).
"""

from __future__ import annotations

import inspect
import itertools
import time
from collections.abc import Iterator
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.config import QUICK_GROUPS, EnvConfig
from atropos_cli.env.base import BaseEnv, SimpleEnv
from atropos_cli.errors import ConfigError, EnvLoadError, EnvNotFoundError
from atropos_cli.types import Message, ScoredGroup

__all__ = ["CONFIG", "VerifiersConfig", "VerifiersEnv", "load_env_class"]

INSTALL_HINT = "install verifiers beside atropos: pip install verifiers==0.4.0"


class VerifiersConfig(EnvConfig):
    total_steps: int = Field(QUICK_GROUPS, ge=1, description="Tasks (groups) a run collects (atropos process).")
    taskset_args: dict[str, Any] = Field(
        default_factory=dict,
        description="The taskset's config fields as JSON (vf-eval's --env.taskset.*), e.g. '{\"num_tasks\": 10}'.",
    )
    eval_tasks: int = Field(20, ge=1, description="Tasks of the eval split (atropos evaluate): the taskset's first N.")


CONFIG = VerifiersConfig


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise EnvLoadError("the vf: adapter needs the verifiers package (0.4.0)", hint=INSTALL_HINT) from None
    return vf


def load_environment(taskset_id: str, taskset_args: dict[str, Any]) -> Any:
    """`vf.load_environment` for a taskset id, with verifiers' errors as one line."""
    vf = _vf()
    try:
        config = vf.resolve_env_config({"taskset": {"id": taskset_id, **taskset_args}})
        return vf.load_environment(config)
    except ModuleNotFoundError as exc:
        raise EnvNotFoundError(
            f"vf:{taskset_id}: {exc}", hint="install the taskset's package (or put it on PYTHONPATH)"
        ) from None
    except Exception as exc:
        message = " ".join(str(exc).split())[:300]
        raise EnvLoadError(
            f"vf:{taskset_id}: vf.load_environment failed: {type(exc).__name__}: {message}",
            hint="check --env.taskset_args against the taskset's config",
        ) from None


def unsupported(env: Any, task: Any) -> list[str]:
    """What this adapter cannot run for a task: tools, runtime-bound rewards, model judges, custom envs."""
    vf = _vf()
    found = []
    if type(env) is not vf.SingleAgentEnv:
        found.append(f"a custom env class ({type(env).__name__}) with its own run()")
    if type(task).toolsets(task.config):
        found.append("toolsets (MCP tools)")
    if task.config.judges:
        found.append("judges (they call a model of their own)")
    needs_runtime = [
        fn.__name__
        for fn in (*task.hooks("reward"), *task.hooks("metric"))
        if (param := inspect.signature(fn).parameters.get("runtime")) is not None
        and param.default is inspect.Parameter.empty
    ]
    if needs_runtime:
        found.append(f"rewards that need a sandbox runtime ({', '.join(needs_runtime)})")
    return found


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
    parts = {name: float(r.score) for name, r in trace.rewards.items() if r is not None}
    for name, value in trace.metrics.items():
        if value is not None:
            parts[name if name not in parts else f"metric_{name}"] = float(value)
    return {"score": float(trace.reward), **parts}


class VerifiersEnv(SimpleEnv):
    taskset_id: ClassVar[str] = ""
    env_config_cls = VerifiersConfig

    @classmethod
    def check_config(cls, config: Any) -> None:
        """Build the env and look at its first task (no model loaded yet): what is not supported fails here."""
        env = load_environment(cls.taskset_id, config.taskset_args)
        first = next(iter(env.taskset), None)
        if first is None:
            raise ConfigError(f"vf:{cls.taskset_id} has no tasks", hint="check --env.taskset_args")
        missing = unsupported(env, first)
        if missing:
            raise ConfigError(
                f"vf:{cls.taskset_id} needs {'; '.join(missing)}: not supported by the vf: adapter",
                hint="the vf: adapter runs single-turn tasks scored by their own rewards (docs/envs-verifiers.md)",
            )

    def _vf_env(self) -> Any:
        if not hasattr(self, "_loaded"):
            self._loaded = load_environment(self.taskset_id, self.config.taskset_args)  # type: ignore[attr-defined]
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
        return self.scored_group(item, messages, generation, rewards, elapsed), []


def load_env_class(target: str) -> type[BaseEnv]:
    _vf()
    name = target.rsplit("/", 1)[-1].split("@", 1)[0]
    attrs = {
        "name": f"vf:{target}",
        "description": f"verifiers taskset {target} (single-turn, its own rewards)",
        "taskset_id": target,
        "__module__": __name__,
    }
    return type(f"Verifiers_{name.replace('-', '_')}", (VerifiersEnv,), attrs)
