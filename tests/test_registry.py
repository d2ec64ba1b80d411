"""Finding envs by bundled name, by path file.py[:Class], with clear errors for typos and broken files."""

import pytest

from atropos_cli.env.base import SimpleEnv
from atropos_cli.env.registry import bundled_env_names, list_envs, resolve_env
from atropos_cli.errors import EnvLoadError, EnvNotFoundError

ENV_FILE = """
from atropos_cli import SimpleEnv

class Echo(SimpleEnv):
    name = "echo"
    def items(self, split):
        yield from ({"id": i, "text": str(i)} for i in range(3))
    def prompt(self, item):
        return item["text"]
    def reward(self, completion, item):
        return float(completion == item["text"])
"""


def test_bundled_arithmetic_is_found_and_listed():
    cls = resolve_env("arithmetic")
    assert issubclass(cls, SimpleEnv) and cls.name == "arithmetic"
    assert "arithmetic" in bundled_env_names()
    assert any(info.name == "arithmetic" and info.description for info in list_envs())


def test_unknown_env_suggests_the_closest_name():
    with pytest.raises(EnvNotFoundError) as info:
        resolve_env("arithmetc")
    assert info.value.message == "unknown env 'arithmetc'"
    assert "did you mean 'arithmetic'?" in info.value.hint


def test_env_file_by_path_and_by_class(tmp_path):
    path = tmp_path / "echo_env.py"
    path.write_text(ENV_FILE)
    assert resolve_env(str(path)).name == "echo"
    assert resolve_env(f"{path}:Echo").__name__ == "Echo"
    with pytest.raises(EnvLoadError, match="has no env class 'Nope'"):
        resolve_env(f"{path}:Nope")


def test_env_file_with_syntax_error_names_file_and_line(tmp_path):
    path = tmp_path / "broken.py"
    path.write_text("class X(:\n    pass\n")
    with pytest.raises(EnvLoadError, match=r"broken.py:1: syntax error"):
        resolve_env(str(path))


def test_missing_env_file(tmp_path):
    with pytest.raises(EnvNotFoundError, match="does not exist"):
        resolve_env(str(tmp_path / "nope.py"))
