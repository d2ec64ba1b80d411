"""Atropos' semantics for ported env files (issue 20, Musts 2 and 3): a `None` group is the env filtering (counted
by reason, exit 0), only errors fail a run, `python env.py process` prints `atropos process`' summary; the dummy
managed server's placeholders; `stop` token ids accepted like vLLM; a missing `wandb` is a no-op stand-in and a
missing package's error names what to install. Real env files, real local servers, our real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.resources import resolve_model_path

TOKENIZER = resolve_model_path("atropos-tiny-arith")
# the sed of docs/envs-atropos.md: atroposlib -> our layer; `import wandb` -> wandb or its stand-in
SED = [
    "-e", r"s/\batroposlib\b/atropos_cli.compat.atroposlib/g",
    "-e", r"s/^import wandb$/from atropos_cli.compat.atroposlib.envs._wandb import wandb/",
]  # fmt: skip

ENV = """
import wandb
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class Env(BaseEnv):
    name = "semantics"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=2, total_steps=3, tokenizer_name="{tok}", use_wandb=False,
                               ensure_scores_are_not_same=True)
        return config, APIServerConfig(base_url="{url}", model_name="fake-model", api_key="x")

    async def setup(self):
        self.items = iter(range(100))

    async def get_next_item(self):
        return next(self.items)

    async def collect_trajectories(self, item):
        {body}


if __name__ == "__main__":
    Env.cli()
"""
SCORED = """question = [{{"role": "user", "content": "What is 2 + 2?"}}]
        completion = await self.server.chat_completion(messages=question, n=2)
        group = ScoredDataGroup(tokens=[], masks=[], scores=[])
        for choice in completion.choices:
            msgs = [{{"role": "user", "content": "q"}}, {{"role": "assistant", "content": choice.message.content}}]
            out = tokenize_for_trainer(self.tokenizer, msgs)
            group["tokens"].append(out["tokens"])
            group["masks"].append(out["masks"])
            group["scores"].append({score})
        return group, []"""


def write_env(tmp_path: Path, url: str, body: str) -> Path:
    path = tmp_path / "env.py"
    path.write_text(ENV.format(tok=TOKENIZER, url=url, body=body))
    return path


def run_atropos(path: Path, out: Path, *flags: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["process", str(path), "--out", str(out), "--concurrency", "1", *flags])
    return result.exit_code, flat(result.output)


def flat(text: str) -> str:
    """The terminal wraps long lines: compare with whitespace runs as single spaces."""
    return " ".join(text.split())


def run_script(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    subprocess.run(["sed", "-i", *SED, str(path)], check=True)
    env = {**os.environ, "ATROPOS_VERBOSE": ""}
    return subprocess.run(
        [sys.executable, str(path), "process"], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


def test_a_none_group_is_filtered_not_failed(fake_server, tmp_path: Path) -> None:
    server = fake_server()
    path = write_env(tmp_path, server.base_url, "return None, []")
    code, output = run_atropos(path, tmp_path / "run")
    assert code == 0, output
    assert (
        "wrote 0 groups (0 rollouts; 0 rollouts failed, 3 groups filtered: collect_trajectories returned None 3)"
        in output
    )
    assert "the env filtered every group it finished" in output
    done = run_script(path, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "3 groups filtered: collect_trajectories returned None 3" in done.stdout
    assert "the env filtered every group" in done.stderr and "Traceback" not in done.stderr


def test_identical_scores_are_filtered_by_reason(fake_server, tmp_path: Path) -> None:
    server = fake_server()
    path = write_env(tmp_path, server.base_url, SCORED.format(score="1.0"))
    code, output = run_atropos(path, tmp_path / "run", "--env.ensure_scores_are_not_same", "true")
    assert code == 0, output
    assert "3 groups filtered: identical scores 3" in output
    failures = [json.loads(x) for x in (tmp_path / "run" / "failures.jsonl").read_text().splitlines()]
    assert {f["error_type"] for f in failures} == {"Filtered"}


def test_every_group_erroring_fails_both_entries(fake_server, tmp_path: Path) -> None:
    server = fake_server()
    path = write_env(tmp_path, server.base_url, "raise ValueError('boom')")
    code, output = run_atropos(path, tmp_path / "run")
    assert code == 1 and "every group failed" in output
    done = run_script(path, tmp_path)
    assert done.returncode != 0
    assert "3 groups failed" in done.stdout and "error: every group failed" in done.stderr
    assert "Traceback" not in done.stderr


def test_python_env_process_prints_the_summary_of_kept_groups(fake_server, tmp_path: Path) -> None:
    server = fake_server()
    path = write_env(tmp_path, server.base_url, SCORED.format(score="float(len(group['scores']))"))
    done = run_script(path, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("wrote 3 groups (6 rollouts"), done.stdout


def test_wandb_missing_is_a_stand_in_with_one_notice(fake_server, tmp_path: Path) -> None:
    import importlib.machinery

    if importlib.machinery.PathFinder.find_spec("wandb") is not None:  # the installed package, not our alias
        pytest.skip("wandb is installed here: the env gets the real one")
    server = fake_server()
    body = "wandb.log({'x': 1}); wandb.Histogram([1, 2]); return None, []"
    path = write_env(tmp_path, server.base_url, body)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "atropos"), "process", str(path), "--out", str(tmp_path / "r")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("wandb is not installed") == 1, done.stderr


def test_a_missing_package_names_what_to_install(tmp_path: Path) -> None:
    path = tmp_path / "env.py"
    path.write_text("import os\nfrom atroposlib.envs.base import BaseEnv\nimport surely_missing_pkg_xyz\n")
    result = CliRunner().invoke(app, ["process", str(path), "--out", str(tmp_path / "r")])
    assert result.exit_code != 0
    output = flat(result.output)
    assert f"{path}:3: no module named 'surely_missing_pkg_xyz'" in output
    assert "pip install surely-missing-pkg-xyz" in output and "env surface" not in output
    path.write_text("from dotenv import nothing_here_xyz\n")
    result = CliRunner().invoke(app, ["process", str(path), "--out", str(tmp_path / "r2")])
    assert "dotenv has no 'nothing_here_xyz'" in flat(result.output) and "env surface" not in result.output


def test_dummy_managed_server_returns_atroposlibs_placeholders(fake_server, monkeypatch, tmp_path: Path) -> None:
    import asyncio

    from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager

    server = fake_server()
    monkeypatch.setenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "1")
    config = APIServerConfig(base_url=server.base_url, model_name="fake-model", api_key="x", server_type="openai")

    async def go() -> tuple[object, list]:
        manager = ServerManager([config])
        async with manager.managed_server(tokenizer=None) as managed:
            messages = [{"role": "user", "content": "What is 2 + 2?"}]
            response = await managed.chat_completion(messages=messages, n=2)
            return response, managed.get_state()["nodes"]

    response, nodes = asyncio.run(go())
    assert len(nodes) == 2
    for node, choice in zip(nodes, response.choices, strict=True):
        assert node.tokens == list(range(128))
        assert node.masked_tokens == [-100, *range(1, 128)]
        assert node.logprobs == [-0.5] * 128
        assert node.full_text == f"user:What is 2 + 2?\n\nassistant:{choice.message.content}"
        assert node.metadata == {"finish_reason": "stop", "dummy_tokens": True}


def test_stop_token_ids_are_accepted_like_vllm(fake_server, tmp_path: Path) -> None:
    server = fake_server(rule=lambda prompt, i: "4 then more", tokenizer=str(TOKENIZER))
    chat = {"model": "fake-model", "messages": [{"role": "user", "content": "hi"}], "stop": [ord(" "), "x"]}
    answer = httpx.post(f"{server.base_url}/chat/completions", json=chat, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.json()["choices"][0]["message"]["content"] == "4"
    from atropos_cli.inference.tokenizer import load_tokenizer

    tok = load_tokenizer(str(TOKENIZER))
    stop_id = tok.encode(" then", add_special_tokens=False)[0]
    body = {"prompt": {"prompt_token_ids": tok.encode("hi")}, "stop": [stop_id], "max_tokens": 20, "logprobs": 0}
    generated = httpx.post(server.base_url.removesuffix("/v1") + "/generate", json=body, timeout=30)
    assert generated.status_code == 200, generated.text
    ids = generated.json()["token_ids"][0]
    assert stop_id not in ids and tok.decode(ids).strip() == "4"
