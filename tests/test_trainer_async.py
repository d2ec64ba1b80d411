"""The disaggregated loop on a CPU: `atropos train ENV --nproc-per-node 2 --inference-gpus 1` (torchrun, gloo).

Rank 0 trains, rank 1 runs the rollout engine; weights go from rank 0 to rank 1 over the process group after
every step. Every run is the real CLI in a subprocess; the runs a test compares start together (the machine's
cores are shared, the runs are short).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from test_trainer_distributed import _rank_pid  # noqa: E402

ATROPOS = [sys.executable, "-m", "atropos_cli"]
ASYNC = ["--nproc-per-node", "2", "--inference-gpus", "1"]
SMALL = ["--groups-per-step", "2", "--env.group_size", "4", "--save-every", "1", "--keep-checkpoints", "0"]
# completions of up to 16 tokens: long enough for a weight push to land in the middle of one
LONG_ENV = Path(__file__).resolve().parents[1] / "examples" / "count_env.py"


def _start(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [*ATROPOS, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, **kwargs
    )


def _finish(*procs: subprocess.Popen, timeout: float = 300) -> list[tuple[str, str]]:
    outputs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, stdout + stderr
            outputs.append((stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return outputs


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out: Path, step: int) -> dict:
    return safetensors_torch.load_file(str(out / "checkpoints" / f"step-{step}" / "model.safetensors"))


def test_staleness_0_is_the_synchronous_loop_bit_for_bit(tmp_path: Path):
    """Same seed, same items, same weights: the engine rank samples what the one-process loop samples."""
    one, two = tmp_path / "one", tmp_path / "two"
    flags = ["--steps", "3", "--lr", "1e-3", *SMALL]
    _finish(
        _start("train", "arithmetic", "--out", str(one), *flags),
        _start("train", "arithmetic", "--out", str(two), *flags, *ASYNC),
    )
    assert len(_metrics(one)) == len(_metrics(two)) == 3  # --steps 3: a step each line
    for a, b in zip(_metrics(one), _metrics(two), strict=True):
        assert (a["loss"], a["grad_norm"], a["reward_mean"]) == (b["loss"], b["grad_norm"], b["reward_mean"])
        assert b["staleness_0"] == b["sequences"] and b["staleness_max"] == 0
    for step in (1, 2, 3):
        a, b = _weights(one, step), _weights(two, step)
        assert all(torch.equal(a[k], b[k]) for k in a), step


def _logprobs(model_dir: str, tokens: list[int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([tokens])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    return [0.0] + [float(logp[i - 1, tokens[i]]) for i in range(1, len(tokens))]


def test_bounded_staleness_records_the_version_of_every_token(tmp_path: Path):
    """S=1 and S=2: nothing older than S is trained, versions never go back within a sequence, and each
    sequence's tokens up to its first swap have exactly the logprobs of the checkpoint their version names."""
    from atropos_cli.resources import DEFAULT_MODEL, resolve_model_path

    runs = {s: tmp_path / f"s{s}" for s in (1, 2)}
    flags = ["--steps", "3", "--lr", "3e-2", "--save-rollouts", "--env.max_token_length", "16", *SMALL, *ASYNC]
    _finish(
        *(
            _start("train", str(LONG_ENV), "--out", str(out), *flags, "--max-staleness", str(s))
            for s, out in runs.items()
        )
    )
    for bound, out in runs.items():
        metrics = _metrics(out)
        assert max(m["staleness_max"] for m in metrics) <= bound
        assert sum(m["staleness_mean"] for m in metrics) > 0  # the engine did run ahead of the trainer
        assert all(m["stale_dropped"] == 0 and m["versions_unmatched"] == 0 for m in metrics)
        checked = 0
        for line in (out / "trained_rollouts.jsonl").read_text().splitlines():
            group = json.loads(line)
            trainer_version = group["trained_step"] - 1
            for i, rollout in enumerate(group["meta"]["rollouts"]):
                versions = rollout["policy_versions"]
                trained = [p for p, m in enumerate(group["masks"][i]) if m != -100]
                assert len(versions) == len(trained) and versions == sorted(versions)
                assert trainer_version - bound <= versions[0] and versions[-1] <= trainer_version
                assert group["meta"]["policy_version"] <= versions[0]
                first = versions[0]
                weights = str(out / "checkpoints" / f"step-{first}") if first else resolve_model_path(DEFAULT_MODEL)
                expected = _logprobs(weights, group["tokens"][i])
                for p, v in zip(trained, versions, strict=True):
                    if v != first:
                        break  # after a swap the KV cache mixes two versions: no single checkpoint reproduces it
                    assert group["inference_logprobs"][i][p] == pytest.approx(expected[p], abs=1e-4)
                    checked += 1
        assert checked > 0


def test_several_trainer_ranks_and_several_engines(tmp_path: Path):
    """3 ranks: 2 trainers (FSDP2 over their own group, sharded checkpoints) + 1 engine, and 1 trainer + 2 engines
    (each engine samples its share of the step's groups)."""
    two_trainers, two_engines = tmp_path / "t2", tmp_path / "e2"
    flags = ["--steps", "2", "--groups-per-step", "3", "--env.group_size", "4", "--max-staleness", "1"]
    flags += ["--nproc-per-node", "3", "--inference-gpus"]
    _finish(
        _start("train", "arithmetic", "--out", str(two_trainers), *flags, "1"),
        _start("train", "arithmetic", "--out", str(two_engines), *flags, "2"),
    )
    for out in (two_trainers, two_engines):
        assert [m["groups"] for m in _metrics(out)] == [3, 3]
        assert all(m["staleness_max"] <= 1 for m in _metrics(out))
    assert (two_trainers / "checkpoints" / "step-2" / "sharded" / ".metadata").is_file()
    assert (two_engines / "checkpoints" / "step-2" / "model.safetensors").is_file()


def _until_stepped(proc: subprocess.Popen, out: Path, steps: int) -> None:
    deadline = time.monotonic() + 120
    while not (out / "metrics.jsonl").is_file() or len((out / "metrics.jsonl").read_text().splitlines()) < steps:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the run never stepped"
        time.sleep(0.2)


def test_a_killed_engine_rank_stops_the_run_with_one_line(tmp_path: Path):
    out = tmp_path / "run"
    launcher = _start(
        "train", "arithmetic", "--out", str(out), "--steps", "100000", *SMALL, "--max-staleness", "1", *ASYNC
    )
    try:
        _until_stepped(launcher, out, 1)
        engine = _rank_pid(launcher.pid, rank=1)
        os.kill(engine, signal.SIGKILL)
        _, stderr = launcher.communicate(timeout=60)  # no hang: the launcher stops the trainer too
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert f"rank 1 of 2 (pid {engine}) was killed by SIGKILL (it ran a rollout engine)" in stderr, stderr
    assert "Traceback" not in stderr and stderr.count("error:") == 1, stderr


def test_ctrl_c_leaves_one_consistent_checkpoint(tmp_path: Path):
    out = tmp_path / "run"
    args = ["--steps", "100000", "--save-every", "0", "--groups-per-step", "2", "--env.group_size", "4"]
    launcher = _start(
        "train", "arithmetic", "--out", str(out), *args, "--max-staleness", "1", *ASYNC, start_new_session=True
    )
    try:
        _until_stepped(launcher, out, 2)
        os.killpg(launcher.pid, signal.SIGINT)
        _, stderr = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 130, stderr
    steps = len(_metrics(out))
    saved = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert saved == [f"step-{steps}"], (saved, steps, stderr)  # whole, no .tmp- left
    state = json.loads((out / "checkpoints" / f"step-{steps}" / "trainer_state.json").read_text())
    assert state["step"] == steps
    assert f"interrupted; the checkpoint {out}/checkpoints/step-{steps} holds the last step" in stderr, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--nproc-per-node", "2", "--inference-gpus", "2"], "--inference-gpus 2 needs --nproc-per-node above 2"),
        (["--max-staleness", "1"], "--max-staleness needs --inference-gpus"),
        ([*ASYNC, "--inference", "vllm"], "--inference vllm with it is not supported"),
        ([*ASYNC, "--data", "x.jsonl"], "--inference-gpus is for the one-command loop"),
    ],
)
def test_flags_that_do_not_fit_fail_before_any_rank_starts(tmp_path: Path, flags: list[str], message: str):
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    result = CliRunner().invoke(app, ["train", "arithmetic", "--out", str(tmp_path / "o"), *flags])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "o").exists()
