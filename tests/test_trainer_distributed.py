"""Many-process training on a CPU: `atropos train --nproc-per-node 2` (torchrun, gloo, FSDP2) against one process.

Every run here is the real CLI in a subprocess: torchrun starts the ranks, they join a gloo group on
127.0.0.1, shard the shipped model with FSDP2 and write checkpoints; the tests compare metrics.jsonl and the
consolidated safetensors with those of a plain one-process run on the same batches.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atropos_cli.errors import ConfigError

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from atropos_cli.trainer.scale.distributed import assign_groups  # noqa: E402

ATROPOS = [sys.executable, "-m", "atropos_cli"]
TOL = 2e-5  # fp32: the ranks sum their shares of the gradient in another order than one process does


def _run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([*ATROPOS, *args], capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def rollouts(tmp_path_factory) -> Path:
    """Real arithmetic rollouts of the shipped model: 14 groups of 4, with token ids."""
    out = tmp_path_factory.mktemp("rollouts") / "run"
    result = _run("process", "arithmetic", "--out", str(out), "--env.total_steps", "14", "--env.group_size", "4")
    assert result.returncode == 0, result.stderr
    return out


def _train(out: Path, data: Path, *extra: str, steps: int = 2) -> subprocess.CompletedProcess:
    args = ["train", "--data", str(data), "--out", str(out), "--steps", str(steps), "--save-every", "1"]
    # 3 groups a step: an odd count, so two ranks get unequal shares (and one rank a filler micro-batch)
    result = _run(*args, "--groups-per-step", "3", "--lr", "1e-3", "--keep-checkpoints", "0", *extra)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _metrics(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def _weights(out: Path, step: int) -> dict:
    return safetensors_torch.load_file(str(out / "checkpoints" / f"step-{step}" / "model.safetensors"))


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def test_groups_are_split_whole_and_balanced_by_tokens():
    assert assign_groups([10, 40, 30, 20], 2) == [[0, 1], [2, 3]]  # 40+10 vs 30+20
    assert assign_groups([5, 5, 5], 2) == [[0, 2], [1]]  # an odd count: unequal, nothing dropped
    assert assign_groups([7], 3) == [[0], [], []]  # fewer groups than ranks: the others run fillers
    assert sorted(i for r in assign_groups(list(range(9)), 4) for i in r) == list(range(9))


def test_small_models_replicate_on_cuda_and_large_ones_shard():
    from atropos_cli.trainer.scale.replicate import choose

    gb = 2**30
    h100 = 80 * gb
    assert choose("auto", "cuda:0", 2, 494_000_000, 494_000_000, h100) == "replicate"  # 0.5B: 9 GB a rank
    assert choose("auto", "cuda:0", 4, 494_000_000, 494_000_000, h100) == "replicate"  # 4 ranks: 102% vs FSDP 75%
    assert choose("auto", "cuda:0", 8, 494_000_000, 494_000_000, h100) == "fsdp"  # beyond what was measured
    assert choose("auto", "cuda:0", 2, 1_540_000_000, 1_540_000_000, h100) == "fsdp"  # 1.5B: FSDP hides its gathers
    assert choose("auto", "cuda:0", 2, 494_000_000, 494_000_000, 16 * gb) == "fsdp"  # 9 GB is over 40% of 16 GB
    assert choose("auto", "cpu", 2, 1000, 1000, None) == "fsdp"  # CPU runs (and their checkpoints) stay sharded
    assert choose("auto", "cuda:0", 1, 1000, 1000, h100) == "fsdp"  # one rank resuming a sharded checkpoint
    assert choose("replicate", "cpu", 2, 1000, 1000, None) == "replicate"


def test_default_micro_batches_fit_beside_the_training_state():
    from transformers import Qwen2Config

    from atropos_cli.trainer.config import activation_bytes_per_token, default_micro_batch_tokens
    from atropos_cli.trainer.scale.replicate import state_bytes

    h100 = 80 * 2**30

    def default(layers: int, hidden: int, params: int, parallel: str, world: int) -> int:
        per_token = activation_bytes_per_token(Qwen2Config(num_hidden_layers=layers, hidden_size=hidden), False)
        held = state_bytes(params, params, parallel, world)  # type: ignore[arg-type]
        return default_micro_batch_tokens("cuda:0", parallel == "fsdp", h100, held, per_token)

    assert default(24, 896, 494_000_000, "replicate", 1) == 16384  # 0.5B, one GPU: as measured best
    assert default(24, 896, 494_000_000, "fsdp", 4) == 32768  # FSDP pays per micro-batch: fewer, larger ones
    assert default(28, 1536, 1_540_000_000, "replicate", 2) == 16384  # 1.5B: ~28 GB state + ~34 GB activations
    assert default(36, 2048, 3_090_000_000, "fsdp", 2) == 8192  # 3B on 2 x 80 GB: 32k and 16k would not fit
    assert default_micro_batch_tokens("cpu", False, None, 0, 1) == 8192


def test_a_run_that_cannot_fit_its_gpu_fails_before_the_first_step():
    from transformers import Qwen2Config

    from atropos_cli.trainer.config import activation_bytes_per_token, check_fits
    from atropos_cli.trainer.scale.replicate import state_bytes

    gpu = 80 * 2**30
    per_token = activation_bytes_per_token(Qwen2Config(num_hidden_layers=36, hidden_size=2560), False)
    # Qwen3-4B full fine-tuning in one process: 72 GB of state before any activation (measured: CUDA OOM)
    with pytest.raises(ConfigError, match="GiB a GPU") as err:
        check_fits(gpu, state_bytes(4_020_000_000, 4_020_000_000, "replicate", 1), per_token, 4096)
    assert "--nproc-per-node" in (err.value.hint or "") and "--lora-r" in (err.value.hint or "")
    check_fits(gpu, state_bytes(3_210_000_000, 3_210_000_000, "replicate", 1), per_token, 4096)  # 3B: ran, 65 GiB
    check_fits(gpu, state_bytes(4_020_000_000, 20_000_000, "replicate", 1), per_token, 4096)  # LoRA: fits
    check_fits(None, 10**15, per_token, 4096)  # CPU: not checked


def test_an_8b_model_on_four_80gb_cards_shards_its_gradients_by_default():
    from transformers import LlamaConfig

    from atropos_cli.trainer.config import activation_bytes_per_token, auto_grad_sync, check_fits
    from atropos_cli.trainer.scale.replicate import state_bytes

    gpu, n = 80 * 2**30, 8_030_000_000
    per_token = activation_bytes_per_token(LlamaConfig(num_hidden_layers=32, hidden_size=4096), False)
    step = state_bytes(n, n, "fsdp", 4, "step")  # the unsharded fp32 gradient: 32 GB on every rank
    assert auto_grad_sync(gpu, True, step, per_token) == "micro-batch"
    with pytest.raises(ConfigError):
        check_fits(gpu, step, per_token, 4096)  # what the once-a-step layout would need: it cannot fit
    check_fits(gpu, state_bytes(n, n, "fsdp", 4, "micro-batch"), per_token, 4096)
    small = state_bytes(494_000_000, 494_000_000, "fsdp", 4, "step")
    assert auto_grad_sync(gpu, True, small, per_token) == "step"  # 0.5B: the faster layout
    assert auto_grad_sync(None, True, step, per_token) == "step"  # CPU


def test_a_cuda_trainer_takes_few_host_threads_unless_the_user_chose():
    from atropos_cli.trainer.config import AUTO_THREADS, HOST_THREADS, host_threads

    assert host_threads("cuda:0", 64, {}) == HOST_THREADS == 4  # torch's default on a 64-core host: too many
    assert host_threads("cuda:1", 16, {"OMP_NUM_THREADS": "16", AUTO_THREADS: "1"}) == 4  # the launcher's share
    assert host_threads("cuda:0", 64, {"OMP_NUM_THREADS": "64"}) is None  # the user's own choice
    assert host_threads("cuda:0", 2, {}) is None  # already few
    assert host_threads("cpu", 64, {}) is None  # on a CPU the threads do the training


def test_two_ranks_train_like_one_process(rollouts: Path, tmp_path: Path):
    one, two = tmp_path / "one", tmp_path / "two"
    _train(one, rollouts)
    result = _train(two, rollouts, "--nproc-per-node", "2")
    assert result.stdout.count("trained 2 steps") == 1  # one rank reports
    assert len(_metrics(one)) == len(_metrics(two)) == 2  # two steps: one line each
    for a, b in zip(_metrics(one), _metrics(two), strict=True):
        assert a["sequences"] == b["sequences"] and a["trained_tokens"] == b["trained_tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=TOL)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=TOL)
    assert _max_diff(_weights(one, 2), _weights(two, 2)) < TOL
    assert (two / "checkpoints" / "step-2" / "sharded" / ".metadata").is_file()
    state = json.loads((two / "checkpoints" / "step-2" / "trainer_state.json").read_text())
    assert state["world_size"] == 2 and state["batches_seen"] == 2


def test_resume_is_exact_on_the_same_world_size_and_reshards_onto_one_process(rollouts: Path, tmp_path: Path):
    straight, same, fewer = tmp_path / "straight", tmp_path / "same", tmp_path / "fewer"
    _train(straight, rollouts, "--nproc-per-node", "2", steps=2)
    for out in (same, fewer):
        _train(out, rollouts, "--nproc-per-node", "2", steps=1)
    _train(same, rollouts, "--nproc-per-node", "2", "--resume", steps=2)
    _train(fewer, rollouts, "--resume", steps=2)  # a plain run resumes the sharded checkpoint alone
    expected = _weights(straight, 2)
    assert _max_diff(expected, _weights(same, 2)) == 0.0  # bit-exact: same shards, data cursor, RNG
    assert _max_diff(expected, _weights(fewer, 2)) < TOL
    # the data cursor: the resumed runs trained step 2 on the same batch as the straight run
    assert _metrics(same)[-1]["sequences"] == _metrics(straight)[-1]["sequences"]


def test_a_one_process_checkpoint_resumes_sharded(rollouts: Path, tmp_path: Path):
    straight, grown = tmp_path / "straight", tmp_path / "grown"
    _train(straight, rollouts, steps=2)
    _train(grown, rollouts, steps=1)
    _train(grown, rollouts, "--nproc-per-node", "2", "--resume", steps=2)  # weights and AdamW moments by name
    assert _max_diff(_weights(straight, 2), _weights(grown, 2)) < TOL


def test_every_training_option_trains_sharded_like_one_process(rollouts: Path, tmp_path: Path):
    # options that compose share a run (a sharded difference in any of them shows in that run's weights)
    variants = (["--lora-r", "4", "--pack"], ["--kl-beta", "0.1", "--loss", "gspo", "--gradient-checkpointing"])
    for flags in (*variants, ["--grad-sync", "micro-batch"]):
        one, two = tmp_path / f"one{flags[0]}", tmp_path / f"two{flags[0]}"
        _train(one, rollouts, *flags, steps=1)
        _train(two, rollouts, *flags, "--nproc-per-node", "2", steps=1)
        assert _metrics(two)[0]["grad_norm"] == pytest.approx(_metrics(one)[0]["grad_norm"], rel=TOL), flags
        assert _max_diff(_weights(one, 1), _weights(two, 1)) < TOL, flags
    assert (tmp_path / "two--lora-r" / "checkpoints" / "step-1" / "adapter" / "adapter_model.safetensors").is_file()


def test_replicated_ranks_train_like_one_process_and_resume(rollouts: Path, tmp_path: Path):
    """--parallel replicate (the CUDA default for small models): whole model on each rank, gradients summed once a
    step; its checkpoints are one-process ones, resumed on 2 ranks or on one."""
    one, two, same, fewer = (tmp_path / name for name in ("one", "two", "same", "fewer"))
    _train(one, rollouts)
    result = _train(two, rollouts, "--nproc-per-node", "2", "--parallel", "replicate")
    assert result.stdout.count("trained 2 steps") == 1
    assert len(_metrics(one)) == len(_metrics(two)) == 2  # two steps: one line each
    for a, b in zip(_metrics(one), _metrics(two), strict=True):
        assert a["sequences"] == b["sequences"] and a["trained_tokens"] == b["trained_tokens"]
        assert b["loss"] == pytest.approx(a["loss"], abs=TOL)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=TOL)
    assert _max_diff(_weights(one, 2), _weights(two, 2)) < TOL
    assert not (two / "checkpoints" / "step-2" / "sharded").exists()  # rank 0 wrote it whole
    assert (two / "checkpoints" / "step-2" / "optimizer.pt").is_file()
    for out in (same, fewer):
        _train(out, rollouts, "--nproc-per-node", "2", "--parallel", "replicate", steps=1)
    _train(same, rollouts, "--nproc-per-node", "2", "--parallel", "replicate", "--resume", steps=2)
    _train(fewer, rollouts, "--resume", steps=2)
    assert _max_diff(_weights(two, 2), _weights(same, 2)) < TOL
    assert _max_diff(_weights(two, 2), _weights(fewer, 2)) < TOL


def test_replicated_lora_and_kl_train_like_one_process(rollouts: Path, tmp_path: Path):
    for flags in (["--lora-r", "4"], ["--kl-beta", "0.1"]):
        one, two = tmp_path / f"one{flags[0]}", tmp_path / f"two{flags[0]}"
        _train(one, rollouts, *flags, steps=1)
        _train(two, rollouts, *flags, "--nproc-per-node", "2", "--parallel", "replicate", steps=1)
        assert _metrics(two)[0]["grad_norm"] == pytest.approx(_metrics(one)[0]["grad_norm"], rel=TOL), flags
        assert _max_diff(_weights(one, 1), _weights(two, 1)) < TOL, flags


def test_a_sharded_checkpoint_is_not_resumed_replicated(rollouts: Path, tmp_path: Path):
    out = tmp_path / "run"
    _train(out, rollouts, "--nproc-per-node", "2", steps=1)  # auto on a CPU: FSDP
    args = ["train", "--data", str(rollouts), "--out", str(out), "--steps", "2", "--groups-per-step", "3"]
    result = _run(*args, "--lr", "1e-3", "--nproc-per-node", "2", "--parallel", "replicate", "--resume")
    assert result.returncode != 0
    assert "is sharded (an FSDP run wrote it)" in result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr


def test_behind_a_trajectory_api_rank_0_pulls_and_every_rank_trains(rollouts: Path, tmp_path: Path, trajectory_api):
    groups = [json.loads(line) for line in (rollouts / "groups.jsonl").read_text().splitlines()]
    with trajectory_api() as api:
        registration = {"wandb_group": "t", "wandb_project": "t", "batch_size": 8, "max_token_len": 256}
        registration |= {"checkpoint_dir": "c", "save_checkpoint_interval": 0, "starting_step": 0, "num_steps": 2}
        httpx.post(f"{api.url}/register", json=registration).raise_for_status()  # the queue opens on register
        for group in groups[:8]:
            httpx.post(f"{api.url}/scored_data", json=group).raise_for_status()
        out = tmp_path / "run"
        args = ["--api-url", api.url, "--batch-size", "8", "--wait-timeout", "20", "--nproc-per-node", "2"]
        result = _run("train", "--out", str(out), "--steps", "2", "--lr", "1e-3", *args)
        assert result.returncode == 0, result.stdout + result.stderr
        status = httpx.get(f"{api.url}/status").json()
    assert [m["groups"] for m in _metrics(out)] == [2, 2]  # batches of 8 sequences = 2 groups of 4
    assert status["current_step"] == 2  # the API served two batches: one trainer pulled them


@pytest.mark.parametrize("parallel", ["auto", "replicate"])
def test_a_killed_rank_stops_the_run_with_an_error_naming_it(rollouts: Path, tmp_path: Path, parallel: str):
    out = tmp_path / "run"
    args = ["train", "--data", str(rollouts), "--out", str(out), "--steps", "100000", "--epochs", "100000",
            "--parallel", parallel]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    launcher = subprocess.Popen(
        [*ATROPOS, *args, "--groups-per-step", "2", "--save-every", "0", "--nproc-per-node", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() or not (out / "metrics.jsonl").read_text():
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "the run never stepped"
            time.sleep(0.2)
        rank1 = _rank_pid(launcher.pid, rank=1)
        os.kill(rank1, signal.SIGKILL)
        stdout, stderr = launcher.communicate(timeout=60)  # no hang: the launcher stops rank 0 too
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode != 0
    assert f"rank 1 of 2 (pid {rank1}) was killed by SIGKILL" in stderr, stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr  # the survivor says nothing


def _rank_pid(launcher: int, rank: int) -> int:
    """The pid of `rank` among the launcher's children (torchrun sets RANK in each child's environment)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            environ = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == launcher and f"RANK={rank}".encode() in environ:
            return int(entry.name)
    raise AssertionError(f"no child of {launcher} has RANK={rank}")


def test_env_loop_rolls_out_on_every_rank(tmp_path: Path):
    """The one-command loop on 2 ranks: each samples its share of the step's groups on its own local engine."""
    out = tmp_path / "run"
    flags = ["--steps", "2", "--groups-per-step", "3", "--env.group_size", "4", "--nproc-per-node", "2"]
    result = _run("train", "arithmetic", "--out", str(out), *flags)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["groups"] for m in _metrics(out)] == [3, 3]  # rank 0 sampled 2 groups, rank 1 one


def test_external_server_is_reloaded_by_rank_0_only(tmp_path: Path):
    """--inference external on 2 ranks against a real `atropos inference` server: rank 0 runs the env workers,
    every rank writes its shards, and the server is asked once per step to load the consolidated checkpoint."""
    from atropos_cli.config import ServerConfig
    from atropos_cli.inference.local import LocalBackend
    from atropos_cli.inference.server import ServerSettings, create_app
    from atropos_cli.resources import DEFAULT_MODEL
    from atropos_cli.testing.threaded import ThreadedServer
    from test_trainer_loop import PARITY_ENV

    backend = LocalBackend(ServerConfig(server_type="local", model_name=DEFAULT_MODEL))
    env_file = tmp_path / "parity_env.py"
    env_file.write_text(PARITY_ENV)
    out = tmp_path / "run"
    with ThreadedServer(create_app(backend, ServerSettings()), lifespan="on").start() as server:
        dotted = ["--openai.base_url", f"{server.url}/v1", "--openai.server_type", "vllm"]
        dotted += ["--openai.model_name", DEFAULT_MODEL, "--openai.tokenizer_name", DEFAULT_MODEL]
        dotted += ["--env.group_size", "4", "--env.max_token_length", "6"]
        flags = ["--inference", "external", "--steps", "2", "--groups-per-step", "2", "--nproc-per-node", "2"]
        result = _run("train", str(env_file), "--out", str(out), *flags, *dotted)
    assert result.returncode == 0, result.stdout + result.stderr
    assert [m["reloaded_version"] for m in _metrics(out)] == [1, 2]
    assert backend.version == 2


def test_ctrl_c_stops_every_rank_after_one_step_with_one_checkpoint(rollouts: Path, tmp_path: Path):
    out = tmp_path / "run"
    args = ["train", "--data", str(rollouts), "--out", str(out), "--steps", "100000", "--epochs", "100000"]
    launcher = subprocess.Popen(
        [*ATROPOS, *args, "--groups-per-step", "2", "--save-every", "0", "--nproc-per-node", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        start_new_session=True,  # its own process group, as a terminal's: Ctrl-C reaches the launcher and ranks
    )
    try:
        deadline = time.monotonic() + 120
        while not (out / "metrics.jsonl").is_file() or len((out / "metrics.jsonl").read_text().splitlines()) < 2:
            assert launcher.poll() is None, launcher.communicate()
            assert time.monotonic() < deadline, "the run never stepped"
            time.sleep(0.2)
        os.killpg(launcher.pid, signal.SIGINT)
        stdout, stderr = launcher.communicate(timeout=90)
    finally:
        if launcher.poll() is None:
            os.killpg(launcher.pid, signal.SIGKILL)
    assert launcher.returncode == 130, stderr
    steps = len(_metrics(out))
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step-{steps}"]  # whole, no .tmp- left
    assert f"interrupted; the checkpoint {out}/checkpoints/step-{steps} holds the last step" in stderr
    assert "Traceback" not in stderr and "internal error" not in stderr and "death signal" not in stderr


def test_sft_refuses_several_processes(tmp_path: Path):
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    data = tmp_path / "sft.jsonl"
    data.write_text('{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n')
    args = ["train", "--sft", str(data), "--nproc-per-node", "2", "--out", str(tmp_path / "o")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--nproc-per-node is for GRPO runs: --sft trains in one process" in result.output
    assert not (tmp_path / "o").exists()


def test_two_torchrun_launchers_as_two_nodes_train_like_one_launcher(rollouts: Path, tmp_path: Path):
    """The multi-node launch, simulated: `torchrun --nnodes 2 --node-rank R ... -m atropos_cli train` twice on
    this host (one rank each) gives the metrics and weights of one `--nproc-per-node 2` launcher."""
    import socket

    one, two = tmp_path / "one", tmp_path / "two"
    _train(one, rollouts, "--nproc-per-node", "2")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    flags = ["--steps", "2", "--save-every", "1", "--groups-per-step", "3", "--lr", "1e-3", "--keep-checkpoints", "0"]
    nodes = [
        subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(rank)]
            + ["--nproc-per-node", "1", "--master-addr", "127.0.0.1", "--master-port", str(port)]
            + ["-m", "atropos_cli", "train", "--data", str(rollouts), "--out", str(two), *flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        for rank in (0, 1)
    ]
    try:
        results = [node.communicate(timeout=240) for node in nodes]
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
    assert [node.returncode for node in nodes] == [0, 0], results
    assert len(_metrics(one)) == len(_metrics(two)) == 2  # two steps: one line each
    for a, b in zip(_metrics(one), _metrics(two), strict=True):
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=TOL)
    assert _max_diff(_weights(one, 2), _weights(two, 2)) < TOL
