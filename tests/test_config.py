"""Layered config: defaults < YAML < CLI, Atropos' layout and dotted flags, errors with did-you-mean hints."""

import pytest

from atropos_cli.config import EnvConfig, ServerConfig, config_diff, load_yaml, parse_dotted_flags, resolve_config
from atropos_cli.errors import ConfigError


def resolve(yaml_data=None, cli_env=None, cli_openai=None):
    return resolve_config(
        "x", EnvConfig, EnvConfig(group_size=8, total_steps=10), [], yaml_data, cli_env or {}, cli_openai or {}
    )


def test_dotted_flags_parse_values_with_yaml_scalar_rules():
    parsed = parse_dotted_flags(
        [
            "--env.group_size",
            "16",
            "--env.use_wandb=false",
            "--openai.base_url",
            "http://h/v1",
            "--env.include_messages",
        ]
    )
    assert parsed["env"] == {"group_size": 16, "use_wandb": False, "include_messages": True}
    assert parsed["openai"] == {"base_url": "http://h/v1"}


def test_precedence_defaults_then_yaml_then_cli(tmp_path):
    env, servers = resolve({"env": {"group_size": 4, "seed": 3}}, {"group_size": 2})
    assert (env.group_size, env.seed, env.total_steps) == (2, 3, 10)
    assert servers == [ServerConfig()]


def test_yaml_server_list_gives_several_servers_and_cli_applies_to_each():
    yaml_data = {"openai": [{"base_url": "http://a/v1"}, {"base_url": "http://b/v1", "weight": 2}]}
    _, servers = resolve(yaml_data, cli_openai={"model_name": "m"})
    assert [s.base_url for s in servers] == ["http://a/v1", "http://b/v1"]
    assert {s.model_name for s in servers} == {"m"}


@pytest.mark.parametrize(
    ("kwargs", "message", "hint"),
    [
        ({"cli_env": {"group_sise": 3}}, "unknown env option 'group_sise'", "did you mean 'group_size'?"),
        ({"cli_openai": {"base_ur": "x"}}, "unknown openai option 'base_ur'", "did you mean 'base_url'?"),
        ({"cli_env": {"group_size": "many"}}, "bad value for env.group_size: 'many'", "int"),
    ],
)
def test_unknown_keys_and_bad_values_are_one_line_errors(kwargs, message, hint):
    with pytest.raises(ConfigError) as info:
        resolve(**kwargs)
    assert message in info.value.message and hint in info.value.hint


def test_bad_yaml_file_names_the_line(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("env:\n  group_size: [1\n")
    with pytest.raises(ConfigError, match=r"run.yaml:\d+: not valid YAML"):
        load_yaml(path)
    path.write_text("envv: {}\n")
    with pytest.raises(ConfigError) as info:
        load_yaml(path)
    assert info.value.hint == "did you mean 'env'?"


def test_unprefixed_flag_is_rejected_with_hint():
    with pytest.raises(ConfigError, match="unknown option '--group_size'"):
        parse_dotted_flags(["--group_size", "3"])


def test_config_diff_names_nested_keys():
    assert config_diff({"env": {"a": 1, "b": 2}, "x": 1}, {"env": {"a": 1, "b": 3}, "x": 1}) == ["env.b"]
