"""The one trajectory-API client: trainer side against a real `atropos api`, fail-fast without one; retry policy."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from atropos_cli.api.client import ApiUnavailableError, TrainerRegistration, iter_batches
from atropos_cli.retry import RETRY_AFTER_MAX_S, Backoff, parse_retry_after
from atropos_cli.testing import free_port
from atropos_cli.types import ScoredGroup


def _group(score: float) -> ScoredGroup:
    return ScoredGroup(tokens=[[1, 2, 3], [1, 2, 4]], masks=[[-100, 2, 3], [-100, 2, 4]], scores=[score, -score])


def test_trainer_side_pulls_each_batch_then_stops_when_idle(trajectory_api: Any) -> None:
    api = trajectory_api()
    registration = TrainerRegistration(batch_size=4, max_token_len=64)
    assert httpx.post(f"{api.url}/register", json=registration.model_dump()).status_code == 200
    posted = [_group(float(i + 1)) for i in range(4)]
    for group in posted:
        assert httpx.post(f"{api.url}/scored_data", json=group.to_scored_data()).status_code == 200
    late = [_group(5.0), _group(6.0)]
    waits: list[str] = []

    def on_wait(line: str) -> None:
        """Called while the client waits on an empty queue: the first time, two more groups arrive, which an
        idle client must still pick up (it did not stop at its first empty answer)."""
        waits.append(line)
        if len(waits) == 1:
            for group in late:
                assert httpx.post(f"{api.url}/scored_data", json=group.to_scored_data()).status_code == 200

    batches = list(
        iter_batches(api.url, registration, idle_timeout=1.0, poll_interval=0.05, on_wait=on_wait, wait_report_every=0)
    )
    # batch_size counts rollouts: two groups of two each; the list ended once the queue stayed idle
    assert [len(b) for b in batches] == [2, 2, 2]
    assert sorted(g.scores[0] for b in batches for g in b) == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert waits and "waiting for a batch of 4" in waits[0]


def test_trainer_side_fails_fast_with_a_hint_when_no_api_answers() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    retries: list[str] = []
    with pytest.raises(ApiUnavailableError, match="cannot reach the trajectory API") as info:
        next(iter_batches(url, TrainerRegistration(batch_size=4), idle_timeout=30, on_wait=retries.append))
    # fails on the first refused connection: no retry loop, no idle wait (which would have reported)
    assert "gave up after" not in info.value.message and retries == []
    assert "atropos api" in (info.value.hint or "")


def test_retry_after_is_parsed_and_capped() -> None:
    assert parse_retry_after("2") == 2.0 and parse_retry_after("-3") == 0.0
    assert parse_retry_after(None) is None and parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT") is None
    backoff = Backoff(base_s=0.5, max_s=4.0)
    assert 2.0 <= backoff.delay(0, retry_after=2.0) <= 2.2
    assert backoff.delay(0, retry_after=1e6) <= RETRY_AFTER_MAX_S * 1.1
    for attempt, ceiling in [(0, 0.5), (1, 1.0), (3, 4.0), (10, 4.0)]:
        assert ceiling / 2 <= backoff.delay(attempt) <= ceiling
