"""The docs' example env (docs/envs.md, "Write your own env") is examples/parity_env.py, and it runs as written."""

import json
from pathlib import Path

from typer.testing import CliRunner

from atropos_cli.cli.app import app

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "parity_env.py"


def test_parity_example_env_processes_and_scores(tmp_path, fake_server):
    server = fake_server(rule=lambda prompt, index: "even" if index % 2 == 0 else "odd!!!!!!!!!!")
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "process",
            str(EXAMPLE),
            "--out",
            str(out),
            "--num-groups",
            "4",
            "--group-size",
            "2",
            "--base-url",
            server.base_url,
        ],
    )
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 4
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 1.0]  # one of "even"/"odd" is right for each number
        parts = group["meta"]["rollouts"][0]["reward_parts"]
        assert set(parts) == {"score", "short"}


def test_the_docs_show_the_example_env_as_it_is():
    """docs/envs.md's "A whole env" block is examples/parity_env.py, its docstring aside: the page cannot drift."""
    import ast
    import re

    page = (Path(__file__).resolve().parents[1] / "docs" / "envs.md").read_text()
    shown = re.search(r"A whole env:\n\n```python\n(.*?)```", page, flags=re.S)
    assert shown is not None, "docs/envs.md lost its example env"
    module = ast.parse(EXAMPLE.read_text())
    if isinstance(module.body[0], ast.Expr) and isinstance(module.body[0].value, ast.Constant):
        module.body = module.body[1:]  # the file's docstring is not shown on the page
    assert ast.dump(ast.parse(shown.group(1))) == ast.dump(module)
