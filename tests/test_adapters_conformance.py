"""The conformance battery every env adapter (`gym:`, `vf:`, `openenv:`, ...) passes, each against the real
framework in its own venv (built by .ci/run, named by an env var; skipped here with the reason when missing):

- the same seed gives the same groups (two separate processes);
- multi-turn token faithfulness: every request the env sent is a prefix of its rollout's tokens, the backend's
  own completion ids follow it, trained (unmasked) tokens are exactly those ids and nothing else;
- an env that raises becomes failure records (and a clean exit), never a crash or a traceback.

An adapter plugs in with one `Case` in tests/adapter_cases.py's CASES: a multi-turn spec, a spec whose env
raises, and its venv.
The per-adapter driver is tests/adapter_battery.py, run with that venv's python.
"""

from __future__ import annotations

import json
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from adapter_cases import CASES, ROOT, Case, atropos_python, python_of, run_env

DRIVER = ROOT / "tests" / "adapter_battery.py"
MASKED = -100


def trace(case: Case, tmp: Path, name: str, seed: int) -> dict[str, Any]:
    out = tmp / f"{name}.json"
    cmd = [atropos_python(case), str(DRIVER), case.spec, str(out), *case.dotted, "--env.group_size", "3"]
    cmd += ["--env.seed", str(seed)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=run_env(case), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())  # type: ignore[no-any-return]


@pytest.fixture(scope="module", params=CASES, ids=[c.id for c in CASES])
def battery(request, tmp_path_factory) -> tuple[Case, list[dict[str, Any]]]:
    case: Case = request.param
    python_of(case)
    tmp = tmp_path_factory.mktemp(f"battery-{case.id}")
    with ThreadPoolExecutor(2) as pool:  # two model-loading processes at once
        runs = list(pool.map(lambda a: trace(case, tmp, *a), [("a", 7), ("b", 7)]))
    return case, runs


def test_same_seed_gives_the_same_groups(battery):
    _, (first, second) = battery
    assert first["groups"], first["failures"]
    assert first["groups"] == second["groups"]
    assert first["calls"] == second["calls"]


def test_multi_turn_tokens_are_exactly_the_backends(battery):
    case, runs = battery
    multi_turn = 0
    for run in runs:
        calls = run["calls"]
        if case.multi_turn:
            assert all(c["kind"] == "completion" for c in calls), "later turns must be sent as token ids"
        for group in run["groups"]:
            for tokens, masks in zip(group["tokens"], group["masks"], strict=True):
                mine = [c for c in calls if _follows(tokens, c)]
                assert mine, "a rollout with no request that produced it"
                covered = set()
                for call in mine:
                    start = len(_prompt_ids(call))
                    end = start + len(call["completion_token_ids"])
                    assert masks[start:end] == call["completion_token_ids"]
                    covered.update(range(start, end))
                trained = {i for i, m in enumerate(masks) if m != MASKED}
                assert trained == covered, "trained tokens that no request produced (or produced ones masked)"
                assert all(masks[i] == tokens[i] for i in trained)
                multi_turn += len(mine) > 1
    assert multi_turn or not case.multi_turn, "no rollout had two turns: the battery's env must be multi-turn"


def _prompt_ids(call: dict[str, Any]) -> list[int]:
    """What the backend saw: the token ids the env sent, or (a chat request) the ids the backend rendered."""
    return call["prompt"] if call["kind"] == "completion" else call["prompt_token_ids"]


def _follows(tokens: list[int], call: dict[str, Any]) -> bool:
    prompt, completion = _prompt_ids(call), call["completion_token_ids"]
    if not isinstance(prompt, list) or call["prompt_token_ids"] not in (None, prompt) or completion is None:
        return False
    return tokens[: len(prompt)] == prompt and tokens[len(prompt) : len(prompt) + len(completion)] == completion


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_an_env_error_is_a_failure_record_not_a_crash(case, tmp_path):
    out = tmp_path / "run"
    cmd = [atropos_python(case), "-m", "atropos_cli", "process", case.broken_spec, "--out", str(out)]
    cmd += ["--num-groups", "2", "--group-size", "2", "--env.max_token_length", "8"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=run_env(case), timeout=600)
    assert "Traceback" not in done.stderr + done.stdout
    failures = [json.loads(line) for line in (out / "failures.jsonl").read_text().splitlines()]
    rollouts = [f for f in failures if f["kind"] == "rollout"]
    assert len(rollouts) == 4, failures
    assert all("failed on purpose" in f["error"] for f in rollouts)
    assert done.returncode != 0 or "4 rollouts failed" in done.stdout + done.stderr


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_serve_posts_the_adapters_groups_to_the_trajectory_api(case, tmp_path, trajectory_api):
    import httpx

    api = trajectory_api()
    registration = {
        "wandb_group": "g", "wandb_project": "p", "batch_size": 4, "max_token_len": 256, "checkpoint_dir": "c",
        "save_checkpoint_interval": 1, "starting_step": 0, "num_steps": 10,
    }  # fmt: skip
    httpx.post(api.url + "/register", json=registration).raise_for_status()
    httpx.get(api.url + "/batch").raise_for_status()  # the trainer has started: serve may send
    cmd = [atropos_python(case), "-m", "atropos_cli", "serve", case.spec, "--api-url", api.url, "--max-groups", "2"]
    cmd += [*case.dotted, "--group-size", "2"]
    done = subprocess.run(cmd, capture_output=True, text=True, env=run_env(case), timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    batch = httpx.get(api.url + "/batch").json()["batch"]
    assert batch and sum(len(g["tokens"]) for g in batch) == 4
    assert all(g["env_id"] is not None for g in batch)
