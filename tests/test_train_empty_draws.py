"""`atropos train` on an env whose every group is filtered: each draw's dropped groups are counted in the step
line, and the run stops with one error line after --max-empty-draws draws in a row with nothing to train on
(before: it drew forever, since only trained steps count towards --steps)."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from atropos_cli.errors import EmptyDrawsError
from atropos_cli.types import ScoredGroup

pytest.importorskip("torch")

from atropos_cli.trainer.data.draws import Draw, EmptyDraws, draw_metrics  # noqa: E402

ENV = Path(__file__).parent / "data" / "train" / "atropos_filtered_env.py"  # None, then identical scores, ...


@pytest.mark.parametrize(
    "flags",
    [
        [],
        # the engines pace on the batches the trainer took: an empty one pushes no weights but is credited to them
        pytest.param(["--nproc-per-node", "2", "--inference-gpus", "1"], marks=pytest.mark.slow),
    ],
    ids=["one process", "1 trainer + 1 engine"],
)
def test_train_stops_after_the_empty_draws_and_says_what_was_filtered(tmp_path: Path, flags: list[str]):
    out = tmp_path / "run"
    args = ["train", str(ENV), "--out", str(out), "--steps", "3", "--groups-per-step", "2", "--max-empty-draws", "3"]
    result = subprocess.run([sys.executable, "-m", "atropos_cli", *args, "--save-every", "0", *flags],
                            capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
                            timeout=300)  # fmt: skip
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("step")]
    assert len(lines) == 3, result.stdout  # exactly the bound's draws, then the stop
    assert all("2 groups filtered: nothing to train on" in line for line in lines), lines
    assert "(3 draws in a row)" in lines[-1]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert errors[0] == (
        "error: 3 draws in a row gave nothing to train on (6 groups filtered by the env: collect_trajectories "
        "returned None 3, identical scores 3); no step was taken"
    ), result.stderr
    assert len(errors) == (2 if flags else 1), result.stderr  # torchrun's launcher adds its line about rank 0
    assert "hint:" in result.stderr and "--max-empty-draws" in result.stderr
    assert "Traceback" not in result.stderr


def _group(scores: list[float]) -> ScoredGroup:
    return ScoredGroup(tokens=[[1, 2]] * len(scores), masks=[[-100, 2]] * len(scores), scores=scores)


def test_draws_join_their_counts_and_the_streak_resets_on_a_trained_step():
    a, b = Draw([_group([1.0, 0.0])], {"identical scores": 2}, failed=1), Draw([], {"identical scores": 1})
    b.drop("collect_trajectories returned None")
    joined = pickle.loads(pickle.dumps(Draw.joined([a, b])))  # as the ranks' draws travel over gloo
    assert len(joined) == 1 and joined.filtered == {"identical scores": 3, "collect_trajectories returned None": 1}
    assert draw_metrics(joined) == {"groups_filtered": 4, "groups_failed": 1}
    assert draw_metrics([_group([1.0, 0.0])]) == {"groups_filtered": 0, "groups_failed": 0}  # files, the API
    assert joined.kept([]).filtered == joined.filtered  # the staleness guard keeps the draw's counts

    empty = EmptyDraws(2)
    for skipped in (True, False, True):  # a trained step in between: the streak starts over
        metrics = {"skipped": skipped}
        empty.see(b, metrics)
        empty.check()
    assert metrics["empty_draws"] == 1
    empty.see(Draw([_group([0.5, 0.5])]), {"skipped": True})
    with pytest.raises(EmptyDrawsError, match="2 draws in a row") as caught:
        empty.check()
    assert caught.value.message.startswith(
        "2 draws in a row gave nothing to train on (2 groups filtered by the env: identical scores 1, "
        "collect_trajectories returned None 1; 1 groups whose rewards were all equal)"
    )
    unbounded = EmptyDraws(None)  # files, the API: they end by themselves
    for _ in range(3):
        unbounded.see(b, {"skipped": True})
        unbounded.check()
    assert unbounded.streak == 3
