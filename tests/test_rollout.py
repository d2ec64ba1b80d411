"""collect_group / run_groups: failures are data, groups are stamped, concurrency is real, fatal errors stop."""

import asyncio

import pytest

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import BaseEnv, SimpleEnv
from atropos_cli.errors import ServerUnreachableError
from atropos_cli.inference.base import Choice, Generation
from atropos_cli.runs.rollout import RunAborted, collect_group, run_groups


class ScriptedServer:
    """A hand-written fake of the router: answers every chat with the given texts, tracking concurrency."""

    model_name = "scripted"
    tokenizer = None

    def __init__(self, texts, delay=0.0, error=None):
        self.texts, self.delay, self.error = texts, delay, error
        self.in_flight = self.max_in_flight = self.calls = 0

    async def chat_completion(self, messages, n=1, **kwargs):
        self.calls += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if self.error:
                raise self.error
            return Generation(
                model=self.model_name,
                choices=[Choice(index=i, text=self.texts[i % len(self.texts)], finish_reason="stop") for i in range(n)],
            )
        finally:
            self.in_flight -= 1


class Numbers(SimpleEnv):
    name = "numbers"

    def items(self, split):
        yield from ({"id": i, "answer": str(i % 3)} for i in range(1000))

    def prompt(self, item):
        return "say a number"

    def reward(self, completion, item):
        if completion == "boom":
            raise ZeroDivisionError("reward blew up")
        return {"correct": float(completion == item["answer"]), "length": -0.01 * len(completion)}


def make_env(server, **config):
    return Numbers(EnvConfig(group_size=4, **config), server)


def run(coro):
    return asyncio.run(coro)


def test_group_is_scored_and_stamped_with_provenance():
    env = make_env(ScriptedServer(["0", "1", "22", "0"]))
    run(env.setup())
    outcome = run(collect_group(env, {"id": 7, "answer": "0"}, index=7))
    (group,) = outcome.groups
    assert group.scores == pytest.approx([0.99, -0.01, -0.02, 0.99])
    meta = group.meta
    assert (meta.env, meta.item_id, meta.index, meta.model) == ("numbers", "7", 7, "scripted")
    assert meta.rollouts[0].reward_parts == {"correct": 1.0, "length": -0.01}
    assert meta.tokens_missing and len(meta.group_id) == 16
    assert group.messages[0][-1] == {"role": "assistant", "content": "0"}


def test_a_reward_that_raises_is_a_recorded_failed_rollout():
    env = make_env(ScriptedServer(["0", "boom", "1", "boom"]))
    outcome = run(collect_group(env, {"id": 1, "answer": "1"}, index=1))
    assert outcome.groups[0].size == 2 and outcome.groups[0].meta.failed_rollouts == 2
    assert [f.rollout_index for f in outcome.failures] == [1, 3]
    failure = outcome.failures[0]
    assert failure.kind == "rollout" and failure.error_type == "ZeroDivisionError"
    assert "reward blew up" in failure.error and "in reward" in failure.error and failure.index == 1


def test_a_group_that_raises_is_a_recorded_failed_group():
    env = make_env(ScriptedServer(["0"], error=RuntimeError("server said no")))
    outcome = run(collect_group(env, {"id": 1, "answer": "1"}, index=3))
    assert outcome.failed and not outcome.groups
    assert outcome.failures[0].kind == "group" and "server said no" in outcome.failures[0].error


class PerRollout(BaseEnv):
    """Atropos' per-rollout path: collect_trajectory returns one dict per rollout; one of them is invalid."""

    name = "per_rollout"

    async def collect_trajectory(self, item):
        return {"tokens": [1, 2], "masks": [-100, 2], "scores": 1.0}, []


def test_per_rollout_collect_trajectory_is_stacked_into_a_group():
    env = PerRollout(EnvConfig(group_size=3), ScriptedServer(["x"]))
    (group,) = run(collect_group(env, {"id": 0})).groups
    assert group.tokens == [[1, 2]] * 3 and group.scores == [1.0] * 3 and group.has_tokens


class Invalid(BaseEnv):
    name = "invalid"

    async def collect_trajectories(self, item):
        return {"tokens": [[1, 2]], "masks": [[1]], "scores": [1.0]}, []


def test_an_invalid_group_is_recorded_with_the_bad_rollout_named():
    outcome = run(collect_group(Invalid(EnvConfig(), ScriptedServer(["x"])), {"id": 0}))
    assert outcome.failed and "rollout 0: tokens has 2 entries but masks has 1" in outcome.failures[0].error


class WrongShape(BaseEnv):
    name = "wrong_shape"

    async def collect_trajectories(self, item):
        return {"tokens": [[1, 2]], "masks": [[1, 1]], "scores": [1.0], "inference_logprobs": [0.5]}, []


def test_an_invalid_field_is_recorded_with_its_path():
    outcome = run(collect_group(WrongShape(EnvConfig(), ScriptedServer(["x"])), {"id": 0}))
    assert outcome.failed
    assert "invalid group: inference_logprobs.0: Input should be a valid list (got 0.5)" in outcome.failures[0].error


def test_identical_scores_are_filtered_only_when_asked():
    server = ScriptedServer(["5"])
    assert run(collect_group(make_env(server), {"id": 0, "answer": "1"})).groups
    outcome = run(collect_group(make_env(server, ensure_scores_are_not_same=True), {"id": 0, "answer": "1"}))
    assert not outcome.groups and outcome.filtered[0].error == "identical scores"


def test_run_groups_runs_concurrently_in_item_order_and_skips_done_indices():
    server = ScriptedServer(["0"], delay=0.05)
    env = make_env(server)
    seen = []

    async def main():
        await env.setup()
        await run_groups(env, num_items=20, concurrency=8, skip={0, 1}, on_outcome=lambda o: seen.append(o.index))

    run(main())
    assert sorted(seen) == list(range(2, 20))
    assert server.max_in_flight == 8


def test_unreachable_server_aborts_the_run():
    env = make_env(ScriptedServer(["0"], error=ServerUnreachableError("no server at 'http://x'", hint="start one")))

    async def main():
        await env.setup()
        await run_groups(env, num_items=10, concurrency=2, on_outcome=lambda o: None)

    with pytest.raises(RunAborted, match="no server at"):
        run(main())


def test_the_same_failure_many_times_in_a_row_stops_the_run():
    env = make_env(ScriptedServer(["0"], error=ValueError("garbage from server")))
    outcomes = []

    async def main():
        await env.setup()
        await run_groups(env, num_items=100, concurrency=1, on_outcome=outcomes.append, max_consecutive_failures=5)

    with pytest.raises(RunAborted, match="5 groups in a row failed with ValueError"):
        run(main())
    assert len(outcomes) == 5
