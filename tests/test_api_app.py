"""`atropos api` over HTTP: Atropos wire shapes (against answers recorded from atroposlib 0.4.0), every bad
input (4xx with a message, queue unchanged), backpressure, auth, reset, health and metrics."""

from __future__ import annotations

import gzip
import json
import resource
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from atropos_cli.api.app import create_app
from atropos_cli.api.service import ApiSettings

SESSION = json.loads((Path(__file__).parent / "data" / "atroposlib" / "session.json").read_text())
REG = {
    "wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 64,
    "checkpoint_dir": "c", "save_checkpoint_interval": 1, "starting_step": 0, "num_steps": 10,
}  # fmt: skip


def group(size: int = 2, seed: int = 1, **extra: Any) -> dict[str, Any]:
    toks = [[seed, seed + 1, i] for i in range(size)]
    return {"tokens": toks, "masks": [[-100, t[1], t[2]] for t in toks], "scores": [1.0] * size, **extra}


def make_client(**settings: Any) -> TestClient:
    return TestClient(create_app(ApiSettings(**settings)), base_url="http://127.0.0.1")


@pytest.fixture
def client() -> Iterator[TestClient]:
    with make_client(max_queue_groups=5, max_body_mb=1) as c:
        assert c.post("/register", json=REG).status_code == 200
        yield c


def _same_shape(ours: Any, theirs: Any, where: str) -> None:
    assert type(ours) is type(theirs) or {type(ours), type(theirs)} <= {int, float}, where
    if isinstance(theirs, dict):
        assert sorted(ours) == sorted(theirs), where
        for key in theirs:
            _same_shape(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, list) and theirs and ours:
        _same_shape(ours[0], theirs[0], f"{where}[0]")


# Where we answer differently from atroposlib on purpose: a real status code instead of 200 + error body,
# and batches served oldest first (atroposlib pops the newest formed batch first).
STATUS_DIFFERENCES = {"batch_unregistered": 409}
BATCHES = ("batch", "batch_second")


def test_replaying_atroposlib_session_gives_the_same_answers() -> None:
    batches: dict[str, list[Any]] = {}
    with make_client() as c:
        for ex in SESSION["exchanges"]:
            content = None if ex["request"] is None else json.dumps(ex["request"]).encode()
            headers = {"Content-Type": "application/json"}
            if ex["gzip"] and content is not None:
                content, headers["Content-Encoding"] = gzip.compress(content), "gzip"
            resp = c.request(ex["method"], ex["path"], content=content, headers=headers)
            assert resp.status_code == STATUS_DIFFERENCES.get(ex["name"], ex["status"]), ex["name"]
            ours = resp.json() if resp.headers["content-type"].startswith("application/json") else resp.text
            _same_shape(ours, ex["response"], ex["name"])
            if ex["name"] in BATCHES:
                batches[ex["name"]] = ours["batch"]
            elif ex["name"] != "register":  # the uuid is random
                assert ours == ex["response"], ex["name"]
    theirs = [ex["response"]["batch"] for ex in SESSION["exchanges"] if ex["name"] in BATCHES]
    assert sorted(map(json.dumps, batches.values())) == sorted(map(json.dumps, theirs))
    assert batches["batch"][0]["tokens"][0][0] == 10, "oldest groups are served first"


def _queue_size(c: TestClient) -> int:
    return c.get("/status").json()["queue_size"]


def _gzip_bomb(inflated_mib: int) -> bytes:
    comp = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"[" * (1 << 20)
    return b"".join(comp.compress(chunk) for _ in range(inflated_mib)) + comp.flush()


BAD_GROUPS: list[tuple[str, bytes, dict[str, str], int, str]] = [
    ("mask_length", json.dumps({**group(), "masks": [[1], [1, 2, 3]]}).encode(), {}, 422,
     "rollout 0: tokens has 3 entries but masks has 1"),
    ("scores_count", json.dumps({**group(), "scores": [1.0]}).encode(), {}, 422, "scores has 1"),
    ("empty_group", json.dumps({"tokens": [], "masks": [], "scores": []}).encode(), {}, 422, "group is empty"),
    ("wrong_type", json.dumps({**group(), "tokens": "abc"}).encode(), {}, 422, "tokens"),
    ("nan_score", b'{"tokens":[[1]],"masks":[[1]],"scores":[NaN]}', {}, 400, "NaN and Infinity are not JSON"),
    ("inf_logprob", b'{"tokens":[[1]],"masks":[[1]],"scores":[1],"inference_logprobs":[[Infinity]]}', {}, 400,
     "invalid JSON"),
    ("no_tokens", json.dumps({"scores": [1.0, 0.0]}).encode(), {}, 422, "group has no token ids"),
    ("not_an_object", b"[1, 2]", {}, 422, "must be a JSON object"),
    ("bad_message", json.dumps({**group(1), "messages": [[{"content": "x"}]]}).encode(), {}, 422,
     "needs 'role' and 'content'"),
    ("bad_gzip", b"\x1f\x8b not gzip", {"Content-Encoding": "gzip"}, 400, "Invalid gzip payload"),
    ("truncated_gzip", gzip.compress(json.dumps(group()).encode())[:20], {"Content-Encoding": "gzip"}, 400,
     "Invalid gzip payload"),
    ("too_large", b" " * (1024 * 1024 + 10) + json.dumps(group()).encode(), {}, 413, "over the limit"),
    ("empty_body", b"", {}, 400, "body is empty"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "body", "headers", "status", "message"), BAD_GROUPS, ids=[b[0] for b in BAD_GROUPS])
def test_bad_groups_get_4xx_and_leave_the_queue_unchanged(
    client: TestClient, name: str, body: bytes, headers: dict[str, str], status: int, message: str
) -> None:
    assert client.post("/scored_data", json=group()).status_code == 200
    resp = client.post("/scored_data", content=body, headers={"Content-Type": "application/json", **headers})
    assert resp.status_code == status, resp.text
    answer = resp.json()
    assert message in f"{answer['message']} {answer['hint']}"
    assert _queue_size(client) == 1
    assert client.get("/metrics").status_code == 200


def test_one_bad_group_rejects_the_whole_list(client: TestClient) -> None:
    resp = client.post("/scored_data_list", json=[group(), {**group(), "scores": [float("1")]}])
    assert resp.status_code == 422
    assert "invalid group 1" in resp.json()["message"]
    assert _queue_size(client) == 0
    resp = client.post("/scored_data_list", json=[group(), group(seed=7)])
    assert resp.json() == {"status": "received", "groups_processed": 2}
    resp = client.post("/scored_data_list", json=[group(seed=s) for s in range(6)])  # limit is 5
    assert resp.status_code == 413 and "over the queue limit of 5" in resp.json()["message"]


def test_gzip_bomb_is_refused_after_inflating_at_most_the_limit(client: TestClient) -> None:
    bomb = _gzip_bomb(512)  # ~0.5 MB on the wire, 512 MiB inflated
    assert len(bomb) < 1024 * 1024
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    resp = client.post("/scored_data", content=bomb, headers=headers)
    assert resp.status_code == 413
    assert "inflates past the limit" in resp.json()["message"]
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024
    assert grown_mib < 64, f"peak RSS grew {grown_mib:.0f} MiB"
    assert _queue_size(client) == 0


def test_groups_before_any_trainer_get_409() -> None:
    with make_client() as c:
        resp = c.post("/scored_data", json=group())
        assert resp.status_code == 409
        assert "no trainer has registered" in resp.json()["message"]
        assert c.get("/batch").status_code == 409


def test_full_queue_answers_503_with_retry_after_until_a_batch_is_pulled(client: TestClient) -> None:
    for seed in range(5):
        assert client.post("/scored_data", json=group(seed=seed)).status_code == 200
    resp = client.post("/scored_data", json=group(seed=9))
    assert resp.status_code == 503
    assert resp.headers["Retry-After"] == "1"
    assert "queue is full (5 groups, limit 5)" in resp.json()["message"]
    assert len(client.get("/batch").json()["batch"]) == 2  # 4 sequences = 2 groups; a 2nd batch is prefetched
    assert client.post("/scored_data", json=group(seed=10)).status_code == 200
    metrics = client.get("/metrics").text
    assert 'atropos_api_rejected_groups_total{reason="queue_full"} 1' in metrics


def test_api_key_is_required_on_every_endpoint() -> None:
    with make_client(api_key="s3cret", disable_reset=True) as c:
        for path in ("/", "/status", "/batch", "/metrics", "/health", "/reset_data"):
            assert c.get(path).status_code == 401, path
        assert c.post("/register", json=REG).status_code == 401
        wrong = {"Authorization": "Bearer nope"}
        assert c.get("/status", headers=wrong).status_code == 401
        ok = {"Authorization": "Bearer s3cret"}
        assert c.post("/register", json=REG, headers=ok).status_code == 200
        assert c.post("/scored_data", json=group(), headers=ok).json() == {"status": "received"}
        resp = c.get("/reset_data", headers=ok)
        assert resp.status_code == 403
        assert _queue_size_auth(c, ok) == 1


def _queue_size_auth(c: TestClient, headers: dict[str, str]) -> int:
    return c.get("/status", headers=headers).json()["queue_size"]


def test_reset_wipes_the_state_when_enabled(client: TestClient) -> None:
    client.post("/scored_data", json=group())
    assert client.get("/reset_data").text == "Reset successful"
    assert client.get("/info").json() == {"batch_size": -1, "max_token_len": -1}


def test_status_env_accepts_a_get_with_a_json_body_and_unknown_env_is_404(client: TestClient) -> None:
    client.get("/batch")
    env = {"max_token_length": 64, "desired_name": "e", "weight": 1.0, "group_size": 2}
    env_id = client.post("/register-env", json=env).json()["env_id"]
    client.post("/scored_data", json=group(env_id=env_id))
    resp = client.request("GET", "/status-env", json={"env_id": env_id})
    assert resp.json()["self_queue_size"] == 1
    assert client.get(f"/status-env?env_id={env_id}").json() == resp.json()
    assert client.request("GET", "/status-env", json={"env_id": 9}).status_code == 404
    assert client.request("GET", "/status-env", json={"nope": 1}).status_code == 422


def test_health_and_metrics_report_queue_depth_per_env(client: TestClient) -> None:
    client.get("/batch")
    env = {"max_token_length": 64, "desired_name": "gsm8k", "weight": 1.0, "group_size": 2}
    env_id = client.post("/register-env", json=env).json()["env_id"]
    client.post("/scored_data", json=group(env_id=env_id))
    client.post("/scored_data", content=b"{", headers={"Content-Type": "application/json"})
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["durable"] is False and health["queue_groups"] == 1
    metrics = client.get("/metrics")
    assert metrics.headers["content-type"].startswith("text/plain")
    assert 'atropos_api_queue_groups{env="gsm8k_0"} 1' in metrics.text
    assert 'atropos_api_queue_sequences{env="gsm8k_0"} 2' in metrics.text
    assert 'atropos_api_rejected_groups_total{reason="bad_json"} 1' in metrics.text
    assert "# TYPE atropos_api_ingested_groups_total counter" in metrics.text


def test_weighted_mix_composes_batches_by_env_weight() -> None:
    with make_client(mix="weighted") as c:
        c.post("/register", json={**REG, "batch_size": 8})
        c.get("/batch")
        heavy = c.post("/register-env", json={"max_token_length": 64, "desired_name": "heavy", "weight": 3.0,
                                               "group_size": 2}).json()["env_id"]  # fmt: skip
        light = c.post("/register-env", json={"max_token_length": 64, "desired_name": "light", "weight": 1.0,
                                               "group_size": 2}).json()["env_id"]  # fmt: skip
        for seed in range(8):  # the light env floods the queue first
            c.post("/scored_data", json=group(seed=seed, env_id=light))
        for seed in range(8):
            c.post("/scored_data", json=group(seed=100 + seed, env_id=heavy))
        batch = c.get("/batch").json()["batch"]
        assert [g["env_id"] for g in batch].count(heavy) == 3
        assert [g["env_id"] for g in batch].count(light) == 1


def test_out_of_range_numbers_are_4xx_never_500(client: TestClient) -> None:
    huge = 10**25
    for body in (
        json.dumps({**group(), "env_id": huge}),
        json.dumps({**group(1), "tokens": [[huge, 1, 2]]}),
        '{"tokens":[[1]],"masks":[[1]],"scores":[1e400]}',
    ):
        resp = client.post("/scored_data", content=body.encode(), headers={"Content-Type": "application/json"})
        assert 400 <= resp.status_code < 500, resp.text
    json_type = {"Content-Type": "application/json"}
    assert client.post("/scored_data", content=b"\xff\xfe", headers=json_type).json()["hint"] is None
    assert _queue_size(client) == 0
