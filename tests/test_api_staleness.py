"""The trajectory API knows policy versions: they travel through `GET /batch`, `--max-staleness` paces
`atropos serve` (hold) or drops stale groups and counts them (drop). A real API on 127.0.0.1 in a thread."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos_cli.api.queue import BatchQueue, QueuedGroup
from atropos_cli.api.staleness import StalenessGuard
from atropos_cli.runs.serve import ServeOptions
from atropos_cli.types import SCORED_DATA_KEYS
from test_serve import _serve_until_paused, load, running_api, start_trainer


def _group(first_token: int, version: int | None = None, size: int = 2) -> dict[str, Any]:
    group: dict[str, Any] = {
        "tokens": [[first_token, 5, 6]] * size,
        "masks": [[-100, 5, 6]] * size,
        "scores": [float(i % 2) for i in range(size)],
    }
    if version is not None:
        per_token = [{"policy_versions": [version, version + 1]} for _ in range(size)]
        group["meta"] = {"policy_version": version, "rollouts": per_token, "env": "x"}
    return group


def _register(url: str, batch_size: int = 4) -> None:
    reg = {
        "wandb_group": "g", "wandb_project": "p", "batch_size": batch_size, "max_token_len": 64,
        "checkpoint_dir": "c", "save_checkpoint_interval": 0, "starting_step": 0, "num_steps": 100,
    }  # fmt: skip
    httpx.post(url + "/register", json=reg).raise_for_status()


def test_versions_travel_through_the_batch_and_plain_groups_keep_atropos_shape():
    with running_api() as url:
        _register(url)
        httpx.post(url + "/scored_data", json=_group(1, version=0)).raise_for_status()
        httpx.post(url + "/scored_data", json=_group(2)).raise_for_status()
        batch = httpx.get(url + "/batch").json()["batch"]
        status = httpx.get(url + "/status").json()
    versioned, plain = batch
    assert versioned["meta"] == {"policy_version": 0, "rollouts": [{"policy_versions": [0, 1]}] * 2}
    assert set(plain) == set(SCORED_DATA_KEYS)  # nothing extra for a producer that sends no version
    assert set(status) == {"current_step", "queue_size"}  # no bound: Atropos' exact /status


def test_hold_mode_serves_every_group_and_counts_the_stale_ones():
    with running_api(max_staleness=0) as url:
        _register(url)
        for token, version in ((1, 0), (2, 0), (3, 0), (4, 0)):
            assert httpx.post(url + "/scored_data", json=_group(token, version)).json()["status"] == "received"
        first = httpx.get(url + "/batch").json()["batch"]  # step 1, trained at version 0: fresh
        second = httpx.get(url + "/batch").json()["batch"]  # step 2, trained at version 1: 1 step stale
        status = httpx.get(url + "/status").json()
    assert [g["tokens"][0][0] for g in first + second] == [1, 2, 3, 4]  # held, never dropped
    assert (status["max_staleness"], status["stale_served"], status["stale_dropped"]) == (0, 2, 0)


def test_drop_mode_refuses_stale_groups_at_ingest_and_counts_them():
    with running_api(max_staleness=1, stale_mode="drop") as url:
        _register(url)
        for token in (1, 2, 3, 4, 5, 6):
            httpx.post(url + "/scored_data", json=_group(token, version=0)).raise_for_status()
        httpx.get(url + "/batch").raise_for_status()  # steps 1 and 2 formed (one prefetched)
        answer = httpx.post(url + "/scored_data", json=_group(7, version=0)).json()  # would train at version 2
        fresh = httpx.post(url + "/scored_data", json=_group(8, version=2)).json()
        unversioned = httpx.post(url + "/scored_data", json=_group(9)).json()
        status = httpx.get(url + "/status").json()
        metrics = httpx.get(url + "/metrics").text
    assert answer["status"] == "dropped" and "2 steps behind" in answer["reason"]
    assert fresh["status"] == unversioned["status"] == "received"
    assert status["stale_dropped"] == 1
    assert "stale" in metrics


def test_drop_mode_purges_queued_groups_that_became_too_stale():
    queue = BatchQueue(batch_size=4)
    guard = StalenessGuard(bound=1, mode="drop")
    for gid, version in ((1, 0), (2, 3), (3, None)):
        queue.enqueue(QueuedGroup(gid, None, 2))
        guard.note(gid, version)
    assert [g.gid for g in guard.purge(queue, step=2)] == [1]  # 2 steps stale; 2 is fresh; 3 has no version
    assert list(queue.queue) == [2, 3] and guard.dropped == 1
    assert StalenessGuard(bound=1).purge(queue, step=9) == []  # hold mode never drops


def test_serve_pauses_at_the_api_staleness_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The env allows 4 batches off-policy, the API's bound S=0 allows one: serve holds back after one batch,
    and stamps each group with the trainer step its sampling began at."""
    monkeypatch.setenv("SERVE_TEST_DELAY", "0.05")
    with running_api(max_staleness=0) as url:
        start_trainer(url, batch_size=4)  # registers and pulls once: current_step 0, no batch formed yet
        loaded = load("--env.max_batches_offpolicy", "4", "--env.max_num_workers", "8")
        options = ServeOptions(api_url=url, poll_s=0.02, spill_path=str(tmp_path / "spill.jsonl"))
        asyncio.run(_serve_until_paused(loaded, options, url))
        queued = httpx.get(url + "/status").json()["queue_size"]
        batch = httpx.get(url + "/batch").json()["batch"]
    assert 2 <= queued <= 4, queued  # one batch = 2 groups of 2 (+ the workers already in flight), not 8
    assert all(group["meta"]["policy_version"] == 0 for group in batch)


def test_a_trainer_behind_the_api_reports_the_staleness_of_versioned_groups(tmp_path: Path, trajectory_api):
    """`atropos train --api-url`: batch 1 is trained at version 0, batch 2 at version 1; groups posted with
    version 0 are 0 then 1 step stale, and the step metrics say so."""
    from atropos_cli.trainer.run import RunOptions, run_training
    from atropos_cli.trainer.step.grpo import GRPOConfig
    from tiny_models import save_tiny_arith_model

    model = save_tiny_arith_model(tmp_path / "m", op="+", seed=0)
    with trajectory_api() as api:
        _register(api.url, batch_size=4)
        for token in (7, 8, 9, 10):
            httpx.post(api.url + "/scored_data", json=_group(token, version=0)).raise_for_status()
        opts = RunOptions(api_url=api.url, api_batch_size=4, wait_timeout=5)
        seen: list[dict] = []
        config = GRPOConfig(model=str(model), out=str(tmp_path / "run"), lr=1e-3, steps=2, save_every=0)
        run_training(opts, config, seen.append)
    assert [(m["staleness_mean"], m["staleness_max"]) for m in seen] == [(0.0, 0.0), (1.0, 1.0)]


@pytest.mark.parametrize("bad", [True, "3", 3.0, -1, -(10**7), 2**31, 2**63])
def test_policy_versions_are_strict_non_negative_integers(bad: Any):
    group = _group(1, version=0)
    with running_api() as url:
        _register(url)
        for where in ("group", "token"):
            body = {**group, "meta": {**group["meta"], "rollouts": [dict(r) for r in group["meta"]["rollouts"]]}}
            if where == "group":
                body["meta"]["policy_version"] = bad
            else:
                body["meta"]["rollouts"][1]["policy_versions"] = [0, bad]
            answer = httpx.post(url + "/scored_data", json=body)
            assert answer.status_code == 422, (where, bad, answer.text)
            assert "policy_version" in answer.text
        assert httpx.get(url + "/status").json()["queue_size"] == 0


def test_a_version_ahead_of_the_trainer_is_refused():
    with running_api(max_staleness=1, stale_mode="drop") as url:
        _register(url)
        ahead = httpx.post(url + "/scored_data", json=_group(1, version=2))  # step 0: margin 1
        token_ahead = _group(2, version=0)
        token_ahead["meta"]["rollouts"][0]["policy_versions"] = [0, 9]
        answer = httpx.post(url + "/scored_data", json=token_ahead)
        edge = httpx.post(url + "/scored_data", json=_group(3, version=0))  # tokens at version 1: step + 1
    assert ahead.status_code == 422 and "ahead of the trainer" in ahead.text
    assert answer.status_code == 422 and "ahead of the trainer" in answer.text
    assert edge.json()["status"] == "received"


def test_drop_mode_reads_the_per_token_lists_not_only_the_group_version():
    with running_api(max_staleness=1, stale_mode="drop") as url:
        _register(url)
        for token in (1, 2, 3, 4, 5, 6):
            httpx.post(url + "/scored_data", json=_group(token, version=0)).raise_for_status()
        httpx.get(url + "/batch").raise_for_status()  # steps 1 and 2 formed
        hiding = _group(7, version=2)  # a fresh group version over a token list sampled at version 0
        hiding["meta"]["rollouts"][1]["policy_versions"] = [0, 2]
        answer = httpx.post(url + "/scored_data", json=hiding).json()
    assert answer["status"] == "dropped" and "2 steps behind" in answer["reason"]


def test_staleness_metric_keys_are_a_fixed_set_whatever_the_versions():
    from atropos_cli.trainer.async_loop import HISTOGRAM_TOP, staleness_metrics
    from atropos_cli.types import ScoredGroup

    keys = None
    for trainer_version in (0, 3, 10**7, 2**31 - 1):
        group = ScoredGroup.model_validate(_group(1, version=0))
        metrics = staleness_metrics([group], trainer_version, None)
        keys = keys or set(metrics)
        assert set(metrics) == keys and len(keys) == HISTOGRAM_TOP + 4  # 0..top, more, mean, max
        assert (
            sum(v for k, v in metrics.items() if k.startswith("staleness_") and k[10:].isdigit())
            + metrics["staleness_more"]
            == 2
        )
    assert set(staleness_metrics([group], 10**7, 10**6)) == keys  # a huge configured bound is capped too


def test_a_per_token_list_longer_than_its_tokens_is_refused():
    with running_api() as url:
        _register(url)
        group = _group(1, version=0)
        group["meta"]["rollouts"][0]["policy_versions"] = [0] * 4  # 3 tokens
        answer = httpx.post(url + "/scored_data", json=group)
    assert answer.status_code == 422 and "more than its 3 tokens" in answer.text
