"""`atropos train --distill-beta B` end to end on the tiny model: groups carrying a teacher's top-k
(distill_token_ids / distill_logprobs) add the reverse-KL term, and the step reports it as distill_kl."""

from __future__ import annotations

import json
from pathlib import Path

from atropos_cli.trainer.run import RunOptions, run_training
from test_trainer_loop import _config, _groups, tiny_model  # noqa: F401 (tiny_model is a fixture)


def _with_teacher(groups: list, k: int = 2) -> list:
    """A teacher that puts each real next token first in its top-k with logprob -0.5 (and t+1 at -3.0)."""
    for group in groups:
        group.distill_token_ids = [[[], *[[t, t + 1] for t in seq[1:]]] for seq in group.tokens]
        group.distill_logprobs = [[[], *[[-0.5, -3.0] for _ in seq[1:]]] for seq in group.tokens]
    return groups


def test_distill_beta_adds_the_teacher_term(tiny_model: Path, tmp_path: Path) -> None:  # noqa: F811
    data = tmp_path / "rollouts.jsonl"
    data.write_text("".join(json.dumps(g.to_record()) + "\n" for g in _with_teacher(_groups(4))))
    opts = RunOptions(data=[str(data)], groups_per_step=2)
    plain = run_training(opts, _config(tiny_model, tmp_path / "plain", steps=1), lambda row: None)
    rows = []
    distilled = run_training(opts, _config(tiny_model, tmp_path / "kd", steps=1, distill_beta=0.5), rows.append)
    assert plain.steps == distilled.steps == 1
    plain_row = json.loads((tmp_path / "plain" / "metrics.jsonl").read_text().splitlines()[0])
    assert "distill_kl" not in plain_row
    # the untrained student gives each sampled token about log(1/290) = -5.7, the teacher -0.5: k = s - t < -2
    assert rows[0]["distill_kl"] < -2
    assert rows[0]["loss"] != plain_row["loss"]
