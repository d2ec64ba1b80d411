"""`harness:PROGRAM` under `atropos process`, `serve` and `train` on the shipped model (CPU, offline): the agent
program (tests/harness/agent.py) runs once per rollout against the recording proxy, the verifier program
scores it, and the groups hold the sampled tokens exactly (train's recomputed logprobs match the recorded
ones). The commands run as parallel subprocesses in one module fixture; the tests read what they wrote."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from atropos_cli.api.app import create_app
from atropos_cli.api.service import ApiSettings
from atropos_cli.inference.tokenizer import load_tokenizer
from atropos_cli.resources import resolve_model_path
from atropos_cli.testing.threaded import ThreadedServer
from test_serve import start_trainer

HERE = Path(__file__).parent / "harness"
SPEC = f"harness:{HERE / 'agent.py'}"
FLAGS = [
    "--env.data_path", str(HERE / "tasks.jsonl"), "--env.verifier", str(HERE / "verify.py"),
    "--env.max_token_length", "8", "--env.args", '["--turns", "2"]',
]  # fmt: skip
MIXED = ["--env.data_path", str(HERE / "mixed_tasks.jsonl")]  # task "plain" appends, task "rewrite" edits


def atropos(*args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-c", "from atropos_cli.cli.app import main; main()", *args]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture(scope="module")
def ran(tmp_path_factory) -> Iterator[tuple[Path, dict[str, subprocess.CompletedProcess], str]]:
    tmp = tmp_path_factory.mktemp("harness")
    with ThreadedServer(create_app(ApiSettings()), lifespan="on") as api:
        start_trainer(api.url, batch_size=2)
        commands = {
            "process": ["process", SPEC, *FLAGS, *MIXED, "--num-groups", "2", "--group-size", "2",
                        "--out", str(tmp / "p")],
            "serve": ["serve", SPEC, *FLAGS, "--env.group_size", "2", "--api-url", api.url, "--max-groups", "2",
                      "--spill", str(tmp / "spill.jsonl")],
            "train": ["train", SPEC, *FLAGS, "--steps", "1", "--groups-per-step", "1", "--env.group_size", "2",
                      "--out", str(tmp / "t")],
        }  # fmt: skip
        started = {name: atropos(*args) for name, args in commands.items()}
        done = {}
        for name, proc in started.items():
            out, err = proc.communicate(timeout=300)
            done[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        batches = []
        while batch := httpx.get(api.url + "/batch").json()["batch"]:
            batches.extend(batch)
        yield tmp, done, json.dumps(batches)


def groups(path: Path) -> list[dict]:
    return [json.loads(line) for line in (path / "groups.jsonl").read_text().splitlines()]


def test_process_writes_the_sampled_tokens_of_each_agent_run_scored_by_the_verifier(ran) -> None:
    tmp, done, _ = ran
    assert done["process"].returncode == 0, done["process"].stderr
    tokenizer = load_tokenizer(resolve_model_path("atropos-tiny-arith"))
    plain = {g["meta"]["item_id"]: g for g in groups(tmp / "p")}["plain"]
    assert len(plain["tokens"]) == 2 and plain["inference_logprobs"] is not None
    for tokens, masks, messages, score, meta in zip(
        plain["tokens"], plain["masks"], plain["messages"], plain["scores"], plain["meta"]["rollouts"], strict=True
    ):
        replies = [m["content"] for m in messages if m["role"] == "assistant"]
        assert [m["role"] for m in messages] == ["user", "assistant", "user", "assistant"]
        # the trained tokens are the two replies as sampled (with the end-of-turn token where the model ended)
        trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
        assert tokenizer.decode(trained, skip_special_tokens=True) == "".join(replies)
        assert tokenizer.decode(tokens).startswith("<|user|>What is ")
        assert meta["calls"] == 2 and meta["exact"] and meta["drift"] == []
        correct = float("5" in replies[-1])
        assert score == correct and meta["reward_parts"] == {"correct": correct, "calls": 2.0}


def test_a_harness_that_rewrites_its_history_gives_a_row_per_segment_with_the_drift(ran) -> None:
    tmp, done, _ = ran
    rewrite = {g["meta"]["item_id"]: g for g in groups(tmp / "p")}["rewrite"]
    assert len(rewrite["tokens"]) == 4  # two rollouts, two segments each
    kinds = [[d["kind"] for d in meta["drift"]] for meta in rewrite["meta"]["rollouts"]]
    assert kinds == [["history_rewritten"]] * 4
    assert rewrite["scores"][0] == rewrite["scores"][1] and rewrite["scores"][2] == rewrite["scores"][3]
    assert [len(m) for m in rewrite["messages"]] == [2, 4, 2, 4]


def test_serve_posts_the_harness_groups_to_the_api(ran) -> None:
    _, done, batches = ran
    assert done["serve"].returncode == 0, done["serve"].stderr
    assert "sent 2 groups" in done["serve"].stdout
    posted = json.loads(batches)
    assert len(posted) == 2 and all(len(g["tokens"]) == 2 and g["masks"] for g in posted)


def test_train_steps_on_harness_rollouts_whose_logprobs_it_reproduces(ran) -> None:
    tmp, done, _ = ran
    assert done["train"].returncode == 0, done["train"].stderr
    [step] = [json.loads(line) for line in (tmp / "t" / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert step["sequences"] == 2 and step["trained_tokens"] > 0
    assert step["logprob_gap"] < 1e-4  # the recorded logprobs are the policy's own on exactly these tokens


@pytest.mark.parametrize(
    ("args", "message", "hint"),
    [
        (["harness:no_such_agent.py"], "harness:no_such_agent.py: harness 'no_such_agent.py' does not exist", "path"),
        ([SPEC, "--env.data_path", str(HERE / "tasks.jsonl")], "has nothing to score its rollouts with",
         "--env.verifier"),
        ([SPEC, "--env.verifier", str(HERE / "verify.py")], "needs tasks", "--env.data_path"),
    ],
)  # fmt: skip
def test_bad_harness_specs_are_one_line_errors(tmp_path: Path, args: list[str], message: str, hint: str) -> None:
    proc = atropos("process", *args, "--out", str(tmp_path / "out"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert message in err and hint in err and "Traceback" not in err
