"""The atroposlib compatibility layer (atropos_cli.compat.atroposlib) on its own: the import alias and its
errors, config_init shapes, `python env.py process|evaluate` after the documented sed, ManagedServer's
bookkeeping, tokenize_for_trainer, the hermes parser, W&B without wandb. Real files, real local servers."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.compat.atroposlib.envs.server_handling.server_manager import APIServerConfig, ServerManager
from atropos_cli.compat.atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer
from atropos_cli.compat.atroposlib.utils.tool_call_parser import parse_tool_call
from atropos_cli.env.loading import resolve_run_config
from atropos_cli.errors import EnvLoadError
from atropos_cli.resources import resolve_model_path
from atropos_cli.testing.fake_server import token_logprob
from atropos_conformance import ENVS_DIR, ConformanceRule, process_flags
from test_viewer import data_block

TOKENIZER = resolve_model_path("atropos-tiny-arith")
SED = r"s/\batroposlib\b/atropos_cli.compat.atroposlib/g"


@pytest.fixture
def tokenizer():
    from atropos_cli.inference.tokenizer import load_tokenizer

    return load_tokenizer(TOKENIZER)


def env_file(tmp_path: Path, body: str, name: str = "env.py") -> Path:
    path = tmp_path / name
    path.write_text(body)
    return path


ONE_SERVER_ENV = """
from atroposlib.envs.base import APIServerConfig, BaseEnv, BaseEnvConfig, ScoredDataGroup
from atroposlib.utils.tokenize_for_trainer import tokenize_for_trainer


class OneServerEnv(BaseEnv):
    name = "one_server"

    @classmethod
    def config_init(cls):
        config = BaseEnvConfig(group_size=2, total_steps=2, tokenizer_name="{tok}", use_wandb=False)
        return config, APIServerConfig(base_url="{url}", model_name="fake-model", api_key="x")

    async def setup(self):
        self.i = 0

    async def get_next_item(self):
        self.i += 1
        return self.i

    async def collect_trajectories(self, item):
        chat = [{{"role": "user", "content": f"What is {{item}} + 1?"}}]
        out = await self.server.chat_completion(messages=chat, n=2)
        group = ScoredDataGroup()
        group["tokens"], group["masks"], group["scores"] = [], [], []
        for choice in out.choices:
            answer = {{"role": "assistant", "content": choice.message.content}}
            t = tokenize_for_trainer(self.tokenizer, chat + [answer])
            group["tokens"].append(t["tokens"])
            group["masks"].append(t["masks"])
            group["scores"].append(float(choice.message.content == str(item + 1)))
        return group, []

    async def evaluate(self, *args, **kwargs):
        return None


if __name__ == "__main__":
    OneServerEnv.cli()
"""


def test_config_init_with_one_api_server_config_uses_its_url(fake_server, tmp_path: Path) -> None:
    srv = fake_server(rule="arithmetic", accuracy=1.0)
    path = env_file(tmp_path, ONE_SERVER_ENV.format(tok=TOKENIZER, url=srv.base_url))
    result = CliRunner().invoke(app, ["process", str(path), "--out", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (tmp_path / "run" / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2 and srv.requests == 2
    assert groups[0]["masks"][0][-2:] == groups[0]["tokens"][0][-2:] and groups[0]["masks"][0][0] == -100


def test_server_baseline_without_a_url_runs_the_local_model() -> None:
    _, run_config, env_config = resolve_run_config("x.py", [], None, mode="process", env_cls=_baseline_env())
    assert run_config.openai[0].server_type == "local" and run_config.openai[0].timeout == 30
    assert (env_config.ensure_scores_are_not_same, env_config.include_messages) == (False, True)
    assert env_config.tokenizer_name == "NousResearch/DeepHermes-3-Llama-3-3B-Preview"  # atroposlib's default


def _baseline_env() -> type:
    from atropos_cli.compat.atroposlib.envs.base import BaseEnv, BaseEnvConfig, ServerBaseline

    class BaselineEnv(BaseEnv):
        @classmethod
        def config_init(cls):
            return BaseEnvConfig(), ServerBaseline(timeout=30)

    return BaselineEnv


def test_a_missing_atroposlib_name_names_file_line_and_name(tmp_path: Path) -> None:
    path = env_file(tmp_path, "import os\n\nfrom atroposlib.envs.base import BaseEnv, NoSuchThing\n")
    with pytest.raises(EnvLoadError) as caught:
        resolve_run_config(str(path), [], None)
    assert caught.value.message == f"{path}:3: atroposlib.envs.base has no 'NoSuchThing'"
    assert "atroposlib 0.4.0" in (caught.value.hint or "")
    missing = env_file(tmp_path, "from atroposlib.envs.nowhere import X\n", "missing.py")
    with pytest.raises(EnvLoadError, match=r"missing.py:1: no module named 'atroposlib.envs.nowhere'"):
        resolve_run_config(str(missing), [], None)


def test_python_env_py_process_after_the_sed(fake_server, tmp_path: Path) -> None:
    """Must 2: the documented sed, then `python env.py process` with atroposlib's flags, default output path
    data/<name>.jsonl + .html, and `_1` for the second run instead of overwriting."""
    srv = fake_server(rule="arithmetic", accuracy=0.5)
    path = env_file(tmp_path, ONE_SERVER_ENV.format(tok=TOKENIZER, url=srv.base_url))
    subprocess.run(["sed", "-i", SED, str(path)], check=True)
    assert "from atropos_cli.compat.atroposlib.envs.base import" in path.read_text()
    for _ in range(2):
        done = subprocess.run(
            [sys.executable, str(path), "process", "--env.total_steps", "3", "--env.group_size=2"],
            cwd=tmp_path, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-2000:]
    first, second = tmp_path / "data" / "one_server.jsonl", tmp_path / "data" / "one_server_1.jsonl"
    assert len(first.read_text().splitlines()) == len(second.read_text().splitlines()) == 3
    record = json.loads(first.read_text().splitlines()[0])
    assert record["messages"] and record["meta"]["env"] == "one_server"
    for jsonl in (first, second):  # each run's viewer holds that run's groups: their rollouts' texts
        shown = json.dumps(data_block(jsonl.with_suffix(".html").read_text()))
        for line in jsonl.read_text().splitlines():
            for chat in json.loads(line)["messages"]:
                assert json.dumps(chat[-1]["content"]) in shown, chat[-1]["content"]


def test_python_env_py_bad_flag_and_bad_url_are_one_line_errors(tmp_path: Path) -> None:
    path = env_file(tmp_path, ONE_SERVER_ENV.format(tok=TOKENIZER, url="http://127.0.0.1:9/v1"))
    subprocess.run(["sed", "-i", SED, str(path)], check=True)
    bad_flag = subprocess.run(
        [sys.executable, str(path), "process", "--group_size", "3"], cwd=tmp_path, capture_output=True, text=True
    )
    assert bad_flag.returncode != 0 and "unknown flag --group_size" in bad_flag.stderr
    unreachable = subprocess.run(
        [sys.executable, str(path), "process", "--openai.max_retries", "0"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert unreachable.returncode == 1 and "Traceback" not in unreachable.stderr
    assert "no inference server answered at 'http://127.0.0.1:9/v1'" in unreachable.stderr
    assert "--openai.server_type local" in unreachable.stderr


def test_python_env_py_evaluate_writes_atroposlib_metrics_layout(fake_server, tmp_path: Path) -> None:
    srv = fake_server(ConformanceRule())
    source = (ENVS_DIR / "completion_eval.py").read_text()
    path = env_file(tmp_path, re.sub(r"\batroposlib\b", "atropos_cli.compat.atroposlib", source))
    flags = process_flags("completion_eval.py", srv.base_url, Path(TOKENIZER), tmp_path)
    flags += ["--env.data_dir_to_save_evals", str(tmp_path / "evals")]
    done = subprocess.run(
        [sys.executable, str(path), "evaluate", *flags], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    assert metrics["results"]["atropos|completion_eval_eval|0"] == {"eval/accuracy": 1.0} == metrics["results"]["all"]
    assert metrics["config_general"]["model_name"] == "fake-model"
    assert len((tmp_path / "evals" / "samples.jsonl").read_text().splitlines()) == 4
    assert (tmp_path / "evals" / "evaluate_config.yaml").is_file()


def test_managed_server_nodes_masks_logprobs_extension_and_branches(fake_server, tokenizer) -> None:
    asyncio.run(_managed_session(fake_server, tokenizer))


async def _managed_session(fake_server, tokenizer) -> None:
    srv = fake_server(rule=["GUESS 3", "GUESS 5", "GUESS 4"], tokenizer=TOKENIZER)
    manager = ServerManager([APIServerConfig(base_url=srv.base_url, server_type="vllm", model_name="fake-model")])
    first = [{"role": "user", "content": "Guess"}]
    async with manager.managed_server(tokenizer=tokenizer) as managed:
        reply = await managed.chat_completion(messages=first, n=1, max_tokens=8)
        turn2 = [*first, {"role": "assistant", "content": reply.choices[0].message.content}]
        turn2.append({"role": "user", "content": "Higher"})
        await managed.chat_completion(messages=turn2, n=2, max_tokens=8)
        nodes = managed.get_state()["nodes"]
    prompt1 = tokenizer.encode(tokenizer.apply_chat_template(first, tokenize=False, add_generation_prompt=True))
    out1 = tokenizer.encode("GUESS 3", add_special_tokens=False)
    assert len(nodes) == 2  # the first turn's node was extended by the first branch, the second branch is new
    node = nodes[0]
    assert node.tokens[: len(prompt1) + len(out1)] == prompt1 + out1
    assert node.masked_tokens[: len(prompt1)] == [-100] * len(prompt1)
    assert node.masked_tokens[len(prompt1) : len(prompt1) + len(out1)] == out1  # turn 1 stays trained on
    assert node.logprobs[: len(prompt1)] == [1.0] * len(prompt1)
    assert node.logprobs[len(prompt1) : len(prompt1) + len(out1)] == [token_logprob(t) for t in out1]
    out2 = [tokenizer.encode(t, add_special_tokens=False) for t in ("GUESS 5", "GUESS 4")]
    assert [n.masked_tokens[-len(o) :] for n, o in zip(nodes, out2, strict=True)] == out2
    suffix = len(nodes[0].tokens) - len(prompt1) - len(out1) - len(out2[0])
    assert nodes[0].masked_tokens[len(prompt1) + len(out1) :][:suffix] == [-100] * suffix
    assert all(n.metadata == {"finish_reason": "stop"} for n in nodes)
    await manager.aclose()


def test_tokenize_for_trainer_masks_all_but_the_last_turn(tokenizer) -> None:
    chat = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "5"}]
    out = tokenize_for_trainer(tokenizer, chat, include_messages=True)
    assert out["tokens"] == [3, 265, 264, 225, 22, 267, 225, 23, 35, 1, 4, 25, 1]
    assert out["masks"] == [-100] * 11 + [25, 1] and out["messages"] == chat
    cut = tokenize_for_trainer(tokenizer, chat, finish_reason="length")
    assert cut["tokens"][-1] == 25 and len(cut["masks"]) == 12  # the trailing EOS of a cut answer is dropped
    both = [*chat, {"role": "user", "content": "Again"}, {"role": "assistant", "content": "5"}]
    masks = tokenize_for_trainer(tokenizer, both, train_on_all_assistant_turns=True)["masks"]
    assert [m for m in masks if m != -100] == [25, 1, 25, 1]


def test_hermes_tool_calls() -> None:
    tools = [{"type": "function", "function": {"name": "calculator"}}]
    text = "Sure. <tool_call>{'name': 'calculator', 'arguments': {'expression': '2*3'}}</tool_call>"
    assert parse_tool_call(text, tools) == ("calculator", {"expression": "2*3"}, False)
    assert parse_tool_call(text.replace("calculator", "shell"), tools)[0] == "-ERROR-"
    assert parse_tool_call("no call here") == ("-ERROR-", {}, True)


def test_wandb_calls_are_no_ops_without_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    asyncio.run(_wandb_log_without_wandb(monkeypatch))


async def _wandb_log_without_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    import atropos_cli.compat.atroposlib.envs._logging as logging_hooks
    from atropos_cli.compat.atroposlib.envs import _wandb

    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` now raises ImportError
    from atropos_cli.compat import wandb_standin

    stand_in = _wandb._load()
    assert stand_in is wandb_standin
    monkeypatch.setattr(logging_hooks, "wandb", stand_in)
    env = _baseline_env().__new__(_baseline_env())
    env.__dict__.update(rollouts_for_wandb=[[("text", 1.0)]], completion_lengths=[3, 5], max_token_len=10)
    env.__dict__.update(wandb_prepend="x", curr_step=0, server=None)
    env.__dict__.update(task_duration=[], succeeded_task_duration=[], failed_task_duration=[], mainloop_timings=[])
    env.config = type("C", (), {"use_wandb": True})()
    await env.wandb_log({"train/custom": 1.0})
    assert env.last_wandb_metrics["train/rollouts"].data == [["text", 1.0]]
    assert env.last_wandb_metrics["train/completion_lengths"] == 4.0


def test_eval_base_runs_items_and_writes_the_metrics_layout(fake_server, tmp_path: Path) -> None:
    from atropos_cli.compat.atroposlib.envs.eval import EvalBase, pass_at_k

    class Sums(EvalBase):
        def setup_data(self):
            return [(2, 3), (4, 4)]

        async def run_item(self, server, item):
            out = await self.chat_completion(server, [{"role": "user", "content": f"What is {item[0]} + {item[1]}?"}])
            right = out.choices[0].message.content == str(sum(item))
            return {"accuracy": float(right)}, {"item": list(item), "right": right}

    srv = fake_server(rule="arithmetic", accuracy=1.0)
    manager = ServerManager([APIServerConfig(base_url=srv.base_url, model_name="fake-model", api_key="x")])
    metrics = asyncio.run(Sums(eval_dir=str(tmp_path), max_tokens=8)(manager))
    assert metrics == {"accuracy": 1.0}
    written = json.loads((tmp_path / "metrics.json").read_text())
    assert written["results"]["atropos|Sums@1|0"] == metrics and written["config_general"]["model_name"] == "fake-model"
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 4, 2) == 1.0


SURFACE = {
    "atroposlib.envs.base": "BaseEnv BaseEnvConfig ScoredDataGroup ScoredDataItem EvalHandlingEnum APIServerConfig "
    "ServerBaseline ServerManager Item",
    "atroposlib.envs.server_handling.server_manager": "ServerManager ServerManagerConfig APIServerConfig "
    "ServerBaseline",
    "atroposlib.envs.server_handling.server_baseline": "ServerBaseline APIServerConfig APIServer ReasoningConfig",
    "atroposlib.envs.server_handling.openai_server": "OpenAIServer resolve_openai_configs",
    "atroposlib.envs.server_handling.vllm_server": "VLLMServer",
    "atroposlib.envs.server_handling.managed_server": "ManagedServer SequenceNode DummyManagedServer",
    "atroposlib.envs.eval": "EvalBase pass_at_k evaluate_log",
    "atroposlib.envs.teacher_distillation_env": "TeacherDistillationEnv TeacherDistillationConfig",
    "atroposlib.envs.constants": "ENV_NAMESPACE OPENAI_NAMESPACE NAMESPACE_SEP",
    "atroposlib.type_definitions": "Item Message number UUID AgentStep AgentHistory GameStep GameHistory",
    "atroposlib.utils.tokenize_for_trainer": "tokenize_for_trainer",
    "atroposlib.utils.tool_call_parser": "parse_tool_call extract_tool_call",
    "atroposlib.utils.advantages": "compute_grpo_process_supervision_advantages compute_discounted_returns "
    "compute_stats allclose_to_first",
    "atroposlib.utils.message_history_utils": "strip_thinking truncate_thinking ensure_trajectory_token_limit",
    "atroposlib.utils.best_of_n_selection": "select_best_index",
    "atroposlib.utils.cli": "get_double_dash_flags merge_dicts extract_namespace",
    "atroposlib.frontend.jsonl2html": "generate_html",
}


@pytest.mark.parametrize("module", sorted(SURFACE))
def test_the_atroposlib_module_paths_envs_import_exist(module: str) -> None:
    import importlib

    from atropos_cli.env.aliases import install_aliases

    install_aliases()
    loaded = importlib.import_module(module)
    assert loaded is importlib.import_module(module.replace("atroposlib", "atropos_cli.compat.atroposlib", 1))
    assert [name for name in SURFACE[module].split() if not hasattr(loaded, name)] == []


def test_atropos_serve_runs_an_unmodified_atropos_env(
    fake_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`atropos serve env.py` on an Atropos env with state and W&B hooks: its groups (with the overrides its
    handle_send_to_api adds) reach our trajectory API; its wandb_log hook saved checkpoints under the
    trainer's checkpoint_dir ("c", from the API's registration, as atroposlib's serve loop sets it)."""
    monkeypatch.chdir(tmp_path)
    import httpx

    from atropos_cli.env.loading import load_env
    from atropos_cli.runs.serve import ServeOptions, serve_env
    from test_serve import running_api, start_trainer

    srv = fake_server(ConformanceRule(), tokenizer=TOKENIZER)
    flags = process_flags("checkpointing_env.py", srv.base_url, Path(TOKENIZER), tmp_path)
    with running_api() as url:
        start_trainer(url, batch_size=4)
        env = str(ENVS_DIR / "checkpointing_env.py")
        loaded = load_env(env, [*flags, "--env.max_batches_offpolicy", "0"], None, mode="serve")
        options = ServeOptions(api_url=url, max_groups=4, spill_path=str(tmp_path / "spill.jsonl"))
        stats = asyncio.run(serve_env(loaded, options))
        assert stats.counts.groups == 4
        batch = httpx.get(url + "/batch").json()["batch"]
    assert batch and all(len(g["tokens"]) == 2 and g["overrides"][0]["iter"] >= 1 for g in batch)
    saved = list((tmp_path / "c" / "env_checkpoints" / "checkpointing_0").glob("step-*.json"))
    assert saved and all(json.loads(p.read_text())["iter"] >= 1 for p in saved)


def test_failures_in_env_code_are_one_line_with_file_and_line(fake_server, tmp_path: Path) -> None:
    srv = fake_server(rule="arithmetic")
    source = ONE_SERVER_ENV.format(tok=TOKENIZER, url=srv.base_url)
    setup_fails = source.replace("        self.i = 0\n", "        self.i = open('/no/such/dataset.jsonl')\n")
    path = env_file(tmp_path, setup_fails, "setup_fails.py")
    line = setup_fails.splitlines().index("        self.i = open('/no/such/dataset.jsonl')") + 1
    result = CliRunner().invoke(app, ["process", str(path), "--out", str(tmp_path / "a")])
    assert result.exit_code == 1  # setup() is an env hook: runs/envcall.py's one line
    said = " ".join(result.output.split())
    assert "the env's setup() raised FileNotFoundError:" in said and f"(at {path}:{line})" in said
    bad_config = source.replace("BaseEnvConfig(group_size=2,", "BaseEnvConfig(group_size='two',")
    path = env_file(tmp_path, bad_config, "bad_config.py")
    result = CliRunner().invoke(app, ["process", str(path), "--out", str(tmp_path / "b")])
    config_line = bad_config.splitlines().index(next(x for x in bad_config.splitlines() if "group_size='two'" in x)) + 1
    assert result.exit_code == 2
    assert f"{path}:{config_line}: OneServerEnv.config_init() failed: ValidationError" in " ".join(
        result.output.split()
    )
    assert "Traceback" not in result.output


def test_the_env_tokenizer_applies_chat_templates_as_transformers_4_does(tokenizer) -> None:
    """atroposlib env files take `len(self.tokenizer.apply_chat_template(chat, add_generation_prompt=True))` as the
    prompt's token count (math_server.py's `max_tokens`): ids, not transformers 5's BatchEncoding, here too."""
    from atropos_cli.compat.atroposlib.envs.base import BaseEnv, BaseEnvConfig, ServerBaseline

    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    ids = tokenizer.encode(tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True))
    env = BaseEnv(BaseEnvConfig(tokenizer_name=TOKENIZER, use_wandb=False), ServerBaseline())
    assert env.tokenizer.apply_chat_template(chat, add_generation_prompt=True) == ids
    asked = env.tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
    assert list(asked["input_ids"]) == ids
    text = tokenizer.apply_chat_template(chat, tokenize=False)
    assert env.tokenizer.apply_chat_template(chat, tokenize=False) == text
    env.tokenizer = tokenizer  # one the env loads itself gets the same defaults
    assert env.tokenizer.apply_chat_template(chat, add_generation_prompt=True) == ids
