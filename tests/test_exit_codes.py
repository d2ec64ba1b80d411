"""One exit-code table for every command (errors.py, docs/concepts.md "Exit codes"): 2 usage/config/input, 1 runtime."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from atropos_cli import errors
from atropos_cli.cli.app import app

runner = CliRunner()
COMMANDS = ["process", "evaluate", "view", "serve", "sft-gen", "dpo-gen", "train", "api", "inference", "envs"]


@pytest.mark.parametrize("command", COMMANDS)
def test_an_unknown_flag_is_a_usage_error_everywhere(command: str):
    result = runner.invoke(app, [command, "--no-such-flag", "1"])
    assert result.exit_code == errors.EXIT_USAGE, result.output
    assert "no such option: --no-such-flag" in " ".join(result.output.replace("│", " ").split())


@pytest.mark.parametrize(
    "args",
    [
        ["view", "{missing}"],
        ["sft-gen", "{missing}", "--out", "{out}"],
        ["dpo-gen", "{missing}", "--out", "{out}"],
        ["train", "--data", "{missing}", "--out", "{out}", "--steps", "1"],
        ["process", "arithmetic", "--config", "{missing}", "--out", "{out}"],
        ["evaluate", "arithmetic", "--config", "{missing}", "--out", "{out}"],
    ],
    ids=lambda args: args[0],
)
def test_a_missing_input_is_a_usage_error_everywhere(args: list[str], tmp_path: Path):
    missing, out = tmp_path / "nope.jsonl", tmp_path / "out"
    result = runner.invoke(app, [a.format(missing=missing, out=out) for a in args])
    assert result.exit_code == errors.EXIT_USAGE, result.output
    assert "error:" in result.output and "nope.jsonl" in result.output and "Traceback" not in result.output


def test_a_runtime_failure_exits_1(tmp_path: Path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "groups.jsonl").write_text('{"scores": [1.0], "messages": [[{"role": "user", "content": "x"}]]}\n')
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = runner.invoke(app, ["view", str(run), "--serve", "--port", str(busy.getsockname()[1])])
    assert result.exit_code == errors.EXIT_RUNTIME, result.output


def test_every_error_class_is_in_one_module_with_its_code():
    usage = [errors.ConfigError, errors.EnvNotFoundError, errors.EnvLoadError, errors.InputError, errors.RecordError]
    usage += [errors.OutputExistsError, errors.ModelLoadError, errors.UsageError]
    runtime = [errors.InferenceError, errors.ServerUnreachableError, errors.ApiRequestError, errors.ApiBusy]
    runtime += [errors.WireError, errors.RunAborted, errors.ApiWaitTimeout, errors.EndpointError]
    assert all(cls.exit_code == errors.EXIT_USAGE for cls in usage)
    assert all(cls.exit_code == errors.EXIT_RUNTIME for cls in runtime)
    assert all(issubclass(cls, errors.AtroposError) for cls in usage + runtime)
    from atropos_cli.api import service, wire
    from atropos_cli.runs import rollout

    assert service.ApiBusy is errors.ApiBusy and wire.WireError is errors.WireError
    assert rollout.RunAborted is errors.RunAborted


def test_context_is_rendered_in_front_of_the_message():
    exc = errors.RecordError("not valid JSON", hint="fix that line", file="runs/a/groups.jsonl", line=3)
    assert exc.text == "runs/a/groups.jsonl:3: not valid JSON"
    assert str(exc) == "runs/a/groups.jsonl:3: not valid JSON (hint: fix that line)"
    exc = errors.BadResponseError("empty completion", url="http://127.0.0.1:9/v1", rollout=2, env="gsm8k")
    assert exc.text == "env gsm8k, http://127.0.0.1:9/v1, rollout 2: empty completion"
    assert errors.AtroposError("plain").where is None


def test_an_unexpected_exception_is_one_line_not_a_traceback(monkeypatch):
    from atropos_cli.cli.common import cli_errors

    mini = typer.Typer()

    @mini.command()
    def boom() -> None:
        with cli_errors():
            raise ZeroDivisionError("division by zero")

    monkeypatch.delenv("ATROPOS_DEBUG", raising=False)
    result = runner.invoke(mini, [])
    assert result.exit_code == errors.EXIT_RUNTIME == 1
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "error: internal error: ZeroDivisionError: division by zero" in result.output
    assert "ATROPOS_DEBUG=1" in result.output
    monkeypatch.setenv("ATROPOS_DEBUG", "1")
    assert isinstance(runner.invoke(mini, []).exception, ZeroDivisionError)
