"""atroposlib's server plumbing beyond plain requests: `--slurm` (Slurm discovery of inference servers),
`--testing` (the ServerHarness), and `ManagedServerAdapter` (a ManagedServer behind the AsyncOpenAI surface)
run by `atropos process` on an env that hands it to OpenAI-client code."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.compat.atroposlib.envs.server_handling import _slurm
from atropos_cli.compat.atroposlib.envs.server_handling.server_harness import create_chat_completion
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import (
    APIServerConfig,
    ServerBaseline,
    ServerManager,
)
from atropos_cli.errors import ConfigError
from atropos_cli.resources import resolve_model_path
from test_compat_atroposlib import ONE_SERVER_ENV, SED

TOKENIZER = resolve_model_path("atropos-tiny-arith")
DATA = Path(__file__).parent / "data" / "compat_names"
POLICY = APIServerConfig(base_url="http://127.0.0.1:9/v1", model_name="policy", api_key="x", timeout=7)


@pytest.fixture
def slurm_job(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(_slurm.shutil, "which", lambda name: None)  # expand the node list ourselves
    for name in ("SLURM_JOB_NODELIST", "NUM_TRAINING_NODES", "INFER_TP"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_node_lists_expand_like_scontrol(slurm_job) -> None:
    assert _slurm.expand_nodelist("gpu[01-03,07],cpu1") == ["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]
    assert _slurm.expand_nodelist("a[1-2]-b[3-4]") == ["a1-b3", "a1-b4", "a2-b3", "a2-b4"]


def test_slurm_spreads_the_first_server_over_the_inference_nodes(slurm_job) -> None:
    slurm_job.setenv("SLURM_JOB_NODELIST", "node[1-3]")
    slurm_job.setenv("NUM_TRAINING_NODES", "1")
    slurm_job.setenv("INFER_TP", "2")
    manager = ServerManager([POLICY], slurm=True)
    urls = [s.config.base_url for s in manager.servers]
    assert urls == [f"http://node{n}:{9000 + i}/v1" for n in (2, 3) for i in range(4)]
    assert {(s.config.model_name, s.config.timeout) for s in manager.servers} == {("policy", 7)}
    # a ServerBaseline finds the same servers without --slurm, as atroposlib does inside a job
    assert len(ServerManager(ServerBaseline(model_name="policy")).servers) == 8


def test_slurm_outside_a_job_or_on_one_node_keeps_the_configured_servers(slurm_job) -> None:
    assert [s.config.base_url for s in ServerManager([POLICY], slurm=True).servers] == [POLICY.base_url]
    slurm_job.setenv("SLURM_JOB_NODELIST", "node1")
    assert [s.config.base_url for s in ServerManager([POLICY], slurm=True).servers] == [POLICY.base_url]
    baseline = ServerManager(ServerBaseline(model_name="policy"))
    assert [s.config.base_url for s in baseline.servers] == [f"http://localhost:{p}/v1" for p in range(9004, 9008)]


def test_several_nodes_without_num_training_nodes_is_a_config_error(slurm_job) -> None:
    slurm_job.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    with pytest.raises(ConfigError, match="NUM_TRAINING_NODES"):
        ServerManager([POLICY], slurm=True)


def test_testing_answers_from_the_programmed_harness_only() -> None:
    manager = ServerManager([POLICY], testing=True)
    harness = manager.servers[0]
    chat = [{"role": "user", "content": "2+2?"}]
    harness.set_desired_response(chat, create_chat_completion(["4", "5"], n=2))
    out = asyncio.run(manager.chat_completion(messages=chat, n=2))
    assert [c.message.content for c in out.choices] == ["4", "5"]
    with pytest.raises(ConfigError, match="ServerHarness has no chat_completion answer"):
        asyncio.run(manager.chat_completion(messages=[{"role": "user", "content": "other"}]))


def _sed_env(tmp_path: Path, url: str) -> Path:
    path = tmp_path / "env.py"
    path.write_text(ONE_SERVER_ENV.format(tok=TOKENIZER, url=url))
    subprocess.run(["sed", "-i", SED, str(path)], check=True)
    return path


def test_python_env_py_testing_and_slurm_flags(fake_server, tmp_path: Path) -> None:
    srv = fake_server(rule="arithmetic", accuracy=0.5)
    runs = {}
    for name, flags in {
        "testing": ["--testing", "true"],
        "slurm": ["--slurm", "true"],
        "bad": ["--slurm", "maybe"],
    }.items():
        (tmp_path / name).mkdir()
        path = _sed_env(tmp_path / name, srv.base_url)
        argv = [sys.executable, str(path), "process", "--env.total_steps", "1", "--env.group_size", "2", *flags]
        runs[name] = subprocess.Popen(
            argv, cwd=tmp_path / name, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
    done = {name: (p.wait(timeout=120), p.communicate()[1]) for name, p in runs.items()}  # in parallel
    # --testing: every request goes to the unprogrammed ServerHarness; each group fails with its one-line error
    assert "Traceback" not in done["testing"][1]
    failures = (tmp_path / "testing" / "data" / "one_server.failures.jsonl").read_text()
    assert "ServerHarness has no chat_completion answer" in failures
    # --slurm outside a Slurm job: the configured server answers
    assert done["slurm"][0] == 0, done["slurm"][1][-2000:]
    assert len((tmp_path / "slurm" / "data" / "one_server.jsonl").read_text().splitlines()) == 1
    assert srv.requests == 1  # the slurm run's one request; none from --testing
    assert done["bad"][0] != 0 and "--slurm takes true or false, not 'maybe'" in done["bad"][1]


def test_managed_server_adapter_under_atropos_process(fake_server, tmp_path: Path) -> None:
    srv = fake_server(rule=lambda prompt, k: ["4", "5"][k % 2], tokenizer=str(TOKENIZER))
    args = ["process", str(DATA / "adapter_env.py"), "--openai.base_url", srv.base_url]
    args += ["--env.tokenizer_name", str(TOKENIZER), "--out", str(tmp_path / "run")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (tmp_path / "run" / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and all(sorted(g["scores"]) == [0.0, 1.0] for g in groups)
    for group in groups:
        for tokens, masks, logprobs in zip(group["tokens"], group["masks"], group["inference_logprobs"], strict=True):
            trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
            assert trained and len(logprobs) == len(tokens) and masks[0] == -100


def test_managed_server_adapter_refuses_what_atroposlib_refuses() -> None:
    from atropos_cli.compat.atroposlib.envs.server_handling.managed_server import ManagedServer, ManagedServerAdapter

    adapter = ManagedServerAdapter(managed_server=ManagedServer(server=None), base_url="http://x/v1")
    assert adapter.base_url == "http://x/v1"
    with pytest.raises(NotImplementedError, match="post"):
        asyncio.run(adapter.post("/generate", {}, dict))
    with pytest.raises(NotImplementedError, match="copy"):
        adapter.copy()


def test_envs_whose_init_names_the_flags_otherwise_still_build() -> None:
    """Atropos' eval envs take `slurm_job_id` (atroposlib's CLI, passing slurm=, fails on them): ours pass only
    the flags a constructor takes."""
    from atropos_cli.compat.atroposlib.envs._manager_flags import manager_flags, reset_manager_flags
    from atropos_cli.compat.atroposlib.envs.base import BaseEnv, BaseEnvConfig
    from atropos_cli.config import ServerConfig

    class EvalLike(BaseEnv):
        def __init__(self, config, server_configs, slurm_job_id=None, testing=False):
            super().__init__(config, server_configs, slurm_job_id, testing)
            self.seen = (slurm_job_id, testing)

    class Plain(BaseEnv):
        def __init__(self, config, server_configs, slurm=True, testing=False):
            super().__init__(config, server_configs, slurm, testing)
            self.seen = (slurm, testing)

    config = BaseEnvConfig(tokenizer_name="none", use_wandb=False)
    servers = [ServerConfig(base_url="http://127.0.0.1:9/v1", model_name="m")]
    token = manager_flags(slurm=False, testing=True)
    try:
        assert EvalLike.build(config, servers).seen == (None, True)
        plain = Plain.build(config, servers)
        assert plain.seen == (False, True) and type(plain.server.servers[0]).__name__ == "ServerHarness"
    finally:
        reset_manager_flags(token)
    assert Plain.build(config, servers).seen == (False, False)  # never the env's own slurm=True default
