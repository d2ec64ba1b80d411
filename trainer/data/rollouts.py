"""The one-command loop's producer: env workers sampling groups from the inference engine, in-process.

Where it sits: `atropos train ENV` builds an `EnvRollouts` (the env with its layered config, on the local
transformers engine, a vLLM server we launch, or a user's server; built as `atropos process` builds it, so an
Atropos env file's own constructor runs, and it tokenizes with the trained model's tokenizer) and hands
`EnvRollouts.batches()` to `grpo.train` as its batch iterator. Each step collects `groups_per_step` items
concurrently (asyncio tasks over the env's `collect_group`, the same code `atropos process` runs), the trainer
steps, the weights are synced, and only then is the next step collected: every group is sampled from the weights
of the step before it (on-policy). Each item's requests are seeded from the env's seed and the item's index in the
stream, so the same --seed samples the same rollouts from the same weights. On several ranks (data-parallel ranks,
or the engine ranks of `--inference-gpus`) the items come from one stream: every rank walks it and collects only
its share of each step's items (`item_stream.py`). The step's rows are announced to an in-process engine
beforehand (`LocalBackend.expecting`), so they are sampled as one batch. Failed rollouts are counted, never
dropped silently; groups without token ids are refused with a hint, since they cannot be trained on. When the
env's items run out, `on_exhausted` "cycle" starts them over (`BaseEnv.restart_items`: one more epoch, announced)
and "stop" ends the stream (`exhausted`, reported by the CLI). `evaluate()` scores the env's eval split on the
engine's current weights (`atropos train --eval-every`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from atropos_cli.errors import AtroposError
from atropos_cli.runs.counts import RolloutCounts

from .draws import Draw
from .item_stream import Block, ItemStream

__all__ = ["EnvRollouts"]

NO_TOKENS = "no token ids"


class EnvRollouts:
    """An env + its inference engine, driven one step's worth of groups at a time."""

    def __init__(
        self,
        env_spec: str,
        dotted_args: list[str],
        config_path: str | None,
        server: dict[str, Any],
        backend: Any = None,
        rank: int = 0,
        world: int = 1,
        on_exhausted: str = "cycle",
        on_event: Callable[[str], None] = lambda _: None,
        tokenizer: str | None = None,
    ) -> None:
        from atropos_cli.env.loading import build_env, resolve_run_config
        from atropos_cli.inference.factory import serving

        self.loop = asyncio.new_event_loop()
        overrides: dict[str, dict[str, Any]] = {"openai": server}
        if tokenizer is not None:  # the env tokenizes with the trained model's tokenizer (an Atropos env's
            overrides["env"] = {"tokenizer_name": tokenizer}  # config names a hub one by default)
        env_cls, self.run_config, self.env_config = resolve_run_config(
            env_spec, dotted_args, config_path, overrides=overrides
        )
        servers = self.run_config.openai
        if backend is None and servers[0].server_type == "local":
            from atropos_cli.inference.local import LocalBackend

            backend = LocalBackend(servers[0])
        self.backend = backend
        # the env builds itself as `process` builds it (an Atropos env: its own constructor over server configs);
        # its local servers are this engine, whose weights the trainer updates
        with serving(servers[0].model_name, backend) if backend is not None else contextlib.nullcontext():
            self.env = build_env(env_cls, self.run_config, self.env_config)
        self.manager = self.env.server
        self.counts = RolloutCounts()
        # every rank walks the one stream (the same seed everywhere) and keeps its share of each step's items;
        # when the env's items run out, every rank starts them over (or stops) at the same item
        self.stream = ItemStream(self.env, int(self.env_config.seed), rank, world, on_exhausted, on_event)
        self.block: Block | None = None  # the step's items (the last drawn)
        self.loop.run_until_complete(self.stream.setup())

    @property
    def exhausted(self) -> bool:
        return self.stream.exhausted

    @property
    def restartable(self) -> bool:
        return self.stream.restartable

    @property
    def epoch(self) -> int:
        return self.stream.epoch

    @property
    def epoch_size(self) -> int | None:
        return self.stream.epoch_size

    @property
    def temperature(self) -> float:
        return float(self.env_config.temperature)

    @property
    def block_mark(self) -> tuple[str, str]:
        """(which items of the stream, their digest) of the step's items: what the ranks compare."""
        assert self.block is not None, "no step drawn yet"
        return self.block.span, self.block.digest

    def batches(self, groups_per_step: int) -> Iterator[Draw]:
        """Step by step, the groups of this rank's share of the next `groups_per_step` items of the stream (an
        empty draw where its share is empty), with what the env filtered on the way; ends with the env's stream."""
        while True:
            groups = self.loop.run_until_complete(self._collect(groups_per_step))
            if groups is None:
                return
            yield groups

    async def _collect(self, n: int) -> Draw | None:
        from atropos_cli.runs.rollout import collect_group

        self.block = await self.stream.next_block(n)
        if self.block is None:
            return None
        taken = self.block.taken()
        if not taken:
            return Draw()
        with self._one_batch(len(taken)):
            outcomes = await asyncio.gather(*(collect_group(self.env, item, index) for index, item in taken))
        groups = Draw()
        for outcome in outcomes:
            self.counts.add_failures(outcome)
            groups.failed += int(outcome.failed)
            for failure in outcome.filtered:
                groups.drop(failure.error)
            for group in outcome.groups:
                if not group.has_tokens:
                    self.counts.drop(NO_TOKENS)
                    groups.drop(NO_TOKENS)
                    continue
                if group.generation_params is None:
                    # the env samples at its configured temperature; the trainer takes log-probs at it
                    group.generation_params = {"temperature": self.temperature}
                self.counts.add_group(group)
                groups.append(group)
        if not groups and self.counts.filtered.get(NO_TOKENS):
            raise AtroposError(
                "the env's groups carry no token ids, so they cannot be trained on",
                hint="serve the model with a tokenizer (--openai.tokenizer_name) or use --inference local",
            )
        return groups

    def evaluate(self, limit: int) -> dict[str, float]:
        """The env's eval split (its first `limit` items, group-size samples each, seeded by item) sampled from
        the engine's current weights, scored as `atropos evaluate` scores it: eval_mean_score, eval_pass@1, ..."""
        return self.loop.run_until_complete(self._evaluate(limit))

    async def _evaluate(self, limit: int) -> dict[str, float]:
        from atropos_cli.runs.evaluate import eval_items, item_results, outcome_samples
        from atropos_cli.runs.metrics import summarise
        from atropos_cli.runs.rollout import collect_group

        items = eval_items(self.env, limit)
        k = int(self.env_config.group_size)
        with self._one_batch(len(items)):
            outcomes = await asyncio.gather(*(collect_group(self.env, item, i) for i, item in enumerate(items)))
        samples = [s for i, outcome in enumerate(outcomes) for s in outcome_samples(outcome, i, k, threshold=1.0)]
        return {f"eval_{name}": value for name, value in summarise(item_results(samples), k).items()}

    def _one_batch(self, groups: int) -> Any:
        """The step's rollouts (`groups` x group size rows) announced to an in-process engine, so they reach it as
        one batch instead of several that each pay the full generation tail; a no-op for a server elsewhere."""
        expecting = getattr(self.backend, "expecting", None)
        if expecting is None:
            return contextlib.nullcontext()
        return expecting(groups * int(self.env_config.group_size), int(self.env_config.max_token_length))

    def close(self) -> None:
        """Cancel what a Ctrl-C left half-collected (so no task resumes and re-raises), then stop the engine."""
        try:
            seen: set[asyncio.Task] = set()
            for _ in range(5):
                pending = [task for task in asyncio.all_tasks(self.loop) if not task.done()]
                if not pending:
                    break
                seen.update(pending)
                for task in pending:
                    task.cancel()
                try:
                    self.loop.run_until_complete(asyncio.wait(pending, timeout=30))
                except KeyboardInterrupt:  # a task that caught the Ctrl-C re-raises it once the loop resumes
                    continue
            for task in seen:  # mark their outcome as seen: the interrupt was already handled by the caller
                if task.done() and not task.cancelled():
                    task.exception()
            self.loop.run_until_complete(self.manager.aclose())
        finally:
            self.loop.close()
