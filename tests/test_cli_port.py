"""`atropos port FILE`: the scan names each missing atroposlib name with its line without running the file;
with --run a supported env then runs one group on the shipped local model."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from atropos_cli.cli.app import app

ENVS = Path(__file__).parent / "data" / "atropos_envs"


def test_port_lists_missing_names_with_their_lines(tmp_path: Path) -> None:
    env = tmp_path / "old_env.py"
    env.write_text(
        "from atroposlib.envs.base import BaseEnv, NotAThing\n"
        "from atroposlib.utils.force_diverse_samples import force_diverse_samples\n"
        "ds = load_dataset('gsm8k')\n"
    )
    result = CliRunner().invoke(app, ["port", str(env)])
    assert result.exit_code == 1
    assert f"{env}:1: missing: atroposlib.envs.base has no 'NotAThing'" in result.output
    assert f"{env}:2: missing: module atroposlib.utils.force_diverse_samples is not provided" in result.output
    assert f"{env}:3: note: datasets from the Hugging Face hub" in result.output


def test_port_runs_one_group_of_a_supported_env_on_the_local_model() -> None:
    result = CliRunner().invoke(app, ["port", str(ENVS / "math_n_choices.py"), "--run"])
    assert result.exit_code == 0, result.output
    assert "every atroposlib name it imports is provided" in result.output
    assert "one group ran on the shipped local model" in result.output


def test_port_reads_the_file_without_running_it_unless_asked(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    env = tmp_path / "hostile_env.py"
    env.write_text(f"from atroposlib.envs.base import BaseEnv\nopen({str(marker)!r}, 'w').write('ran')\n")
    result = CliRunner().invoke(app, ["port", str(env)])
    assert result.exit_code == 0, result.output
    assert "the file was read, not run: --run imports it" in result.output
    assert not marker.exists()
    CliRunner().invoke(app, ["port", str(env), "--run"])
    assert marker.read_text() == "ran"  # --run imports it (no env class here, so the run itself fails)


LONG_PROMPT_ENV = """
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer

SYSTEM = "You are a careful assistant. " * 120 + "Put your final answer in \\\\boxed{}."


class LongEnv(BaseEnv):
    name = "long_prompt"

    @classmethod
    def config_init(cls):
        return BaseEnvConfig(group_size=2, tokenizer_name="atropos-tiny-arith"), APIServerConfig()

    async def setup(self):
        pass

    async def get_next_item(self):
        return "What is 1 + 1?"

    async def collect_trajectories(self, item):
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": item}]
        completion = await self.server.chat_completion(messages=messages, n=2, max_tokens=32)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for choice in completion.choices:
            turns = [*messages, {"role": "assistant", "content": choice.message.content}]
            out = tokenize_for_trainer(self.tokenizer, turns)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append(1.0 if "\\\\boxed{" in choice.message.content else 0.0)
        {ending}
"""


def test_port_falls_back_to_the_format_aware_fake_when_the_model_cannot_serve(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    env = tmp_path / "long_env.py"
    env.write_text(LONG_PROMPT_ENV.replace("{ending}", "return group, []"))
    result = CliRunner().invoke(app, ["port", str(env), "--run"])
    output = " ".join(result.output.split())
    assert result.exit_code == 0, output
    assert "on the shipped local model (atropos-tiny-arith): no group: every server call failed (1 errors)" in output
    assert "has a context of 256 tokens" in output  # the first error itself, not only a path
    assert "one group ran on the format-aware fake server" in output
    group = json.loads((tmp_path / "runs" / "port-long_env-2" / "groups.jsonl").read_text().splitlines()[0])
    assert group["scores"] and "\\boxed{" in group["messages"][0][-1]["content"]
    assert (tmp_path / "runs" / "port-long_env" / "failures.jsonl").is_file()  # the failed attempt's record stays


def test_port_uses_the_server_the_user_names_and_keeps_its_failures(tmp_path: Path, monkeypatch, fake_server) -> None:
    monkeypatch.chdir(tmp_path)
    env = tmp_path / "long_env.py"
    env.write_text(LONG_PROMPT_ENV.replace("{ending}", "raise ValueError('scoring broke')"))
    server = fake_server()
    result = CliRunner().invoke(app, ["port", str(env), "--run", "--base-url", server.base_url])
    output = " ".join(result.output.split())
    assert result.exit_code == 1
    assert f"on the server at {server.base_url}: no group; first error: ValueError: scoring broke" in output
    failures = tmp_path / "runs" / "port-long_env" / "failures.jsonl"
    assert failures.is_file() and f"all failures: {failures.relative_to(tmp_path)}" in output
