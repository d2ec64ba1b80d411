"""`atropos evaluate` as a library: k samples per eval item -> samples.jsonl, metrics.json, report.html.

Layout of an eval dir (`--out DIR`)::

    DIR/config.yaml      the resolved config (env.group_size = --num-samples); --resume compares against it
    DIR/samples.jsonl    one EvalSample per line (k per item, failed ones included), flushed per item
    DIR/failures.jsonl   the RolloutFailures behind failed samples (tracebacks summarised)
    DIR/metrics.json     Atropos/lighteval layout (`evaluate_log`): config_general + results{"atropos|<env>_eval|0",
                         "all"}: mean_score, pass@1..k (unbiased estimator) each with _stderr, counts
    DIR/report.html      the HTML report (templates/eval_report.html.j2)

Items come from the env's eval split (`items("eval")`, as SimpleEnv envs and the bundled envs define it);
each item's k samples are one group from the env's own `collect_trajectories` (so multi-turn envs and judges
evaluate exactly as they train), collected through `rollout.collect_group`, so a failing rollout becomes a
failed sample instead of a crash. An env that overrides `evaluate()` has its returned metrics merged in.
A sample is correct when its reward parts say `correct` = 1, else when its score >= the pass threshold.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from atropos_cli.config import RunConfig
from atropos_cli.env.base import BaseEnv, SimpleEnv
from atropos_cli.errors import ConfigError
from atropos_cli.formats.reader import BadRecord
from atropos_cli.runs.counts import RolloutCounts
from atropos_cli.runs.envcall import call_env
from atropos_cli.runs.metrics import ItemResult, summarise
from atropos_cli.runs.rundir import claim_output
from atropos_cli.types import Message

__all__ = [
    "EvalPaths", "EvalSample", "EvalStats", "prepare_eval_dir", "run_eval", "read_samples", "scan_samples",
    "load_metrics",
]  # fmt: skip


class EvalSample(BaseModel):
    index: int
    item_id: str | None = None
    sample: int
    completion: str | None = None
    score: float | None = None
    correct: bool = False
    reward_parts: dict[str, float] | None = None
    finish_reason: str | None = None
    error: str | None = None
    messages: list[Message] | None = None


@dataclass(frozen=True)
class EvalPaths:
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def samples(self) -> Path:
        return self.root / "samples.jsonl"

    @property
    def failures(self) -> Path:
        return self.root / "failures.jsonl"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.json"

    @property
    def report(self) -> Path:
        return self.root / "report.html"

    def outputs(self) -> list[Path]:
        return [self.config, self.samples, self.failures, self.metrics, self.report]


@dataclass
class EvalStats:
    items_total: int = 0
    items_done: int = 0
    items_resumed: int = 0
    counts: RolloutCounts = field(default_factory=RolloutCounts)  # one group per item, one rollout per sample
    elapsed_s: float = 0.0
    document: dict[str, Any] = field(default_factory=dict)
    own_evaluate: bool = False  # the env's own evaluate() ran (its metrics are merged in)

    @property
    def metrics(self) -> dict[str, Any]:
        return self.document.get("results", {}).get("all", {})


@dataclass
class SampleLines:
    """A samples.jsonl read back: its samples, and the lines that are not one (invalid JSON, not UTF-8), each
    with its location and its bytes, so a rewrite can keep them. A torn last line (no newline: the write a crash
    interrupted) is neither: it is dropped, as `process --resume` drops one."""

    samples: list[EvalSample] = field(default_factory=list)
    bad: list[tuple[BadRecord, bytes]] = field(default_factory=list)


def scan_samples(path: Path) -> SampleLines:
    found = SampleLines()
    if not path.exists():
        return found
    data = path.read_bytes()
    lines = data.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            found.samples.append(EvalSample.model_validate_json(line))
        except ValidationError as exc:
            if number == len(lines) and not data.endswith(b"\n"):
                continue  # a torn last line: the write a crash interrupted; its item runs again
            reason = exc.errors()[0]["msg"]
            found.bad.append((BadRecord(f"{path}:{number}", f"not a sample ({reason})"), line))
    return found


def read_samples(path: Path) -> list[EvalSample]:
    """Samples of a samples.jsonl; a line that is not one is skipped (`scan_samples` lists them)."""
    return scan_samples(path).samples


def _complete_items(samples: list[EvalSample], k: int) -> dict[int, list[EvalSample]]:
    by_index: dict[int, list[EvalSample]] = defaultdict(list)
    for s in samples:
        by_index[s.index].append(s)
    return {i: ss for i, ss in by_index.items() if len({s.sample for s in ss}) == k}


def prepare_eval_dir(
    paths: EvalPaths, run_config: RunConfig, k: int, *, resume: bool, overwrite: bool
) -> tuple[set[int], list[BadRecord]]:
    """Create or check the eval dir; with --resume, the item indices already complete and the lines of
    samples.jsonl that could not be read (kept in the file, at its end; their items run again)."""
    claim_output(paths.root, paths.config, paths.outputs(), run_config, resume=resume, overwrite=overwrite)
    if not resume:
        return set(), []
    found = scan_samples(paths.samples)
    complete = _complete_items(found.samples, k)
    # Keep only whole items, so a crash mid-item cannot leave half an item behind; unreadable lines stay.
    lines = [s.model_dump_json(exclude_none=True).encode() for i in sorted(complete) for s in complete[i]]
    lines += [raw for _, raw in found.bad]
    paths.samples.write_bytes(b"".join(line + b"\n" for line in lines))
    return set(complete), [bad for bad, _ in found.bad]


def eval_items(env: BaseEnv, limit: int | None) -> list[Any]:
    items = getattr(env, "items", None)
    if not callable(items):
        raise ConfigError(
            f"env {env.name!r} has no eval items",
            hint="define items(split) (SimpleEnv) or override evaluate() in the env",
        )
    return list(itertools.islice(items("eval"), limit))


def has_custom_evaluate(env: BaseEnv) -> bool:
    return type(env).evaluate not in (BaseEnv.evaluate, SimpleEnv.evaluate)


def outcome_samples(outcome: Any, index: int, k: int, threshold: float) -> list[EvalSample]:
    """The k samples of one item: scored rollouts first, then one failed sample per missing rollout."""
    samples: list[EvalSample] = []
    for group in outcome.groups:
        rollouts = (group.meta.rollouts if group.meta else None) or []
        for j, score in enumerate(group.scores):
            chat = group.messages[j] if group.messages else None
            parts = rollouts[j].reward_parts if j < len(rollouts) else None
            correct = parts["correct"] >= 1.0 if parts and "correct" in parts else score >= threshold
            samples.append(
                EvalSample(
                    index=index, item_id=outcome.item_id, sample=len(samples), score=score, correct=correct,
                    completion=_last_reply(chat), reward_parts=parts, messages=chat,
                    finish_reason=rollouts[j].finish_reason if j < len(rollouts) else None,
                )
            )  # fmt: skip
    errors = [f"{f.error_type}: {f.error}" for f in outcome.failures] or ["no sample returned"]
    for missing in range(max(0, k - len(samples))):
        error = errors[min(missing, len(errors) - 1)]
        samples.append(EvalSample(index=index, item_id=outcome.item_id, sample=len(samples), error=error))
    return samples[:k]


def _last_reply(chat: list[Message] | None) -> str | None:
    for message in reversed(chat or []):
        if message.get("role") == "assistant":
            return str(message.get("content") or "")
    return None


async def run_eval(
    loaded: Any,
    paths: EvalPaths,
    *,
    num_samples: int,
    concurrency: int,
    limit: int | None = None,
    skip: set[int] | None = None,
    pass_threshold: float = 1.0,
    on_progress: Callable[[EvalStats], None] = lambda stats: None,
) -> EvalStats:
    """Run the eval split with `concurrency` items in flight; write samples as each item finishes."""
    from atropos_cli.formats.jsonl import JsonlWriter
    from atropos_cli.runs.rollout import collect_group

    env: BaseEnv = loaded.env
    skip = skip or set()
    started = time.perf_counter()
    stats = EvalStats(items_resumed=len(skip))
    try:
        await call_env(env, "setup", env.setup())
        custom_eval = has_custom_evaluate(env)
        custom = await call_env(env, "evaluate", env.evaluate()) if custom_eval else None
        stats.own_evaluate = custom_eval
        no_items = not callable(getattr(env, "items", None))
        items = [] if (custom is not None or custom_eval) and no_items else eval_items(env, limit)
        todo = [(i, item) for i, item in enumerate(items) if i not in skip]
        stats.items_total, stats.items_done = len(items), len(items) - len(todo)
        queue = iter(todo)
        with JsonlWriter(paths.samples, append=True) as out, JsonlWriter(paths.failures, append=True) as fails:

            async def worker() -> None:
                for index, item in queue:  # one shared iterator: each item goes to exactly one worker
                    outcome = await collect_group(env, item, index)
                    samples = outcome_samples(outcome, index, num_samples, pass_threshold)
                    for sample in samples:
                        out.write(sample)
                    stats.counts.add_scores([s.score if s.error is None else None for s in samples])
                    for failure in outcome.failures:
                        fails.write(failure)
                    stats.items_done += 1
                    on_progress(stats)

            await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    finally:
        await loaded.server.aclose()
    stats.elapsed_s = time.perf_counter() - started
    stats.document = write_metrics(paths, loaded, num_samples, stats.elapsed_s, custom)
    return stats


def item_results(samples: list[EvalSample]) -> list[ItemResult]:
    by_index: dict[int, list[EvalSample]] = defaultdict(list)
    for s in samples:
        by_index[s.index].append(s)
    return [
        ItemResult(n=len(ss), correct=sum(s.correct for s in ss), scores=[s.score for s in ss if s.score is not None])
        for _, ss in sorted(by_index.items())
    ]


def write_metrics(
    paths: EvalPaths, loaded: Any, k: int, elapsed: float, custom: dict[str, float] | None
) -> dict[str, Any]:
    """metrics.json in Atropos' evaluate_log layout, from everything in samples.jsonl (resumed items too)."""
    env: BaseEnv = loaded.env
    metrics: dict[str, Any] = summarise(item_results(read_samples(paths.samples)), k)
    metrics.update(custom or {})
    params = env.sampling_params(n=k).model_dump(exclude_none=True)
    params["max_new_tokens"] = params.pop("max_tokens", env.config.max_token_length)
    document = {
        "config_general": {
            "model_name": loaded.servers[0].model_name if loaded.servers else None,
            "env": env.name,
            "env_version": env.version,
            "num_samples": k,
            "total_evaluation_time_seconds": f"{elapsed:.2f}",
            "generation_parameters": params,
        },
        "results": {f"atropos|{env.name}_eval|0": metrics, "all": metrics},
    }
    paths.metrics.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    return document


def load_metrics(path: Path) -> dict[str, Any]:
    """The full metrics.json document of an eval dir (or of the file itself)."""
    file = path / "metrics.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(f"no metrics.json at {str(path)!r}", hint="pass an `atropos evaluate` output directory")
    try:
        document = json.loads(file.read_bytes())
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"not UTF-8 ({exc.reason} at byte {exc.start})",
            hint="pass a metrics.json written by `atropos evaluate`",
            file=str(file),
        ) from None
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"not valid JSON ({exc.msg})", hint="pass a metrics.json written by `atropos evaluate`", file=str(file)
        ) from None
    if not isinstance(document, dict) or "all" not in document.get("results", {}):
        raise ConfigError(f"{file}: not an eval metrics file (no results.all)", hint="was it written by evaluate?")
    return document
