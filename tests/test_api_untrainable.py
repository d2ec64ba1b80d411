"""What a trainer cannot train never stops it (issue 21): `atropos api` answers 422 to token ids outside the
registered vocabulary, negative ids and absurd scores; the trainer skips and counts such a group when an API
that does not check (Atropos' run-api, or ours without a vocabulary) hands it one; a group larger than its env's
group_size is refused at POST instead of waiting in a buffer forever, and /health counts every queued group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from atropos_cli.api.app import create_app
from atropos_cli.api.service import ApiSettings
from atropos_cli.trainer.data.sources import CheckedBatches
from atropos_cli.trainer.run import RunOptions, run_training
from atropos_cli.trainer.step.grpo import GRPOConfig
from atropos_cli.types import ScoredGroup
from tiny_models import save_tiny_arith_model

REG = {
    "wandb_group": "g", "wandb_project": "p", "batch_size": 16, "max_token_len": 64,
    "checkpoint_dir": "c", "save_checkpoint_interval": 1, "starting_step": 0, "num_steps": 10,
}  # fmt: skip


def group(size: int = 4, token: int = 7, score: float = 1.0, **extra: Any) -> dict[str, Any]:
    toks = [[5, 6, token + (i % 2)] for i in range(size)]
    return {"tokens": toks, "masks": [[-100, 6, t[2]] for t in toks], "scores": [score] * size, **extra}


HOSTILE = {
    "token -7": group(token=-7),
    "token 100000": group(token=100_000),
    "score 1e308": group(score=1e308),
    "score -1e308": group(score=-1e308),
    "score 2e6": group(score=2e6),
    "advantages 1e308": group(advantages=[[1e308, 0.0, 0.0]] * 4),
    "logprobs -1e300": group(inference_logprobs=[[1.0, 1.0, -1e300]] * 4),
}


@pytest.fixture
def client():
    with TestClient(create_app(ApiSettings()), base_url="http://127.0.0.1") as c:
        yield c


@pytest.mark.parametrize("name", HOSTILE)
def test_the_api_refuses_what_the_trainer_cannot_train(client: TestClient, name: str) -> None:
    assert client.post("/register", json={**REG, "vocab_size": 1000}).status_code == 200
    answer = client.post("/scored_data", json=HOSTILE[name])
    assert answer.status_code == 422, (name, answer.text)
    assert "rollout" in answer.json()["message"] or "score" in answer.json()["message"]
    listed = client.post("/scored_data_list", json=[group(), HOSTILE[name]])
    assert listed.status_code == 422 and "group 1" in listed.json()["message"]
    assert client.get("/health").json()["outstanding_groups"] == 0  # nothing of a refused list was queued
    assert client.post("/scored_data", json=group(token=998)).status_code == 200


def test_without_a_registered_vocabulary_only_negative_ids_are_refused(client: TestClient) -> None:
    assert client.post("/register", json=REG).status_code == 200  # Atropos' trainer sends no vocab_size
    assert client.post("/scored_data", json=group(token=-7)).status_code == 422
    assert client.post("/scored_data", json=group(token=100_000)).status_code == 200


def test_a_group_larger_than_its_envs_group_size_is_refused_and_health_counts_the_buffer(client: TestClient) -> None:
    assert client.post("/register", json=REG).status_code == 200
    assert client.get("/batch").json()["batch"] is None  # the trainer started: envs may register
    env = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 8}
    env_id = client.post("/register-env", json=env).json()["env_id"]
    twelve = client.post("/scored_data", json=group(12, env_id=env_id))
    assert twelve.status_code == 422 and "group_size of 8" in twelve.json()["message"], twelve.text
    assert client.post("/scored_data", json=group(4, env_id=env_id)).json()["status"] == "buffered"
    health = client.get("/health").json()
    assert health["buffered_groups"] == 1 and health["outstanding_groups"] == 1 and health["queue_groups"] == 0
    assert client.post("/scored_data", json=group(8, env_id=env_id)).json() == {"status": "received"}
    assert client.post("/scored_data", json=group(4, env_id=env_id)).json() == {"status": "received"}
    assert client.get("/health").json()["outstanding_groups"] == 3
    batch = client.get("/batch").json()["batch"]
    assert sorted(len(g["tokens"]) for g in batch) == [4, 4, 8]
    assert client.get("/health").json()["outstanding_groups"] == 0


def test_the_trainer_skips_and_counts_bad_groups() -> None:
    good = ScoredGroup.model_validate(group())
    bad = [ScoredGroup.model_validate(g) for g in HOSTILE.values()]
    events: list[str] = []
    checked = CheckedBatches([[bad[0], good, *bad[1:]], bad], vocab_size=1000, on_event=events.append)
    assert list(checked) == [[good]]  # the all-bad batch is not trained
    assert checked.skipped == 2 * len(bad)
    assert "token id -7 is negative" in events[0] and len(events) == 10


def test_train_from_an_api_that_does_not_check_skips_the_group(tmp_path: Path) -> None:
    from atropos_cli.testing.threaded import ThreadedServer

    model = save_tiny_arith_model(tmp_path / "m", op="+", seed=0)
    with ThreadedServer(create_app(ApiSettings()), lifespan="on") as api:
        httpx.post(f"{api.url}/register", json={**REG, "batch_size": 8}).raise_for_status()  # no vocab_size
        for token in (100_000, 7, 8):
            assert httpx.post(f"{api.url}/scored_data", json=group(token=token)).status_code == 200
        opts = RunOptions(api_url=api.url, api_batch_size=8, wait_timeout=3)
        events: list[str] = []
        config = GRPOConfig(model=str(model), out=str(tmp_path / "run"), lr=1e-3, steps=1)
        summary = run_training(opts, config, print, events.append)
    assert summary.steps == 1 and summary.groups_skipped == 1
    assert any("token id 100000 is outside the trainer's vocabulary" in e for e in events), events
