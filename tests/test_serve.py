"""`atropos serve` against a real `atropos api` on 127.0.0.1: registration, posting, local copy, off-policy
pause, 503 backpressure without loss, Ctrl-C spill and re-send, and the no-token-ids error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest

from atropos_cli.api.app import create_app
from atropos_cli.api.service import ApiSettings
from atropos_cli.env.loading import load_env
from atropos_cli.errors import AtroposError
from atropos_cli.runs.serve import ServeOptions, serve_env
from atropos_cli.testing.threaded import ThreadedServer

ENV_FILE = str(Path(__file__).parent / "data" / "serve" / "counting_env.py")
NO_SERVER = "http://127.0.0.1:9/v1"  # never called: the counting env makes its groups itself


@contextmanager
def running_api(**settings: Any) -> Iterator[str]:
    with ThreadedServer(create_app(ApiSettings(**settings)), lifespan="on") as server:
        yield server.url


def start_trainer(url: str, batch_size: int = 4, headers: dict[str, str] | None = None) -> None:
    reg = {
        "wandb_group": "g", "wandb_project": "p", "batch_size": batch_size, "max_token_len": 64,
        "checkpoint_dir": "c", "save_checkpoint_interval": 1, "starting_step": 0, "num_steps": 1000,
    }  # fmt: skip
    httpx.post(url + "/register", json=reg, headers=headers).raise_for_status()
    httpx.get(url + "/batch", headers=headers).raise_for_status()


def load(*flags: str) -> Any:
    return load_env(ENV_FILE, ["--openai.base_url", NO_SERVER, "--env.group_size", "2", *flags], None)


def pull_all(url: str) -> list[int]:
    items = []
    while batch := httpx.get(url + "/batch").json()["batch"]:
        items.extend(g["tokens"][0][0] for g in batch)
    return items


def test_serve_posts_groups_and_keeps_a_local_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_ITEMS", "6")
    copy = tmp_path / "groups.jsonl"
    with running_api() as url:
        start_trainer(url)
        loaded = load("--env.data_path_to_save_groups", str(copy), "--env.max_batches_offpolicy", "0")
        stats = asyncio.run(serve_env(loaded, ServeOptions(api_url=url, spill_path=str(tmp_path / "spill.jsonl"))))
        assert (stats.env_id, stats.wandb_name, stats.counts.groups) == (0, "counting_0", 6)
        assert sorted(pull_all(url)) == [0, 1, 2, 3, 4, 5]
    lines = [json.loads(line) for line in copy.read_text().splitlines()]
    assert sorted(rec["tokens"][0][0] for rec in lines) == [0, 1, 2, 3, 4, 5]
    assert not (tmp_path / "spill.jsonl").exists()


async def wait_until(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    """Poll `condition()` until true, failing after `timeout_s` (instead of sleeping "long enough")."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _serve_until_paused(loaded: Any, options: ServeOptions, url: str) -> None:
    """Run serve until the off-policy bound has paused it and every finished group is in the API's queue."""
    seen: list[Any] = []
    task = asyncio.create_task(serve_env(loaded, options, lambda stats, message: seen.append(stats)))

    def settled() -> bool:
        assert not task.done()
        if not seen or not seen[0].paused or seen[0].in_flight:
            return False
        return httpx.get(url + "/status").json()["queue_size"] == getattr(loaded.env, "finished", -1)

    await wait_until(settled, "the off-policy pause")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_offpolicy_bound_pauses_new_rollouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_DELAY", "0.05")
    with running_api() as url:
        start_trainer(url, batch_size=4)
        loaded = load("--env.max_batches_offpolicy", "2", "--env.max_num_workers", "8")
        options = ServeOptions(api_url=url, poll_s=0.02, spill_path=str(tmp_path / "spill.jsonl"))
        asyncio.run(_serve_until_paused(loaded, options, url))
        queued = httpx.get(url + "/status").json()["queue_size"]
        # bound: 2 batches x 4 sequences = 4 groups of 2; workers already in flight may add a few, never many.
        assert 4 <= queued <= 8, queued
        assert loaded.env.next_index <= 8


def rejected_for_a_full_queue(url: str) -> int:
    """The API's count of groups it turned away because its queue was full."""
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith('atropos_api_rejected_groups_total{reason="queue_full"}'):
            return int(float(line.split()[-1]))
    return 0


def test_full_queue_slows_serve_down_without_losing_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_ITEMS", "12")
    with running_api(max_queue_groups=3) as url:
        start_trainer(url, batch_size=2)
        pulled: list[int] = []
        unanswered: list[str] = []
        stop = threading.Event()

        def slow_trainer() -> None:
            """Pull a batch only after the API turned a group away for a full queue (counted in its /metrics), so
            serve meets the full queue before every pull, however fast or slow each side runs."""
            answered, deadline = 0, time.monotonic() + 30
            while not stop.is_set():
                turned_away = rejected_for_a_full_queue(url)
                if turned_away == answered and time.monotonic() < deadline:
                    stop.wait(0.01)  # poll the counter
                    continue
                if turned_away == answered:
                    unanswered.append("no group turned away in 30 s: pulled anyway")
                answered, deadline = turned_away, time.monotonic() + 30
                resp = httpx.get(url + "/batch")
                assert resp.status_code == 200, resp.text
                pulled.extend(g["tokens"][0][0] for g in resp.json()["batch"] or [])

        trainer = threading.Thread(target=slow_trainer, daemon=True)
        trainer.start()
        loaded = load("--env.max_batches_offpolicy", "0", "--env.steps_per_eval", "2")
        stats = asyncio.run(serve_env(loaded, ServeOptions(api_url=url, spill_path=str(tmp_path / "s.jsonl"))))
        assert stats.counts.groups == 12
        assert stats.evals and stats.evals[0]["metrics"] == {"eval/count": 1.0}  # evaluate() every 2 steps
        assert any("got 503" in e for e in stats.events), stats.events
        stop.set()
        trainer.join(5)
        pulled.extend(pull_all(url))
        assert sorted(pulled) == list(range(12)) and not unanswered, unanswered
        metrics = httpx.get(url + "/metrics").text
        assert 'atropos_api_rejected_groups_total{reason="queue_full"}' in metrics


def test_ctrl_c_spills_unsent_groups_and_the_next_serve_sends_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spill = tmp_path / "spill.jsonl"
    state = tmp_path / "api"
    monkeypatch.setenv("SERVE_TEST_ITEMS", "3")
    monkeypatch.setenv("SERVE_TEST_DELAY", "0.5")
    loaded = load("--env.max_batches_offpolicy", "0")

    async def go() -> None:
        # Register against a live API, take the API away before the groups are done, then press "Ctrl-C".
        with running_api(state_dir=str(state)) as url:
            start_trainer(url, batch_size=2)
            task = asyncio.create_task(serve_env(loaded, ServeOptions(api_url=url, spill_path=str(spill))))
            await wait_until(
                lambda: getattr(loaded.env, "next_index", 0) == 3, "registration and three rollouts started"
            )
        await wait_until(lambda: getattr(loaded.env, "finished", 0) == 3, "the three groups to finish")
        for _ in range(20):  # loop turns, not seconds: let each worker hand its group to the sender
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(go())
    spilled = [json.loads(line)["tokens"][0][0] for line in spill.read_text().splitlines()]
    assert sorted(spilled) == [0, 1, 2], "finished groups were neither sent nor spilled"
    monkeypatch.setenv("SERVE_TEST_ITEMS", "0")
    monkeypatch.setenv("SERVE_TEST_DELAY", "0")
    with running_api(state_dir=str(state)) as url:
        reloaded = load("--env.max_batches_offpolicy", "0")
        stats = asyncio.run(serve_env(reloaded, ServeOptions(api_url=url, spill_path=str(spill))))
        assert stats.counts.groups == 3
        assert not spill.exists()
        assert sorted(pull_all(url)) == [0, 1, 2]


def test_groups_without_token_ids_stop_serve_with_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_NO_TOKENS", "1")
    with running_api() as url:
        start_trainer(url)
        with pytest.raises(AtroposError, match="without token ids") as info:
            asyncio.run(serve_env(load(), ServeOptions(api_url=url)))
        assert "tokenizer_name" in (info.value.hint or "")


def test_cli_serve_runs_against_the_api(tmp_path: Path) -> None:
    with running_api() as url:
        start_trainer(url)
        cmd = [
            sys.executable, "-c", "from atropos_cli.cli.app import main; main()", "serve", ENV_FILE,
            "--api-url", url, "--max-groups", "4", "--openai.base_url", NO_SERVER, "--env.group_size", "2",
            "--spill", str(tmp_path / "spill.jsonl"),
        ]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        assert "sent 4 groups" in proc.stdout
        assert "registered as env 0 (counting_0)" in proc.stderr
        assert len(pull_all(url)) == 4


def test_serve_sends_the_bearer_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_ITEMS", "2")
    auth = {"Authorization": "Bearer tok"}
    with running_api(api_key="tok") as url:
        start_trainer(url, batch_size=2, headers=auth)
        loaded = load("--env.max_batches_offpolicy", "0")
        with pytest.raises(AtroposError, match="401|bearer token"):
            asyncio.run(serve_env(loaded, ServeOptions(api_url=url, spill_path=str(tmp_path / "s.jsonl"))))
        stats = asyncio.run(
            serve_env(load(), ServeOptions(api_url=url, api_key="tok", spill_path=str(tmp_path / "s.jsonl")))
        )
        assert stats.counts.groups == 2
        assert httpx.get(url + "/status", headers=auth).json()["queue_size"] == 2


def test_rollouts_past_worker_timeout_are_dropped_and_counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_TEST_ITEMS", "2")
    monkeypatch.setenv("SERVE_TEST_DELAY", "5")
    with running_api() as url:
        start_trainer(url)
        loaded = load("--env.worker_timeout", "0.2")
        stats = asyncio.run(serve_env(loaded, ServeOptions(api_url=url, spill_path=str(tmp_path / "s.jsonl"))))
        assert (stats.counts.groups, stats.counts.failed_groups) == (0, 2)
        assert any("worker_timeout (0.2 s)" in e for e in stats.events)


def test_cli_ctrl_c_exits_130_with_a_summary(tmp_path: Path) -> None:
    with running_api() as url:
        start_trainer(url)
        cmd = [
            sys.executable, "-c", "from atropos_cli.cli.app import main; main()", "serve", ENV_FILE,
            "--api-url", url, "--openai.base_url", NO_SERVER, "--env.group_size", "2",
            "--spill", str(tmp_path / "spill.jsonl"),
        ]  # fmt: skip
        env = {**os.environ, "SERVE_TEST_DELAY": "0.2"}
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 30
        while httpx.get(url + "/status").json()["queue_size"] < 2:
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
        assert proc.returncode == 130, err
        assert "interrupted: sent" in out
        assert "finished groups were sent or spilled" in err


def _register_trainer(url: str, checkpoint_dir: Path, starting_step: int, interval: int = 1) -> None:
    reg = {
        "wandb_group": "g", "wandb_project": "p", "batch_size": 2, "max_token_len": 64,
        "checkpoint_dir": str(checkpoint_dir), "save_checkpoint_interval": interval,
        "starting_step": starting_step, "num_steps": 1000,
    }  # fmt: skip
    httpx.post(url + "/register", json=reg).raise_for_status()
    httpx.get(url + "/batch").raise_for_status()


def _options(url: str, tmp_path: Path) -> ServeOptions:
    return ServeOptions(api_url=url, poll_s=0.02, spill_path=str(tmp_path / "s.jsonl"), max_api_wait_s=10)


def test_env_state_is_checkpointed_every_interval_and_restored_by_a_later_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SERVE_TEST_ITEMS", "8")
    monkeypatch.setenv("SERVE_TEST_DELAY", "0.1")  # one rollout at a time, slow enough for steps to pass
    monkeypatch.setenv("SERVE_TEST_CHECKPOINT", "1")
    checkpoints = tmp_path / "ckpt"
    env_file = ENV_FILE
    flags = ["--openai.base_url", NO_SERVER, "--env.group_size", "2", "--env.max_batches_offpolicy", "0"]
    flags += ["--env.max_num_workers", "1"]
    with running_api() as url:
        _register_trainer(url, checkpoints, starting_step=0)
        pulled: list[int] = []
        stop = threading.Event()

        def trainer() -> None:  # each non-empty batch advances the API's step: pull one as soon as it is queued
            while not stop.is_set():
                if not httpx.get(url + "/status").json()["queue_size"]:
                    stop.wait(0.01)  # poll the queue
                    continue
                pulled.extend(g["tokens"][0][0] for g in httpx.get(url + "/batch").json()["batch"] or [])

        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        stats = asyncio.run(serve_env(load_env(env_file, flags, None), _options(url, tmp_path)))
        stop.set()
        thread.join(5)
    saved = sorted((checkpoints / "env_checkpoints" / "counting_0").glob("step-*.json"))
    assert stats.counts.groups == 8 and saved, stats.events
    assert all(0 < json.loads(p.read_text())["next_index"] <= 8 for p in saved)

    # a later run that starts at step 3 picks the stream up where step 3's checkpoint left it
    (checkpoints / "env_checkpoints" / "counting_0" / "step-3.json").write_text(json.dumps({"next_index": 5}))
    with running_api() as url:
        _register_trainer(url, checkpoints, starting_step=3)
        stats = asyncio.run(serve_env(load_env(env_file, flags, None), _options(url, tmp_path)))
        assert stats.counts.groups == 3 and any("env state of step 3 loaded" in e for e in stats.events)
        assert sorted(pull_all(url)) == [5, 6, 7]

    (checkpoints / "env_checkpoints" / "counting_0" / "step-3.json").write_text("{not json")
    with running_api() as url:
        _register_trainer(url, checkpoints, starting_step=3)
        with pytest.raises(AtroposError, match="is not valid JSON"):
            asyncio.run(serve_env(load_env(env_file, flags, None), _options(url, tmp_path)))


def test_waiting_for_the_trainer_is_said_once_then_now_and_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Counted in polls, not timed: with the report interval far away, 30 polls of /register-env with no trainer
    say it once; with a zero interval every later poll repeats it, saying for how long."""
    from atropos_cli.runs import serve as serve_module

    monkeypatch.setenv("SERVE_TEST_ITEMS", "2")
    polls: list[str] = []
    on_wait = serve_module._Server._on_wait

    def counted(self: Any, status: str) -> None:
        polls.append(status)
        on_wait(self, status)

    monkeypatch.setattr(serve_module._Server, "_on_wait", counted)

    async def go(url: str, report_s: float) -> tuple[Any, list[str]]:
        events: list[str] = []
        polls.clear()
        options = ServeOptions(
            api_url=url, register_poll_s=0.01, wait_report_s=report_s, spill_path=str(tmp_path / "spill.jsonl")
        )
        task = asyncio.create_task(serve_env(load(), options, lambda stats, message: events.append(message)))
        await wait_until(lambda: len(polls) >= 30 and not task.done(), "30 polls of /register-env")
        waits = [e for e in events if e.startswith("waiting for the trainer")]
        await asyncio.to_thread(start_trainer, url)
        return await asyncio.wait_for(task, timeout=30), waits

    with running_api() as url:
        stats, waits = asyncio.run(go(url, report_s=3600))
    assert stats.counts.groups == 2
    assert len(waits) == 1 and "(for " not in waits[0], waits  # 30+ polls, said once
    with running_api() as url:
        stats, waits = asyncio.run(go(url, report_s=0))
    assert len(waits) >= 29 and all("(for " in e for e in waits[1:]), waits  # then with how long it has waited
