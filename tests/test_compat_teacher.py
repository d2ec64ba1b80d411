"""TeacherDistillationEnv (atroposlib's last main) under `atropos process`: `--env.teacher_enabled`,
`--env.teacher_top_k`, `--teacher.*` flags; the teacher's top-k prompt logprobs in distill_token_ids /
distill_logprobs; a teacher with another tokenizer is a one-line error. Real fake servers on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.resources import resolve_model_path
from atropos_cli.testing.fake_generate import top_k_entry
from atropos_cli.testing.fake_server import token_logprob
from test_compat_atroposlib import ONE_SERVER_ENV

TOKENIZER = resolve_model_path("atropos-tiny-arith")
# the one-server env of test_compat_atroposlib, as a TeacherDistillationEnv
ENV = ONE_SERVER_ENV.replace(
    "from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup",
    "from atroposlib.envs.base import APIServerConfig, ScoredDataGroup\n"
    "from atroposlib.envs.teacher_distillation_env import TeacherDistillationConfig as BaseEnvConfig\n"
    "from atroposlib.envs.teacher_distillation_env import TeacherDistillationEnv as BaseEnv",
)


def _run(tmp_path: Path, url: str, *flags: str):
    path = tmp_path / "distilled.py"
    path.write_text(ENV.format(tok=TOKENIZER, url=url))
    return CliRunner().invoke(app, ["process", str(path), "--out", str(tmp_path / "run"), *flags])


def test_teacher_top_k_lands_in_distill_fields(fake_server, tmp_path: Path) -> None:
    policy = fake_server(rule="arithmetic", accuracy=0.5)
    teacher = fake_server(rule="echo", tokenizer=TOKENIZER)
    flags = ["--env.teacher_enabled", "true", "--env.teacher_top_k", "3", "--teacher.base_url", teacher.base_url]
    flags += ["--teacher.server_type", "vllm", "--teacher.model_name", "teacher", "--teacher.tokenizer_name", TOKENIZER]
    result = _run(tmp_path, policy.base_url, *flags)
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (tmp_path / "run" / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and teacher.requests == 4  # one teacher call per sequence
    for group in groups:
        for tokens, ids, lps in zip(
            group["tokens"], group["distill_token_ids"], group["distill_logprobs"], strict=True
        ):
            assert len(ids) == len(tokens) and ids[0] == [] and lps[0] == []
            expected = top_k_entry(tokens[5], 3, 269, token_logprob)
            assert ids[5] == [int(k) for k in expected] and lps[5] == list(expected.values())
    assert "teacher" in (tmp_path / "run" / "config.yaml").read_text()


def test_a_teacher_with_another_tokenizer_is_refused(fake_server, tmp_path: Path) -> None:
    from atropos_cli.trainer.tiny_model import train_tokenizer

    other = tmp_path / "other-tok"
    train_tokenizer(["a b c d e f g"], vocab_size=40).save_pretrained(other)
    policy = fake_server(rule="arithmetic")
    result = _run(tmp_path, policy.base_url, "--env.teacher_enabled", "true", "--teacher.base_url", policy.base_url,
                  "--teacher.tokenizer_name", str(other))  # fmt: skip
    assert result.exit_code == 2
    assert f"the teacher's tokenizer '{other}' differs from the env's" in result.output
    assert "Traceback" not in result.output


def test_teacher_flags_on_an_env_without_a_teacher_are_an_error(fake_server, tmp_path: Path) -> None:
    env = Path(__file__).parent / "data" / "atropos_envs" / "math_n_choices.py"
    result = CliRunner().invoke(
        app, ["process", str(env), "--out", str(tmp_path / "r"), "--teacher.base_url", "http://127.0.0.1:9/v1"]
    )
    assert result.exit_code == 2 and "ArithmeticEnv takes no teacher server" in result.output
