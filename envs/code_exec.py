"""Code: write a Python function that passes hidden tests, run in a sandboxed subprocess. (Env name `code`;
the module is `code_exec` so it does not shadow the standard library's `code`.)

Data: a bundled set of 12 small problems (envs/_data/code_problems.jsonl) by default; `--env.data_path`
reads any MBPP-style .jsonl/.json/.parquet (columns `text` and `test_list`, optional `test_setup_code` and
`task_id`), and `--env.dataset_name google-research-datasets/mbpp` loads MBPP from the hub. Each test is an
`assert` statement; the prompt shows the first one so the model knows the function's name and signature.

Scoring: the last ```python block of the completion (else the whole completion) runs in `atropos_cli.env.sandbox`
(time limit `--env.timeout_s`, memory limit `--env.memory_mb`, bubblewrap isolation; without bubblewrap
the env refuses to start unless `--env.allow_unisolated true`, and then prints one line naming the gaps). The
sandboxed process only evaluates the calls the tests make and prints their values as plain literals; this
process compares them with the expected values (`_shared/codecheck.py`), so a solution cannot forge its score.
Reward = fraction of tests passed; `correct` = 1 only when all pass. A solution that loops forever or
eats memory is killed at the limit and scores 0 (its `failure` reason is kept in the rollout's reward parts
as `timeout` / `memory` flags).
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import SimpleEnv
from atropos_cli.env.sandbox import SandboxLimits, SandboxWarning, not_isolated, require_isolation

from ._shared.codecheck import check_solution, check_solution_async
from ._shared.data import (
    BUNDLED_DATA,
    check_columns,
    check_hub_access,
    cycle_shuffled,
    load_hub_records,
    load_local_records,
)

REQUIRED_COLUMNS = ("text", "test_list")


class CodeConfig(EnvConfig):
    dataset_name: str | None = None
    """A hub dataset in MBPP's layout (e.g. google-research-datasets/mbpp); default: the bundled set."""
    timeout_s: float = 5.0
    memory_mb: int = 512
    eval_size: int = -1
    allow_unisolated: bool = False
    """Run the code without bubblewrap (the `unshare`/`none` fallback, whose gaps are printed); off: refuse."""


class CodeEnv(SimpleEnv):
    name: ClassVar[str] = "code"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "single-turn Python; bundled problems or MBPP-style --env.data_path; reward = tests passed in a sandbox"
    )
    env_config_cls = CodeConfig
    system_prompt: ClassVar[str | None] = (
        "You are an expert Python programmer. Reply with the complete function in one ```python code block."
    )

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return CodeConfig(group_size=8, max_token_length=1024), []

    @property
    def limits(self) -> SandboxLimits:
        config: CodeConfig = self.config  # type: ignore[assignment]
        return SandboxLimits(
            timeout_s=config.timeout_s, memory_mb=config.memory_mb, allow_unisolated=config.allow_unisolated
        )

    @classmethod
    def check_config(cls, config: EnvConfig) -> None:
        mode = require_isolation(config.allow_unisolated)  # type: ignore[attr-defined]
        if mode != "bwrap":
            gaps = not_isolated(mode)
            warnings.warn(f"code sandbox without bubblewrap ('{mode}' mode): {gaps}", SandboxWarning, stacklevel=2)
        if not config.data_path and config.dataset_name:  # type: ignore[attr-defined]
            check_hub_access(config.dataset_name, REQUIRED_COLUMNS)  # type: ignore[attr-defined]

    def load_split(self, split: str) -> list[dict[str, Any]]:
        config: CodeConfig = self.config  # type: ignore[assignment]
        if config.data_path:
            rows, source = load_local_records(config.data_path), repr(config.data_path)
        elif config.dataset_name:
            hub_split = "train" if split == "train" else "test"
            rows = load_hub_records(config.dataset_name, None, hub_split, REQUIRED_COLUMNS)
            source = config.dataset_name
        else:
            path = BUNDLED_DATA / "code_problems.jsonl"
            rows, source = load_local_records(path), "the bundled problem set"
        check_columns(rows, REQUIRED_COLUMNS, source)
        return rows

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        rows = self.load_split(split)
        pairs: Iterator[tuple[int, dict[str, Any]]]
        if split == "train":
            pairs = cycle_shuffled(list(enumerate(rows)), self.config.seed)
        else:
            limit = self.config.eval_size if self.config.eval_size >= 0 else len(rows)  # type: ignore[attr-defined]
            pairs = iter(list(enumerate(rows))[:limit])
        for index, row in pairs:
            yield {
                "id": str(row.get("task_id", index)),
                "text": row["text"],
                "tests": list(row["test_list"]),
                "setup": row.get("test_setup_code") or "",
            }

    def prompt(self, item: dict[str, Any]) -> str:
        return f"{item['text']}\nYour code should pass this test:\n{item['tests'][0]}"

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        cached = getattr(self, "_outcomes", {}).get((item["id"], completion))
        outcome = cached or check_solution(completion, item["tests"], self.limits, item["setup"])
        return _reward_from(outcome)

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[Any, list[Any]]:
        """Generate, then run the group's solutions concurrently (sandbox runs do not block the loop)."""
        messages = self.messages_for(item)
        started = time.perf_counter()
        generation = await self.server.chat_completion(
            messages=messages, **self.sampling_params(stop=self.stop).model_dump(exclude_none=True)
        )
        texts = [c.text for c in generation.choices]
        outcomes = await asyncio.gather(
            *(check_solution_async(t, item["tests"], self.limits, item["setup"]) for t in texts)
        )
        self._outcomes = getattr(self, "_outcomes", {})
        keys = [(item["id"], t) for t in texts]
        self._outcomes.update(zip(keys, outcomes, strict=True))
        try:
            return self.score(item, messages, generation, time.perf_counter() - started), []
        finally:
            for key in keys:
                self._outcomes.pop(key, None)


def _reward_from(outcome: dict[str, Any]) -> dict[str, float]:
    total = max(1, outcome["total"])
    fraction = outcome["passed"] / total
    failure = outcome["failure"] or ""
    return {
        "score": round(fraction, 4),
        "correct": 1.0 if outcome["passed"] == outcome["total"] and not failure else 0.0,
        "timeout": 1.0 if failure == "timeout" else 0.0,
        "memory": 1.0 if failure == "memory" else 0.0,
    }
