"""atroposlib.envs.eval: `EvalBase` (a standalone eval over a ServerManager), `pass_at_k`, `evaluate_log`.

`EvalBase(pass_at_n=1, pass_at_n_samples=1, **attrs)`: subclasses define `setup_data()` and
`async run_item(server, item) -> (metrics, sample)`; awaiting `eval_env(server_manager)` runs every item
concurrently, averages each metric and writes `metrics.json` / `samples.jsonl` into `eval_dir` when set.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any

from atropos_cli.compat.atroposlib.envs._logging import write_eval_files
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager

__all__ = ["pass_at_k", "evaluate_log", "EvalBase", "eval_runner"]

logger = logging.getLogger("atropos_cli.compat.atroposlib")


def pass_at_k(m: int, c: int, k: int) -> float:
    """The unbiased pass@k of m samples of which c are correct: 1 - C(m-c, k) / C(m, k)."""
    if m - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(m - c + 1, m + 1))


def evaluate_log(
    metrics: dict,
    eval_dir: str | None = None,
    task_name: str | None = None,
    model_name: str | None = None,
    start_time: float | None = None,
    end_time: float | None = None,
    generation_parameters: dict | None = None,
    samples: list[dict] | None = None,
    verbose: bool = True,
) -> None:
    if eval_dir is None:
        logger.warning("eval_dir is not set, skipping evaluation logging")
        return
    start = time.time() if start_time is None else start_time
    end = time.time() if end_time is None else end_time
    write_eval_files(eval_dir, metrics, str(task_name), model_name, end - start, generation_parameters or {}, samples)


class EvalBase:
    def __init__(self, pass_at_n: int = 1, pass_at_n_samples: int = 1, **kwargs: Any) -> None:
        self.pass_at_n = pass_at_n
        self.pass_at_n_samples = pass_at_n_samples
        for key, value in kwargs.items():
            setattr(self, key, value)
        self.data = self.setup_data()

    def get_generation_params(self) -> dict[str, Any]:
        return {
            "temperature": getattr(self, "temperature", 0.0),
            "n": max(self.pass_at_n_samples, self.pass_at_n),
            "top_p": getattr(self, "top_p", 1.0),
            "max_tokens": getattr(self, "max_tokens", -1),
        }

    async def chat_completion(self, server: Any, messages: list[dict]) -> Any:
        params = self.get_generation_params()
        if params["max_tokens"] is not None and params["max_tokens"] < 1:
            params["max_tokens"] = None  # atroposlib's -1: the server's default
        return await server.chat_completion(messages=messages, **params)

    def setup_data(self) -> list:
        raise NotImplementedError(f"{type(self).__name__} must implement setup_data()")

    async def run_item(self, server: ServerManager, data_item: dict) -> tuple[dict, Any]:
        raise NotImplementedError(f"{type(self).__name__} must implement run_item()")

    async def __call__(self, server_manager: ServerManager) -> dict[str, float]:
        start = time.time()
        results = await asyncio.gather(*(self.run_item(server_manager, item) for item in self.data))
        end = time.time()
        rows = [r[0] for r in results]
        metrics = {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]} if rows else {}
        task = f"{type(self).__name__}@{self.pass_at_n}"
        if self.pass_at_n != self.pass_at_n_samples:
            task += f":{self.pass_at_n_samples}"
        evaluate_log(
            metrics,
            eval_dir=getattr(self, "eval_dir", None),
            task_name=task,
            model_name=server_manager.servers[0].config.model_name,
            start_time=start,
            end_time=end,
            generation_parameters=self.get_generation_params(),
            samples=[r[1] for r in results],
        )
        return metrics


async def eval_runner(eval_env: EvalBase, server_url: str = "http://localhost:8000", model_name: str = "default"):
    """Run `eval_env` against one OpenAI-compatible server (atroposlib reads these two from argv)."""
    config = APIServerConfig(api_key="dummy", base_url=server_url, model_name=model_name, health_check=False)
    return await eval_env(ServerManager([config]))
