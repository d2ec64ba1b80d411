"""`atropos init-env NAME`: the scaffolded env and test work as written."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from atropos_cli.cli.app import app

runner = CliRunner()


def test_init_env_writes_an_env_and_a_test_that_pass(tmp_path):
    result = runner.invoke(app, ["init-env", "word_len", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "word_len.py").is_file() and (tmp_path / "test_word_len.py").is_file()
    assert "wrote" in result.output and "pytest" in result.output
    source = (tmp_path / "word_len.py").read_text()
    assert "class WordLenEnv(SimpleEnv)" in source and 'name = "word_len"' in source
    assert len(source.splitlines()) < 60  # the walkthrough promise: an env in a few dozen lines
    # The generated test runs green in a fresh interpreter, from its own directory.
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_word_len.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 passed" in done.stdout


def test_scaffolded_env_runs_under_evaluate(fake_server, tmp_path):
    assert runner.invoke(app, ["init-env", "word_len", "--out", str(tmp_path)]).exit_code == 0

    def answer(prompt: str, index: int) -> str:
        return str(len(prompt.split("'")[1]))

    server = fake_server(rule=answer)
    result = runner.invoke(
        app, ["evaluate", str(tmp_path / "word_len.py"), "--out", str(tmp_path / "ev"), "--limit", "5",
              "--openai.base_url", server.base_url],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "pass@1" in result.output and "1.0000" in result.output


def test_init_env_refuses_to_overwrite_and_bad_names(tmp_path):
    assert runner.invoke(app, ["init-env", "task_a", "--out", str(tmp_path)]).exit_code == 0
    again = runner.invoke(app, ["init-env", "task_a", "--out", str(tmp_path)])
    assert again.exit_code == 2 and "already exists" in again.output and "--overwrite" in again.output
    assert runner.invoke(app, ["init-env", "task_a", "--out", str(tmp_path), "--overwrite"]).exit_code == 0
    bad = runner.invoke(app, ["init-env", "My-Task", "--out", str(tmp_path)])
    assert bad.exit_code == 2 and "'My-Task' is not a valid module name" in bad.output and "'my_task'" in bad.output
    shadow = runner.invoke(app, ["init-env", "json", "--out", str(tmp_path)])
    assert shadow.exit_code == 2 and "shadow" in shadow.output


NO_PYTEST = (
    "import sys\nsys.modules['pytest'] = None\nfrom atropos_cli.cli.app import main\nmain()\n"  # a venv without it
)


def test_the_next_line_says_to_install_pytest_where_it_is_missing(tmp_path):
    with_pytest = runner.invoke(app, ["init-env", "word_len", "--out", str(tmp_path / "a")])
    assert f"next: pytest {tmp_path / 'a' / 'test_word_len.py'}  ·" in with_pytest.output
    done = subprocess.run(
        [sys.executable, "-c", NO_PYTEST, "init-env", "word_len", "--out", str(tmp_path / "b")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"next: pip install pytest && pytest {tmp_path / 'b' / 'test_word_len.py'}  ·" in done.stdout
