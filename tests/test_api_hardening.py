"""`atropos api` against requests that used to poison it (issue 15): browser cross-site requests, invalid
registrations, groups no batch can hold, unknown envs, and a mixed-size queue that never formed a batch."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from atropos_cli.api.app import create_app
from atropos_cli.api.service import ApiSettings
from atropos_cli.api.store import Store

REG = {
    "wandb_group": "g", "wandb_project": "p", "batch_size": 16, "max_token_len": 64,
    "checkpoint_dir": "c", "save_checkpoint_interval": 1, "starting_step": 0, "num_steps": 10,
}  # fmt: skip
ENV = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 8}


def group(size: int, seed: int = 1, **extra: Any) -> dict[str, Any]:
    toks = [[seed, seed + 1, i] for i in range(size)]
    return {"tokens": toks, "masks": [[-100, t[1], t[2]] for t in toks], "scores": [1.0] * size, **extra}


@pytest.fixture
def client():
    with TestClient(create_app(ApiSettings()), base_url="http://127.0.0.1") as c:
        assert c.post("/register", json=REG).status_code == 200
        yield c


def _queue(c: TestClient) -> int:
    return c.get("/status").json()["queue_size"]


@pytest.mark.parametrize(
    "headers",
    [
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ],
)
def test_browser_cross_site_requests_are_refused(client: TestClient, headers: dict[str, str]) -> None:
    posted = client.post("/scored_data", json=group(2), headers=headers)
    assert posted.status_code == 403 and "refused" in posted.json()["message"]
    assert client.get("/reset_data", headers=headers).status_code == 403  # <img src=".../reset_data">
    assert client.get("/info").json()["batch_size"] == 16 and _queue(client) == 0


def test_text_plain_bodies_are_refused_and_json_from_loopback_pages_and_programs_passes(client: TestClient) -> None:
    body = json.dumps(group(2)).encode()
    plain = client.post("/scored_data", content=body, headers={"Content-Type": "text/plain"})  # fetch(no-cors)
    assert plain.status_code == 415 and "application/json" in plain.json()["message"]
    form = client.post("/scored_data", content=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert form.status_code == 415 and _queue(client) == 0
    zipped = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Sec-Fetch-Site": "same-origin"}
    assert client.post("/scored_data", content=gzip.compress(body), headers=zipped).status_code == 200
    local = {"Origin": "http://127.0.0.1:8000", "Content-Type": "application/json; charset=utf-8"}
    assert client.post("/scored_data", content=body, headers=local).status_code == 200
    assert _queue(client) == 2
    assert client.post("/reset_data").text == "Reset successful"  # POST works too (no body, no content type)


@pytest.mark.parametrize(
    ("field", "value"), [("min_batch_allocation", 1e308), ("min_batch_allocation", -0.5), ("group_size", 0)]
)
def test_register_env_rejects_values_that_would_break_batching(client: TestClient, field: str, value: Any) -> None:
    client.get("/batch")
    resp = client.post("/register-env", json={**ENV, field: value})
    assert resp.status_code == 422 and field in resp.json()["message"]
    client.post("/scored_data", json=group(8))
    client.post("/scored_data", json=group(8, seed=2))
    assert len(client.get("/batch").json()["batch"]) == 2


def test_a_poisoned_env_stored_by_an_older_version_is_neutralised_on_restart(tmp_path: Path) -> None:
    store = Store(str(tmp_path))
    store.set_kv("registration", REG)
    store.set_kv("started", True)
    store.put_env(0, {**ENV, "min_batch_allocation": 1e308, "real_name": "e_0", "connected": True})
    store.close()
    with TestClient(create_app(ApiSettings(state_dir=str(tmp_path))), base_url="http://127.0.0.1") as c:
        assert "restored as disconnected" in c.app.state.service.restore_notes[0]
        assert c.post("/scored_data", json=group(8)).status_code == 200
        assert c.post("/scored_data", json=group(8, seed=2)).status_code == 200
        resp = c.get("/batch")
        assert resp.status_code == 200 and len(resp.json()["batch"]) == 2
        assert c.request("GET", "/status-env", json={"env_id": 0}).status_code == 200


@pytest.mark.parametrize("batch_size", [0, -4])
def test_register_rejects_a_batch_size_below_one(batch_size: int) -> None:
    with TestClient(create_app(ApiSettings()), base_url="http://127.0.0.1") as c:
        resp = c.post("/register", json={**REG, "batch_size": batch_size})
        assert resp.status_code == 422 and "batch_size" in resp.json()["message"]
        assert c.get("/info").json()["batch_size"] == -1


def test_groups_of_empty_sequences_and_bad_env_ids_are_rejected(client: TestClient) -> None:
    empty = {"tokens": [[], []], "masks": [[], []], "scores": [1.0, 0.0]}
    resp = client.post("/scored_data", json=empty)
    assert resp.status_code == 422 and "no tokens" in resp.json()["message"]
    negative = client.post("/scored_data", json=group(2, env_id=-1))
    assert negative.status_code == 422 and "negative" in negative.json()["message"]
    unknown = client.post("/scored_data_list", json=[group(2), group(2, env_id=7)])
    assert unknown.status_code == 422 and "env_id 7" in unknown.json()["message"]
    assert _queue(client) == 0  # the whole list is refused, not half of it


def test_a_group_larger_than_the_batch_is_refused_at_ingest(client: TestClient) -> None:
    resp = client.post("/scored_data", json=group(17))
    assert resp.status_code == 422 and "batch_size of 16" in resp.json()["message"]
    assert _queue(client) == 0


def test_a_12_rollout_group_among_8s_does_not_block_batches(client: TestClient) -> None:
    client.post("/scored_data", json=group(12))
    for seed in range(4):
        client.post("/scored_data", json=group(8, seed=seed + 10))
    first = client.get("/batch").json()["batch"]
    assert first is not None and sorted(len(g["tokens"]) for g in first) == [8, 8]
    second = client.get("/batch").json()["batch"]
    assert second is not None and sorted(len(g["tokens"]) for g in second) == [8, 8]
    assert client.get("/batch").json()["batch"] is None  # the 12 waits for a 4 to pair with
    assert _queue(client) == 1
    client.post("/scored_data", json=group(4, seed=99))
    last = client.get("/batch").json()["batch"]
    assert sorted(len(g["tokens"]) for g in last) == [4, 12]
