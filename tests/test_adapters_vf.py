"""`vf:NAME`: verifiers 0.4.0 tasksets (examples/verifiers/: vf_arithmetic and vf_reverse_text, written in
verifiers' own style as `vf-init` scaffolds them) loaded by `vf.load_environment` and run by `atropos
process|evaluate|train` with the shipped model on CPU, in the vf adapter's own venv (ATROPOS_VF_PYTHON:
verifiers==0.4.0 + atropos, built by .ci/run). The commands run as parallel subprocesses in one module fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from adapter_cases import assert_refused_before_the_model_loads, commands_fixture, groups, read_jsonl

SHORT = ["--env.max_token_length", "8"]


def commands(tmp: Path) -> dict[str, list[str]]:
    return {
        "arith": ["process", "vf:vf_arithmetic", "--out", str(tmp / "arith"), "--num-groups", "3", "--group-size", "4",
                  *SHORT],
        "reverse": ["process", "vf:vf_reverse_text", "--out", str(tmp / "reverse"), "--num-groups", "2",
                    "--group-size", "3", "--env.taskset_args", '{"num_tasks": 5}', *SHORT],
        "evaluate": ["evaluate", "vf:vf_arithmetic", "--out", str(tmp / "eval"), "--env.eval_tasks", "5",
                     "--num-samples", "2", *SHORT],
        "train": ["train", "vf:vf_arithmetic", "--steps", "2", "--groups-per-step", "2", "--out", str(tmp / "train"),
                  "--env.group_size", "4", *SHORT],
        "interception": ["process", "vf:vf_arithmetic", "--out", str(tmp / "interception"), "--env.env_args",
                         '{"interception": {"type": "elastic"}}'],
        "missing": ["process", "vf:no_such_taskset", "--out", str(tmp / "missing")],
        "args": ["process", "vf:vf_arithmetic", "--out", str(tmp / "args"), "--env.taskset_args", '{"num_taskz": 3}'],
    }  # fmt: skip


ran = commands_fixture("vf", commands)


def test_process_scores_with_the_tasks_own_rewards_and_metrics(ran):
    tmp, done = ran
    assert done["arith"].returncode == 0, done["arith"].stderr
    arith = groups(tmp / "arith")
    assert len(arith) == 3 and all(len(g["tokens"]) == 4 for g in arith)
    assert any(s == 1.0 for g in arith for s in g["scores"]), "the shipped arithmetic model answers some right"
    for group in arith:
        for score, rollout in zip(group["scores"], group["meta"]["rollouts"], strict=True):
            assert set(rollout["reward_parts"]) == {"score", "correct", "bare_number"}
            assert score == rollout["reward_parts"]["correct"]
    assert done["reverse"].returncode == 0, done["reverse"].stderr
    reverse = groups(tmp / "reverse")
    assert len(reverse) == 2 and all(len(g["scores"]) == 3 for g in reverse)  # --num-groups 2 --group-size 3
    for group in reverse:
        assert group["messages"][0][0]["content"].startswith("Reverse the word: ")
        for score, rollout in zip(group["scores"], group["meta"]["rollouts"], strict=True):
            parts = rollout["reward_parts"]
            assert score == pytest.approx(parts["exact"] + 0.5 * parts["overlap"])  # verifiers' weighted sum
            assert "length_ratio" in parts


def test_evaluate_and_train_run_on_a_verifiers_env(ran):
    tmp, done = ran
    assert done["evaluate"].returncode == 0, done["evaluate"].stderr
    samples = read_jsonl(tmp / "eval" / "samples.jsonl")
    assert len(samples) == 10 and all(s["reward_parts"]["bare_number"] in (0.0, 1.0) for s in samples)
    assert done["train"].returncode == 0, done["train"].stderr
    steps = read_jsonl(tmp / "train" / "metrics.jsonl")
    assert len([s for s in steps if "loss" in s]) == 2


@pytest.mark.parametrize(
    ("name", "message", "hint"),
    [
        ("interception", "interception type 'elastic' is not supported", "leave env_args' interception out"),
        ("missing", "taskset 'no_such_taskset' not found", "install the taskset's package"),
        ("args", "taskset.num_taskz Extra inputs are not permitted", "--env.taskset_args"),
    ],
)
def test_what_the_adapter_cannot_run_is_a_one_line_error_before_the_model_loads(ran, name, message, hint):
    tmp, done = ran
    assert_refused_before_the_model_loads(done[name], tmp / name, message, hint)


def test_sft_gen_reads_a_verifiers_run(ran):
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    tmp, done = ran
    assert done["arith"].returncode == 0, done["arith"].stderr
    result = CliRunner().invoke(app, ["sft-gen", str(tmp / "arith"), "--out", str(tmp / "sft")])
    assert result.exit_code == 0, result.output
    rows = read_jsonl(tmp / "sft" / "train.jsonl")
    assert rows and all(row["messages"][0]["content"].startswith("What is ") for row in rows)
