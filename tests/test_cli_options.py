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


# The flags spelled otherwise than --field-name (written out here, not read from the specs).
RENAMED = {"is_mode": "--is-correction", "api_batch_size": "--batch-size", "url": "--api-url"}
# defaults a run resolves from other settings, shown as the run resolves them rather than the field's value
SHOWN_DEFAULTS = {("train", "--lr"): "(0.0003 for the shipped atropos-tiny-arith, else 1e-05)"}


def expected_flag(name: str) -> str:
    return RENAMED.get(name, "--" + name.replace("_", "-"))


def expected_default(flag: str, info) -> str | None:
    """What `--help` must show after `[default: `, from the field alone (None: no default shown)."""
    if info.default_factory is not None or info.is_required() or info.default is None:
        return None
    value = info.default
    if isinstance(value, bool):
        return flag[2:] if value else f"no-{flag[2:]}"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, (list, tuple)):
        return None if not value else ", ".join(map(str, value))
    return str(value)


def help_rows(command: str) -> dict[str, str]:
    """`atropos COMMAND --help`, run: each option's row (its flag -> the rest of its line, wrapped lines joined)."""
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "400", "NO_COLOR": "1", "TERM": "dumb"})
    assert result.exit_code == 0, result.output
    rows: dict[str, str] = {}
    last = None
    for line in result.output.splitlines():
        cell = line.strip().strip("│").strip()
        if cell.startswith("--"):
            last = cell.split()[0]
            rows[last] = cell
        elif last and cell and not line.lstrip().startswith(("╭", "╰")):
            rows[last] += " " + cell
        else:
            last = None
    return rows


def _cases():
    for command, specs in COMMANDS.items():
        for spec in specs:
            for name in spec.model.model_fields:
                yield pytest.param(command, spec.model, spec, name, id=f"{command}:{spec.model.__name__}.{name}")


@pytest.fixture(scope="module")
def helps() -> dict[str, dict[str, str]]:
    return {command: help_rows(command) for command in COMMANDS}


@pytest.mark.parametrize(("command", "model", "spec", "name"), list(_cases()))
def test_every_field_has_a_flag_with_its_default_and_help(helps, command, model, spec, name):
    """Checked against what `atropos COMMAND --help` prints: the flag, the field's docstring, the default."""
    info = model.model_fields[name]
    description = " ".join((info.description or "").split())
    assert description, f"{model.__name__}.{name} has no docstring/description: it would have no --help"
    if (model, name) in HAND_DECLARED:
        assert name in spec.exclude
        return
    flag = expected_flag(name)
    row = helps[command].get(flag)
    assert row is not None, f"`atropos {command} --help` lists no {flag} for {model.__name__}.{name}"
    assert description[:60] in " ".join(row.split()), f"{flag}: {row!r}"
    shown = row.split("[default: ")[1].split("]")[0] if "[default: " in row else None
    expected = SHOWN_DEFAULTS.get((command, flag), expected_default(flag, info))
    assert shown == expected, f"{flag}: --help shows {shown!r}"
    if info.annotation is bool:
        assert f"--no-{flag[2:]}" in row


def test_a_required_field_shows_no_default(helps):
    """A field with no default (the live API's url) is optional on the command line and shows none."""
    row = helps["sft-gen"]["--api-url"]
    assert "[default:" not in row and "Undefined" not in row


def test_literal_flags_defaults_and_help(helps):
    rows = helps["sft-gen"]
    assert "Best rollouts kept per group. [default: 3]" in rows["--save-top-n-per-group"]
    assert "[default: messages]" in rows["--format"] and "<messages|prompt-completion|atropos>" in rows["--format"]
    assert "[default: dedupe]" in rows["--dedupe"] and "--no-dedupe" in rows["--dedupe"]
    assert "[env var: ATROPOS_API_KEY]" in rows["--api-key"]
    assert "[default: 64]" in helps["dpo-gen"]["--tasks-per-step"]


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
