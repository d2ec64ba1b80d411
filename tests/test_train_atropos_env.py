"""`atropos train ENV.py` runs an Atropos env file (its own constructor over server configs, its own item counter,
`tokenize_for_trainer` with the trained model's tokenizer), on data-parallel ranks and on engine ranks, each
item once across ranks (the env's counter advances alike on every rank: `trainer/data/item_stream.py`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from atropos_cli.env.item_digest import item_digest

pytest.importorskip("torch")

ENV = Path(__file__).parent / "data" / "train" / "atropos_say_env.py"  # items ("Say i", i), i = 0, 1, 2, ...


@pytest.mark.parametrize(
    "flags",
    [
        ["--nproc-per-node", "2"],
        pytest.param(["--nproc-per-node", "2", "--inference-gpus", "1"], marks=pytest.mark.slow),  # the same env
    ],  # rollouts as the 2 ranks' on an engine rank
    ids=["2 ranks", "1 trainer + 1 engine"],
)
def test_train_runs_an_atropos_env_file_each_item_once(tmp_path: Path, flags: list[str]):
    out = tmp_path / "run"
    args = ["train", str(ENV), "--out", str(out), "--steps", "2", "--groups-per-step", "3", "--save-rollouts"]
    args += ["--save-every", "0", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, "-m", "atropos_cli", *args], capture_output=True, text=True, env=env,
                            timeout=400)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "trained 2 steps" in result.stdout, result.stdout
    groups = [json.loads(line) for line in (out / "trained_rollouts.jsonl").read_text().splitlines()]
    assert [g["meta"]["index"] for g in groups] == list(range(6))  # steps 1, 2 take items 0-2, 3-5
    assert [g["meta"]["item_digest"] for g in groups] == [item_digest(("Say " + str(i), i)) for i in range(6)]
    assert [g["trained_step"] for g in groups] == [1, 1, 1, 2, 2, 2]
    assert all(g["meta"]["model"] == "atropos-tiny-arith" and g["scores"] == [1.0, -1.0] for g in groups)
