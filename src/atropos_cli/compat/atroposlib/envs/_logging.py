"""atroposlib's W&B and eval-logging hooks of BaseEnv, as a mixin: `add_rollouts_for_wandb`,
`create_rollout_table`, `perf_stats`, `wandb_log`, `evaluate_log` (metrics.json + samples.jsonl in
`data_dir_to_save_evals`, lighteval's layout: `config_general`, `results["atropos|<task>|0"]` and `"all"`)."""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any

from atropos_cli.compat.atroposlib.envs._wandb import active, wandb
from atropos_cli.compat.atroposlib.utils.metrics import get_std_min_max_avg

logger = logging.getLogger("atropos_cli.compat.atroposlib")

__all__ = ["WandbHooks", "write_eval_files"]


def write_eval_files(
    folder: str, metrics: dict, task: str, model: str | None, seconds: float, params: dict, samples: list | None
) -> None:
    """metrics.json in lighteval's layout (`config_general`, `results["atropos|<task>|0"]` and `"all"`) and,
    given samples, samples.jsonl."""
    os.makedirs(folder, exist_ok=True)
    result = {
        "config_general": {
            "model_name": model,
            "total_evaluation_time_seconds": str(seconds),
            "generation_parameters": params,
        },
        "results": {f"atropos|{task}|0": metrics, "all": metrics},
    }
    with open(os.path.join(folder, "metrics.json"), "w") as f:
        json.dump(result, f, indent=2)
    if samples:
        with open(os.path.join(folder, "samples.jsonl"), "w") as f:
            f.writelines(json.dumps(sample) + "\n" for sample in samples)


class WandbHooks:
    """Needs the attributes BaseEnv sets in its constructor (declared here for the type checker)."""

    config: Any
    tokenizer: Any
    server: Any
    max_token_len: int
    curr_step: int
    wandb_prepend: str | None
    rollouts_for_wandb: list[Any]
    completion_lengths: list[int]
    task_duration: list[float]
    succeeded_task_duration: list[float]
    failed_task_duration: list[float]
    mainloop_timings: list[float]
    last_wandb_metrics: dict[str, Any]

    async def add_rollouts_for_wandb(self, scored_data: Any, item: Any = None) -> None:
        keep = self.config.num_rollouts_per_group_for_logging
        keep = len(scored_data["tokens"]) if keep == -1 else min(keep, len(scored_data["tokens"]))
        decode = self.tokenizer.decode if self.tokenizer is not None else str
        self.rollouts_for_wandb.append(
            [(decode(scored_data["tokens"][i]), scored_data["scores"][i]) for i in range(keep)]
        )
        if len(self.rollouts_for_wandb) > self.config.num_rollouts_to_keep:
            self.rollouts_for_wandb.pop(0)

    async def create_rollout_table(self, wandb_metrics: dict) -> dict:
        if self.rollouts_for_wandb:
            table = wandb.Table(columns=["text", "score"])
            for group in self.rollouts_for_wandb:
                for text, score in group:
                    table.add_data(text, score)
            wandb_metrics["train/rollouts"] = table
        return wandb_metrics

    def perf_stats(self, metrics_dict: dict) -> dict:
        for name in ("task_duration", "succeeded_task_duration", "failed_task_duration", "mainloop_timings"):
            values = getattr(self, name)
            if len(values) > 1:
                get_std_min_max_avg(f"train_perf/{name}", values, metrics_dict)
                setattr(self, name, [])
        return metrics_dict

    def _completion_metrics(self, metrics: dict) -> None:
        lengths = self.completion_lengths
        if not lengths:
            return
        mean = sum(lengths) / len(lengths)
        metrics["train/completion_lengths"] = mean
        metrics["train/completion_lengths_std"] = (sum((x - mean) ** 2 for x in lengths) / len(lengths)) ** 0.5
        metrics["train/completion_lengths_max"] = max(lengths)
        metrics["train/completion_lengths_min"] = min(lengths)
        metrics["train/completion_lengths_p95"] = sum(x > 0.95 * self.max_token_len for x in lengths) / len(lengths)

    async def wandb_log(self, wandb_metrics: dict | None = None) -> None:
        """Add the env's standard metrics, then log to W&B when a run is active (else drop them)."""
        metrics = dict(wandb_metrics or {})
        server_metrics: dict = {}
        for i, server in enumerate(getattr(self.server, "servers", [])):
            server_metrics = await server.wandb_metrics(server_metrics, f"server_{i}")
        self._completion_metrics(metrics)
        metrics = await self.create_rollout_table(metrics)
        metrics = self.perf_stats(metrics)
        self.rollouts_for_wandb = []
        self.completion_lengths = []
        self.last_wandb_metrics = metrics
        if self.config.use_wandb and active():
            if self.wandb_prepend is not None:
                metrics = {f"{self.wandb_prepend}_{k}": v for k, v in metrics.items()}
            wandb.log({**metrics, **server_metrics}, step=self.curr_step)

    async def evaluate_log(
        self,
        metrics: dict,
        task_name: str | None = None,
        model_name: str | None = None,
        start_time: float | None = None,
        end_time: float | None = None,
        generation_parameters: dict | None = None,
        samples: list[dict] | None = None,
        verbose: bool = True,
    ) -> None:
        folder = self.config.data_dir_to_save_evals
        if folder is None:
            logger.warning("data_dir_to_save_evals is not set, skipping evaluation logging")
            return
        task = task_name or f"{getattr(self, 'name', None) or type(self).__name__}_eval"
        model = model_name or getattr(self.config, "model_name", None) or self._first_model_name()
        start = time.time() if start_time is None else start_time
        end = time.time() if end_time is None else end_time
        params = {"max_new_tokens": self.config.max_token_length, **(generation_parameters or {})}
        write_eval_files(folder, metrics, task, model, end - start, params, samples)
        if verbose:
            logger.info("%s: %s", task, json.dumps(metrics))

    def _first_model_name(self) -> str | None:
        servers = getattr(self.server, "servers", [])
        return servers[0].config.model_name if servers else None
