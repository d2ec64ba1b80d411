"""Each setting is declared once: the options of train / sft-gen / dpo-gen are their models' fields, with the
fields' defaults and help texts, and layering keeps `defaults < YAML < CLI`."""

from __future__ import annotations

import enum

import pytest
from typer.testing import CliRunner

from atropos_cli.api.client import ApiSourceOptions
from atropos_cli.cli import datagen as datagen_cli
from atropos_cli.cli import train as train_cli
from atropos_cli.cli.app import app, load_command
from atropos_cli.cli.options import field_help, flag_of
from atropos_cli.trainer.config import GRPOConfig, RunOptions

runner = CliRunner()
# Fields a command declares by hand, and the flag that carries each (a positional argument, or a derived default).
HAND_DECLARED = {
    (GRPOConfig, "out"): "--out",  # default runs/train-<env>
    (RunOptions, "env"): "ENV",
    (RunOptions, "dotted_args"): "--env.* / --openai.*",
    (RunOptions, "env_config_path"): "--config",
    (ApiSourceOptions, "max_token_len"): "--max-token-len",
}
COMMANDS = {
    "train": [train_cli.GRPO_OPTIONS, train_cli.RUN_OPTIONS],
    "sft-gen": list(datagen_cli.SFT_OPTIONS),
    "dpo-gen": list(datagen_cli.DPO_OPTIONS),
}


def _options(command: str) -> dict[str, object]:
    click_command = load_command(command)
    return {opt: p for p in click_command.params for opt in (*p.opts, *getattr(p, "secondary_opts", ()))}


def _cases():
    for command, specs in COMMANDS.items():
        for spec in specs:
            for name in spec.model.model_fields:
                yield pytest.param(command, spec.model, spec, name, id=f"{command}:{spec.model.__name__}.{name}")


@pytest.mark.parametrize(("command", "model", "spec", "name"), list(_cases()))
def test_every_field_has_a_flag_with_its_default_and_help(command, model, spec, name):
    info = model.model_fields[name]
    assert field_help(info), f"{model.__name__}.{name} has no docstring/description: it would have no --help"
    if (model, name) in HAND_DECLARED:
        assert name in spec.exclude
        return
    options = _options(command)
    flag = flag_of(name, spec.flags)
    assert flag in options, f"{command} has no {flag} for {model.__name__}.{name}"
    param = options[flag]
    assert param.help == field_help(info)
    default = param.default.value if isinstance(param.default, enum.Enum) else param.default
    expected = None if info.default_factory is not None else info.default
    if isinstance(expected, tuple):
        default = tuple(default)
    assert default == expected, f"{flag}: --help says {default!r}, {model.__name__}.{name} says {expected!r}"
    if info.annotation is bool:
        assert f"--no-{flag[2:]}" in param.secondary_opts


@pytest.mark.parametrize("command", list(COMMANDS))
def test_help_shows_the_fields_help(command):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0
    for spec in COMMANDS[command]:
        for name, info in spec.fields().items():
            assert flag_of(name, spec.flags) in result.output
            assert field_help(info)[:40] in result.output, (command, name)


def test_hand_declared_flags_exist():
    train = _options("train")
    assert {"--out", "--config", "--sft"} <= set(train)
    assert {"--out", "--max-token-len", "--api-url", "--tasks-per-step"} <= set(_options("dpo-gen"))


def test_todays_flag_spellings_still_work():
    train = _options("train")
    for flag in ("--is-correction", "--batch-size", "--compile", "--pack", "--lora-r", "--vllm-args", "--data"):
        assert flag in train
    for command in ("sft-gen", "dpo-gen"):
        options = _options(command)
        for flag in ("--allow-negative-scores", "--append-to-previous", "--no-dedupe", "--format", "--group-size"):
            assert flag in options
    assert "--tasks-per-step" in _options("dpo-gen")  # dpo-gen registered group_size * 8 before
