"""Judge (RLAIF): a second model grades the policy's answers against a rubric; its judgements are the rewards.

Data: a bundled list of 16 open-ended prompts, or `--env.data_path` (.jsonl/.json/.parquet with a `prompt`
column). The judge is any backend: `--env.judge_base_url URL` (+ `--env.judge_model_name`,
`--env.judge_api_key`) for an OpenAI-compatible server, `--env.judge_server_type local
--env.judge_model_name DIR` for an in-process model, or nothing to reuse the policy's own server.

Modes (`--env.mode`):
- `pointwise` (default): each answer is graded alone; the judge ends with `SCORE: N` (0-10); reward = N/10.
- `pairwise`: every pair in the group is compared (answer order alternates to cancel position bias); the
  judge ends with `VERDICT: A|B|TIE`; reward = win rate (tie = half a win). Atropos' rlaif env style.

A judge answer without a parseable marker is asked again up to `--env.judge_retries` times; then the
rollout (pointwise) is recorded as failed, or the pair (pairwise) is recorded as a failure and counted as a
tie. The judge's reasoning is saved with the group under `meta.judge` (one entry per grading/comparison).
`correct` in the reward parts is 1 when the reward is >= 0.7 (what evaluate's pass@k counts).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Iterator
from typing import Any, ClassVar, Literal

from atropos_cli.config import EnvConfig, ServerConfig
from atropos_cli.env.base import SimpleEnv, record_failure

from ._shared.data import BUNDLED_DATA, check_columns, cycle_shuffled, load_local_records
from ._shared.judging import (
    JudgeOutputError,
    pair_scores,
    pairwise_prompt,
    parse_score,
    parse_verdict,
    pointwise_prompt,
)

DEFAULT_RUBRIC = "Helpful, correct, clear and concise; friendly in tone; no made-up facts."
PASS_THRESHOLD = 0.7


class JudgeConfig(EnvConfig):
    mode: Literal["pointwise", "pairwise"] = "pointwise"
    rubric: str = DEFAULT_RUBRIC
    judge_base_url: str = ""
    judge_model_name: str = "default"
    judge_api_key: str = ""
    judge_server_type: Literal["openai", "vllm", "sglang", "trl", "local"] = "openai"
    judge_retries: int = 2
    judge_max_tokens: int = 512
    judge_temperature: float = 0.0
    eval_size: int = -1


class JudgeEnv(SimpleEnv):
    name: ClassVar[str] = "judge"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "RLAIF; bundled prompts or --env.data_path; a judge model's pointwise score or pairwise win rate"
    )
    env_config_cls = JudgeConfig

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return JudgeConfig(group_size=4, max_token_length=512), []

    @property
    def judge(self) -> Any:
        """The judge's ServerManager: its own when configured, else the policy's router."""
        if not hasattr(self, "_judge"):
            config: JudgeConfig = self.config  # type: ignore[assignment]
            if config.judge_base_url or config.judge_server_type == "local":
                from atropos_cli.inference.router import ServerManager
                from atropos_cli.resources import DEFAULT_MODEL

                local_default = config.judge_server_type == "local" and config.judge_model_name == "default"
                server = ServerConfig(
                    base_url=config.judge_base_url,
                    model_name=DEFAULT_MODEL if local_default else config.judge_model_name,
                    api_key=config.judge_api_key,
                    server_type=config.judge_server_type,
                )
                self._judge = ServerManager([server])
            else:
                self._judge = self.server
        return self._judge

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        config: JudgeConfig = self.config  # type: ignore[assignment]
        path = config.data_path or BUNDLED_DATA / "judge_prompts.jsonl"
        rows = load_local_records(path)
        check_columns(rows, ("prompt",), repr(str(path)))
        pairs: Iterator[tuple[int, dict[str, Any]]]
        if split == "train":
            pairs = cycle_shuffled(list(enumerate(rows)), config.seed)
        else:
            pairs = iter(list(enumerate(rows))[: config.eval_size if config.eval_size >= 0 else len(rows)])
        for index, row in pairs:
            yield {"id": str(row.get("id", index)), "prompt": row["prompt"]}

    def prompt(self, item: dict[str, Any]) -> str:
        return item["prompt"]

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        """Scores come from the judge in `collect_trajectories`; here they are handed out in choice order."""
        verdict = next(self._verdicts)
        if isinstance(verdict, BaseException):
            raise verdict
        return {"score": verdict, "correct": 1.0 if verdict >= PASS_THRESHOLD else 0.0}

    async def collect_trajectories(self, item: dict[str, Any]) -> tuple[Any, list[Any]]:
        messages = self.messages_for(item)
        started = time.perf_counter()
        generation = await self.server.chat_completion(
            messages=messages, **self.sampling_params().model_dump(exclude_none=True)
        )
        texts = [c.text for c in generation.choices]
        if self.config.mode == "pairwise":  # type: ignore[attr-defined]
            verdicts, records = await self._pairwise(item, texts)
        else:
            verdicts, records = await self._pointwise(item, texts)
        self._verdicts = iter(verdicts)  # consumed synchronously by score() -> reward(), in choice order
        group = self.score(item, messages, generation, time.perf_counter() - started)
        if group is not None and group.meta is not None:
            group.meta.judge = records  # type: ignore[attr-defined]
        return group, []

    async def _ask(self, prompt: str, parse: Any) -> tuple[Any, str]:
        """Ask the judge; retry on unparseable output; JudgeOutputError after the last try."""
        config: JudgeConfig = self.config  # type: ignore[assignment]
        error: JudgeOutputError | None = None
        for _ in range(config.judge_retries + 1):
            generation = await self.judge.chat_completion(
                messages=[{"role": "user", "content": prompt}],
                n=1,
                temperature=config.judge_temperature,
                max_tokens=config.judge_max_tokens,
            )
            text = generation.choices[0].text
            try:
                return parse(text), text
            except JudgeOutputError as exc:
                error = exc
        raise JudgeOutputError(
            f"{error.message} (after {config.judge_retries + 1} tries)",  # type: ignore[union-attr]
            hint="use a stronger judge model, or raise --env.judge_retries",
        )

    async def _pointwise(self, item: dict[str, Any], texts: list[str]) -> tuple[list[Any], list[dict[str, Any]]]:
        rubric = self.config.rubric  # type: ignore[attr-defined]
        results = await asyncio.gather(
            *(self._ask(pointwise_prompt(rubric, item["prompt"], t), parse_score) for t in texts),
            return_exceptions=True,
        )
        verdicts: list[Any] = []
        records = []
        for index, result in enumerate(results):
            if isinstance(result, JudgeOutputError):
                verdicts.append(result)  # reward() raises it: recorded as this rollout's failure
                records.append({"rollout": index, "error": result.message})
            elif isinstance(result, BaseException):
                raise result
            else:
                verdicts.append(result[0])
                records.append({"rollout": index, "score": result[0], "reasoning": result[1]})
        return verdicts, records

    async def _pairwise(self, item: dict[str, Any], texts: list[str]) -> tuple[list[Any], list[dict[str, Any]]]:
        rubric = self.config.rubric  # type: ignore[attr-defined]
        pairs = list(itertools.combinations(range(len(texts)), 2))
        # Alternate which answer is shown first so a judge's position bias does not favour low indices.
        ordered = [(i, j) if k % 2 == 0 else (j, i) for k, (i, j) in enumerate(pairs)]
        results = await asyncio.gather(
            *(
                self._ask(pairwise_prompt(rubric, item["prompt"], texts[a], texts[b]), parse_verdict)
                for a, b in ordered
            ),
            return_exceptions=True,
        )
        verdicts: dict[tuple[int, int], str] = {}
        records = []
        for (a, b), result in zip(ordered, results, strict=True):
            if isinstance(result, JudgeOutputError):
                record_failure(result, env=self.name, item_id=item["id"], rollout_index=None)
                verdicts[(a, b)] = "TIE"
                records.append({"pair": [a, b], "error": result.message})
            elif isinstance(result, BaseException):
                raise result
            else:
                verdicts[(a, b)] = result[0]
                records.append({"pair": [a, b], "verdict": result[0], "reasoning": result[1]})
        return pair_scores(len(texts), verdicts), records
