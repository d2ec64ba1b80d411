"""The prefix dispatch of env specs (`vf:NAME`, `gym:ID`, ...): env.registry's ADAPTERS table routes a prefix
to its adapter module, whose config's own fields are listed as `--env.*` flags in the commands' --help."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.config import EnvConfig
from atropos_cli.env import registry
from atropos_cli.env.base import BaseEnv
from atropos_cli.errors import EnvLoadError, EnvNotFoundError

FAKE_ADAPTER = """
from pydantic import Field
from atropos_cli.config import EnvConfig
from atropos_cli.env.base import BaseEnv

class CONFIG(EnvConfig):
    fake_level: int = Field(3, description="How hard the fake framework's env is.")

def load_env_class(target):
    if target == "broken":
        return "not a class"
    return type("FakeEnv_" + target, (BaseEnv,), {"name": "fake:" + target, "env_config_cls": CONFIG})
"""


@pytest.fixture
def fake_prefix(tmp_path, monkeypatch):
    (tmp_path / "fake_framework_adapter.py").write_text(FAKE_ADAPTER)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(registry.ADAPTERS, "fake", "fake_framework_adapter")
    return "fake"


def test_a_prefix_routes_to_its_adapter(fake_prefix):
    cls = registry.resolve_env("fake:level-one")
    assert issubclass(cls, BaseEnv) and cls.name == "fake:level-one"
    assert cls.env_config_cls().fake_level == 3


def test_a_prefix_without_a_target_or_with_a_bad_adapter_is_one_clear_error(fake_prefix):
    with pytest.raises(EnvNotFoundError, match="names no fake env"):
        registry.resolve_env("fake:")
    with pytest.raises(EnvLoadError, match="not an env class"):
        registry.resolve_env("fake:broken")


def test_an_adapter_that_cannot_import_says_which(monkeypatch):
    monkeypatch.setitem(registry.ADAPTERS, "nope", "atropos_cli.adapters.no_such_module")
    with pytest.raises(EnvLoadError, match="the nope: adapter failed to import"):
        registry.resolve_env("nope:x")


def test_unknown_env_hint_names_the_prefixes(fake_prefix):
    with pytest.raises(EnvNotFoundError) as info:
        registry.resolve_env("no_such_env_anywhere")
    assert "fake:NAME" in (info.value.hint or "")


@pytest.mark.parametrize("command", ["process", "evaluate", "serve", "train"])
def test_help_lists_each_adapters_env_flags(fake_prefix, command):
    result = CliRunner().invoke(app, [command, "--help"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    assert "Options of fake: envs: --env.fake_level: How hard the fake framework's env is." in result.output


@pytest.mark.parametrize("prefix", sorted(registry.ADAPTERS))
def test_every_adapter_module_has_the_contract_and_imports_light(prefix):
    module = registry.adapter_module(prefix)
    assert issubclass(module.CONFIG, EnvConfig) and callable(module.load_env_class)
    heavy = ("verifiers", "gymnasium", "openenv", "torch", "transformers")
    code = (
        f"import sys; from atropos_cli.env.registry import adapter_module; adapter_module({prefix!r}); "
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize(
    ("spec", "package", "message", "hint"),
    [
        ("vf:vf_arithmetic", "verifiers", "needs the verifiers package", "pip install verifiers==0.4.0"),
        ("gym:TextGames/Arithmetic-v0", "gymnasium", "needs the gymnasium package", "pip install 'gymnasium>=1,<2'"),
    ],
)
def test_without_its_framework_an_adapter_says_how_to_install_it(spec, package, message, hint):
    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed in this venv")
    with pytest.raises(EnvLoadError, match=message) as info:
        registry.resolve_env(spec)
    assert hint in (info.value.hint or "")


@pytest.mark.parametrize("prefix", list(registry.ADAPTERS))
def test_adapter_envs_collect_as_many_groups_by_default_as_the_bundled_example(prefix):
    from atropos_cli.env.loading import resolve_run_config

    bundled = resolve_run_config("arithmetic", [], None)[2].total_steps
    assert registry.adapter_module(prefix).CONFIG().total_steps == bundled == 64
