"""Atropos main's teacher distillation file (`environments/gsm8k_server_teacher_distill.py`, issue 20 Must 1) run
unchanged by `atropos process`: `class GSM8kTeacherDistillEnv(GSM8kEnv, TeacherDistillationEnv)`, its student
answered right and wrong by the corpus fake server, its teacher (from `teacher_config_init`, URL overridden by
`--teacher.base_url`) a fake server that answers prompt logprobs.

Main is not on PyPI (the last atroposlib release, 0.4.0, predates TeacherDistillationEnv) and CI reaches only
the package registries, so this test needs a checkout of Atropos' main named by ATROPOS_MAIN_DIR and skips
without one. atroposlib 0.4.0 cannot run the file (it lacks the module), so ours is checked against main's
documented contract instead: per trained sequence, `distill_token_ids` / `distill_logprobs` hold for every
position after the first the teacher's top-k (k = its `teacher_top_k`, 4) and nothing for the first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import test_atropos_corpus_runs as corpus
from atropos_cli.testing.fake_generate import top_k_entry
from atropos_cli.testing.fake_server import FakeInferenceServer, token_logprob
from test_atropos_corpus_runs import ITEMS, SEED, VLLM, CorpusRule, stop_servers

root, standins, tokenizer = corpus.root, corpus.standins, corpus.tokenizer  # the corpus fixtures, used here too

MAIN = os.environ.get("ATROPOS_MAIN_DIR", "")
FILE = "environments/gsm8k_server_teacher_distill.py"
pytestmark = pytest.mark.skipif(
    not (MAIN and (Path(MAIN) / FILE).is_file()),
    reason="set ATROPOS_MAIN_DIR to a checkout of Atropos' main (not on PyPI; CI reaches only package registries)",
)


def test_main_teacher_distill_file_runs_and_distills(
    tokenizer: Path,
    standins: None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import random

    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    monkeypatch.syspath_prepend(MAIN)  # `from environments.gsm8k_server import ...`, as main's editable install gives
    student = FakeInferenceServer(CorpusRule(), tokenizer=str(tokenizer)).start()
    teacher = FakeInferenceServer("echo", tokenizer=str(tokenizer)).start()
    out = tmp_path / "run"
    args = ["process", str(Path(MAIN) / FILE), "--out", str(out), "--concurrency", "1"]
    args += ["--env.use_wandb", "false", "--env.tokenizer_name", str(tokenizer), "--env.total_steps", str(ITEMS)]
    args += ["--env.group_size", "4", "--env.max_token_length", "1024", *VLLM]
    args += ["--openai.base_url", student.base_url, "--openai.api_key", "x", "--openai.model_name", "fake-model"]
    args += ["--openai.tokenizer_name", str(tokenizer), "--teacher.base_url", teacher.base_url]
    args += ["--teacher.tokenizer_name", str(tokenizer)]
    try:
        random.seed(SEED)
        result = CliRunner().invoke(app, args)
    finally:
        stop_servers([student, teacher])
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == ITEMS and teacher.requests == ITEMS * 4  # one teacher call per sequence
    assert len({s for g in groups for s in g["scores"]}) > 1  # the student was right and wrong
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(str(tokenizer)))
    for group in groups:
        for tokens, ids, lps in zip(
            group["tokens"], group["distill_token_ids"], group["distill_logprobs"], strict=True
        ):
            assert len(ids) == len(lps) == len(tokens) and ids[0] == [] and lps[0] == []
            expected = top_k_entry(tokens[7], 4, vocab, token_logprob)  # teacher_top_k=4 from config_init
            assert ids[7] == [int(k) for k in expected] and lps[7] == list(expected.values())
