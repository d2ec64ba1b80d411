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

TOKENIZER = resolve_model_path("atropos-tiny-arith")
ENV = """
from atroposlib.envs.base import APIServerConfig, ScoredDataGroup
from atroposlib.envs.teacher_distillation_env import TeacherDistillationConfig, TeacherDistillationEnv
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class DistilledMath(TeacherDistillationEnv):
    name = "distilled_math"

    @classmethod
    def config_init(cls):
        config = TeacherDistillationConfig(group_size=2, total_steps=2, use_wandb=False, tokenizer_name="{tok}")
        return config, [APIServerConfig(base_url="{url}", model_name="fake-model", api_key="x")]

    async def setup(self):
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return self.i

    async def collect_trajectories(self, item):
        chat = [{{"role": "user", "content": f"What is {{item}} + 2?"}}]
        out = await self.server.chat_completion(messages=chat, n=2)
        group = ScoredDataGroup()
        group["tokens"], group["masks"], group["scores"] = [], [], []
        for choice in out.choices:
            answer = {{"role": "assistant", "content": choice.message.content}}
            t = tokenize_for_trainer(self.tokenizer, chat + [answer])
            group["tokens"].append(t["tokens"])
            group["masks"].append(t["masks"])
            group["scores"].append(float(choice.message.content == str(item + 2)))
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None
"""


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
