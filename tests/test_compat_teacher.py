"""TeacherDistillationEnv (atroposlib's last main) under `atropos process`: `--env.teacher_enabled`,
`--env.teacher_top_k`, `--teacher.*` flags; the teacher's top-k prompt logprobs in distill_token_ids /
distill_logprobs; a teacher with another tokenizer is a one-line error. Real fake servers on 127.0.0.1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.errors import ConfigError
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


def test_main_s_gsm8k_teacher_distill_pattern_constructs_and_distills(fake_server, tmp_path: Path) -> None:
    """`class X(GSM8kEnv, TeacherDistillationEnv)` with the base env's positional super().__init__ and the
    teacher from teacher_config_init() (its URL overridden by --teacher.base_url), as Atropos main ships it."""
    data = Path(__file__).parent / "data" / "compat_names"
    policy = fake_server(rule=lambda prompt, k: ["The answer is 19", "20", "18", "5"][k % 4])
    teacher = fake_server(rule="echo", tokenizer=TOKENIZER)
    args = ["process", str(data / "gsm8k_like_teacher_distill.py"), "--out", str(tmp_path / "run")]
    args += ["--openai.base_url", policy.base_url, "--teacher.base_url", teacher.base_url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (tmp_path / "run" / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and teacher.requests == 8
    for group in groups:
        for tokens, ids, lps in zip(
            group["tokens"], group["distill_token_ids"], group["distill_logprobs"], strict=True
        ):
            assert len(ids) == len(lps) == len(tokens) and ids[0] == []
            expected = top_k_entry(tokens[3], 2, 269, token_logprob)  # teacher_top_k=2 from config_init
            assert ids[3] == [int(k) for k in expected] and lps[3] == list(expected.values())


def test_teacher_server_configs_keyword_and_top_k_switches(fake_server) -> None:
    """main's constructor: teacher_server_configs= (one config or a list); top_k -1 and skip_teacher_top_k
    leave no distill data; a teacher that fails leaves none for that group."""
    import asyncio

    from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import APIServerConfig
    from atropos_cli.compat.atroposlib.envs.teacher_distillation_env import (
        TeacherDistillationConfig,
        TeacherDistillationEnv,
    )

    class Env(TeacherDistillationEnv):
        pass

    teacher = fake_server(rule="echo", tokenizer=TOKENIZER)
    config = TeacherDistillationConfig(tokenizer_name=TOKENIZER, teacher_enabled=True, use_wandb=False)
    policy = APIServerConfig(base_url=teacher.base_url, model_name="p", api_key="x")
    teacher_config = APIServerConfig(
        base_url=teacher.base_url, model_name="t", server_type="vllm", tokenizer_name=TOKENIZER
    )
    env = Env(config, [policy], teacher_server_configs=teacher_config)

    async def attach(overrides: dict) -> dict:
        group = {"tokens": [[3, 40, 41, 42]], "group_overrides": overrides}
        await env.attach_teacher(group)
        return group

    assert len(asyncio.run(attach({}))["distill_token_ids"][0][1]) == 1  # top_k 0: the selected token only
    assert asyncio.run(attach({"teacher_top_k": -1}))["distill_token_ids"] is None
    assert asyncio.run(attach({"skip_teacher_top_k": True}))["distill_logprobs"] is None
    teacher.stop()
    assert asyncio.run(attach({}))["distill_token_ids"] is None
    missing = TeacherDistillationConfig(tokenizer_name=TOKENIZER, teacher_enabled=True, use_wandb=False)
    with pytest.raises(ConfigError, match="no teacher server is configured"):
        Env(missing, [policy])
