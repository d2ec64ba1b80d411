"""`harness:PROGRAM`: an agent program (a harness) is the policy; each rollout runs it against the recording proxy.

A group of an item (a task: one JSON object of `--env.data_path`) starts the proxy on a free 127.0.0.1 port,
then runs `group_size` copies of the program concurrently, each in a fresh working directory, with:
- `OPENAI_BASE_URL` (and `OPENAI_API_BASE`, older clients' name) = its own session's endpoint,
  `OPENAI_API_KEY` = the proxy's key (an OpenAI client picks both up), `ATROPOS_MODEL` = the policy's model
  name, `ATROPOS_TASK` = the task as JSON.
The program talks to the model as to any OpenAI-compatible server (tools included, see `proxy`); the proxy
records every call's token ids. When the program exits (0, within `--env.timeout_s`), `score(task, result)`
gives the rollout's score: by default the `--env.verifier` program, which reads the rollout as JSON on stdin
(`task`, `messages`, `exit_code`, `stdout`, `workdir`, `calls`, `drift`) and prints a number or
`{"score": x, "parts": {...}}` on its last line. An env file may subclass `HarnessEnv` (setting `program`) and
override `score` instead.

Rows: one per session segment (`session`), all with the rollout's score: one row when the harness only
appends to its chat; a harness that rewrites its history gives more, and each rollout's `meta.rollouts[i]`
lists the drift (`drift`), the number of calls and whether every trained token is a sampled one (`exact`).
A program that fails (non-zero exit, past the timeout, no model call, a verifier that fails) fails that
rollout only: a failure record, the group keeps the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import os
import secrets
import signal
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from pydantic import Field

from atropos_cli.adapters.harness.session import Drift, HarnessRow
from atropos_cli.adapters.harness.settings import ProxySettings
from atropos_cli.config import QUICK_GROUPS, EnvConfig
from atropos_cli.env.multiturn import MultiTurnEnv
from atropos_cli.errors import AtroposError, ConfigError
from atropos_cli.tokens import MASKED
from atropos_cli.types import GroupMeta, Message, RolloutMeta, ScoredGroup

__all__ = ["HarnessConfig", "HarnessEnv", "HarnessResult", "HarnessFailed", "command_for"]

OUTPUT_CAP = 1 << 20  # bytes of a program's stdout/stderr kept (the tail); the rest is read and dropped
_proxy_url: contextvars.ContextVar[str] = contextvars.ContextVar("harness_proxy_url")


class HarnessFailed(AtroposError):
    """The harness program or the verifier failed one rollout (a failure record, never a crash)."""


class HarnessConfig(EnvConfig):
    total_steps: int = Field(QUICK_GROUPS, ge=1, description="Groups a run collects (atropos process).")
    args: list[str] = Field(default_factory=list, description="Arguments after the harness program, as JSON.")
    verifier: str | None = Field(
        None, description="Program that scores a finished rollout (JSON on stdin, a number on its last line)."
    )
    timeout_s: float = Field(300.0, gt=0, description="Seconds one harness run may take; then it is killed.")
    tool_parser: str = Field("hermes", description="The policy family's tool-call format (hermes, qwen, mistral...).")
    max_calls: int = Field(64, ge=1, description="Most model calls one harness run may make.")
    harness_sampling: bool = Field(
        False, description="Sample at the harness's own temperature/top_p (default: --env.temperature/--env.top_p)."
    )


@dataclass
class HarnessResult:
    """A finished harness run, as `score` sees it."""

    task: dict[str, Any]
    exit_code: int
    stdout: str
    stderr: str
    workdir: Path
    rows: list[HarnessRow]
    drift: list[Drift]
    calls: int

    @property
    def messages(self) -> list[Message]:
        """The conversation of the last segment (the one the harness ended on)."""
        return self.rows[-1].messages if self.rows else []

    def verifier_input(self) -> dict[str, Any]:
        return {
            "task": self.task, "messages": self.messages, "exit_code": self.exit_code, "stdout": self.stdout,
            "workdir": str(self.workdir), "calls": self.calls, "drift": [d.model_dump() for d in self.drift],
        }  # fmt: skip


@dataclass
class _Played:
    result: HarnessResult
    score: float
    parts: dict[str, float] | None


def command_for(program: str, args: list[str]) -> list[str]:
    """argv of a program: a .py file runs with this Python, anything else must be executable."""
    path = Path(program).expanduser().resolve()
    return [sys.executable, str(path), *args] if path.suffix == ".py" else [str(path), *args]


def check_program(program: str, what: str) -> None:
    path = Path(program).expanduser()
    if not path.is_file():
        raise ConfigError(f"{what} {program!r} does not exist", hint=f"give the path of the {what} program")
    if path.suffix != ".py" and not os.access(path, os.X_OK):
        raise ConfigError(f"{what} {program!r} is not executable", hint=f"chmod +x {program}, or use a .py file")


async def _tail(stream: asyncio.StreamReader) -> str:
    kept = b""
    while chunk := await stream.read(65536):
        kept = (kept + chunk)[-OUTPUT_CAP:]
    return kept.decode("utf-8", errors="replace")


async def run_program(argv: list[str], env: dict[str, str], cwd: Path, stdin: bytes | None, timeout: float,
                      what: str) -> tuple[int, str, str]:  # fmt: skip
    """Run a program to its end (its whole process group killed past `timeout`): (exit code, stdout, stderr)."""
    process = await asyncio.create_subprocess_exec(
        *argv, cwd=cwd, env=env, start_new_session=True, stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    try:
        if stdin:
            process.stdin.write(stdin)
        process.stdin.close()
        async with asyncio.timeout(timeout):
            out, err = await asyncio.gather(_tail(process.stdout), _tail(process.stderr))
            code = await process.wait()
    except TimeoutError:
        raise HarnessFailed(f"the {what} ran past {timeout:g}s and was killed", hint="raise --env.timeout_s") from None
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()
    return code, out, err


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def parse_verdict(stdout: str) -> tuple[float, dict[str, float] | None]:
    """The verifier's last line: a number, or `{"score": x, "parts": {...}}`."""
    line = _last_line(stdout)
    try:
        value = json.loads(line)
        if isinstance(value, dict):
            parts = value.get("parts")
            return float(value["score"]), {k: float(v) for k, v in parts.items()} if parts else None
        return float(value), None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HarnessFailed(
            f"the verifier's last line is not a score: {line[:200]!r}",
            hint='print a number, or {"score": 1.0, "parts": {...}}, as the last line',
        ) from None


class HarnessEnv(MultiTurnEnv):
    """Rollouts are runs of `program` (a harness) against the recording proxy; see the module docstring."""

    name: ClassVar[str] = "harness"
    description: ClassVar[str] = "an agent program (harness) as the policy, through the recording proxy"
    env_config_cls = HarnessConfig
    program: ClassVar[str | None] = None

    @classmethod
    def check_config(cls, config: EnvConfig) -> None:
        assert isinstance(config, HarnessConfig)
        if cls.program is None:
            raise ConfigError(f"env {cls.name!r} names no harness program", hint="set `program` on the class")
        check_program(cls.program, "harness")
        if config.verifier:
            check_program(config.verifier, "verifier")
        elif cls.score is HarnessEnv.score:
            raise ConfigError(
                f"{cls.name} has nothing to score its rollouts with",
                hint="pass --env.verifier PROGRAM, or subclass HarnessEnv and override score(task, result)",
            )
        if not config.data_path:
            raise ConfigError(
                f"{cls.name} needs tasks", hint="pass --env.data_path tasks.jsonl (one JSON object a line)"
            )

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        from atropos_cli.envs._shared.data import cycle_shuffled, load_local_records

        rows = load_local_records(str(self.config.data_path))
        if not rows:
            raise ConfigError(f"{self.config.data_path}: no tasks", hint="one JSON object a line")
        tasks = [{"id": str(row.get("id", f"task-{i}")), **row} for i, row in enumerate(rows)]
        return cycle_shuffled(tasks, self.config.seed) if split == "train" else iter(tasks)

    def _proxy(self) -> Any:
        proxy = getattr(self, "_recording_proxy", None)
        if proxy is None:
            from atropos_cli.adapters.harness.proxy import Proxy, create_proxy_app

            config: HarnessConfig = self.config  # type: ignore[assignment]
            if self.tokenizer is None:
                raise ConfigError(
                    f"{self.name} needs the policy's tokenizer to record token ids",
                    hint="pass --env.tokenizer_name NAME_OR_DIR (the served model's)",
                )
            sampling = {} if config.harness_sampling else {"temperature": config.temperature, "top_p": config.top_p}
            settings = ProxySettings(
                tool_parser=config.tool_parser, max_tokens=config.max_token_length, max_calls=config.max_calls,
                **sampling,
            )  # fmt: skip
            proxy = self._recording_proxy = Proxy(self.server, self.tokenizer, settings)
            self._proxy_key = secrets.token_hex(16)
            self._proxy_app = create_proxy_app(proxy, self._proxy_key)
        return proxy

    @contextlib.asynccontextmanager
    async def _proxy_running(self) -> AsyncIterator[str]:
        """The proxy served on a free 127.0.0.1 port for one group (in this event loop), stopped after."""
        from atropos_cli.adapters.harness.proxy import serve_in_loop

        self._proxy()
        server, task, url = await serve_in_loop(self._proxy_app)
        try:
            yield url
        finally:
            server.should_exit = True
            await task

    async def collect_trajectories(self, item: Any) -> tuple[ScoredGroup | None, list[Any]]:
        async with self._proxy_running() as url:
            token = _proxy_url.set(url)
            try:
                return await super().collect_trajectories(item)
            finally:
                _proxy_url.reset(token)

    async def play(self, item: dict[str, Any]) -> _Played:
        proxy = self._proxy()
        session_id = proxy.open()
        config: HarnessConfig = self.config  # type: ignore[assignment]
        base_url = f"{_proxy_url.get()}/s/{session_id}/v1"
        env = {
            **os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_BASE": base_url, "OPENAI_API_KEY": self._proxy_key,
            "ATROPOS_MODEL": str(self.server.model_name), "ATROPOS_TASK": json.dumps(item),
        }  # fmt: skip
        assert self.program is not None
        try:
            with tempfile.TemporaryDirectory(prefix="atropos-harness-") as workdir:
                code, out, err = await run_program(
                    command_for(self.program, config.args), env, Path(workdir), None, config.timeout_s, "harness"
                )
                record = proxy.sessions[session_id]
                if code != 0:
                    raise HarnessFailed(f"the harness exited with code {code}: {_last_line(err)[:300]}")
                if not record.calls:
                    raise HarnessFailed("the harness made no model call", hint="does it read OPENAI_BASE_URL?")
                result = HarnessResult(item, code, out, err, Path(workdir), record.rows(), record.drift, record.calls)
                verdict = await self.score(item, result)
        finally:
            proxy.sessions.pop(session_id, None)
        score, parts = verdict if isinstance(verdict, tuple) else (float(verdict), None)
        return _Played(result, score, parts)

    async def score(self, task: dict[str, Any], result: HarnessResult) -> float | tuple[float, dict[str, float] | None]:
        """The rollout's score: the `--env.verifier` program's verdict (override to score in Python)."""
        config: HarnessConfig = self.config  # type: ignore[assignment]
        assert config.verifier is not None
        stdin = json.dumps(result.verifier_input()).encode()
        argv = command_for(config.verifier, [])
        code, out, err = await run_program(argv, dict(os.environ), result.workdir, stdin, config.timeout_s, "verifier")
        if code != 0:
            raise HarnessFailed(f"the verifier exited with code {code}: {_last_line(err)[:300]}")
        return parse_verdict(out)

    def group(self, item: dict[str, Any], played: list[_Played], elapsed: float) -> ScoredGroup:
        rows = [(p, row) for p in played for row in p.result.rows]
        logprobs = [row.logprobs for _, row in rows]
        return ScoredGroup(
            tokens=[row.tokens for _, row in rows],
            masks=[row.masks for _, row in rows],
            inference_logprobs=logprobs if all(lp is not None for lp in logprobs) else None,  # type: ignore[arg-type]
            scores=[p.score for p, _ in rows],
            messages=[row.messages for _, row in rows],
            meta=GroupMeta(
                env=self.name,
                env_version=self.version,
                item_id=item["id"],
                duration_s=round(elapsed, 4),
                failed_rollouts=self.config.group_size - len(played),
                rollouts=[
                    RolloutMeta(
                        finish_reason=row.finish_reason,
                        reward_parts=p.parts,
                        completion_tokens=sum(m != MASKED for m in row.masks),
                        calls=row.calls,
                        exact=row.exact,
                        drift=[d.model_dump() for d in p.result.drift],
                    )
                    for p, row in rows
                ],
            ),  # fmt: skip
        )
