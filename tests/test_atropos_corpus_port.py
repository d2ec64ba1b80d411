"""The last Atropos corpus gaps (issue 37, Must 1), each on atroposlib 0.4.0's own env files (the sdist's
`environments/`, downloaded at test time by tests/test_atropos_corpus.py's `sdist_root`, never committed):

- a file with two env classes runs the one its `__main__` block runs, or the one named `FILE:Class`, and
  `atropos port` says which (tool_use_turnlevel_advantage_server.py);
- `port --run` calls a run whose every server call failed a failure, not an env that "runs here"
  (rubiks_cube_environment.py drops its group itself when its calls fail);
- the static check lists the data files an env reads by a relative path and whether each is there
  (judgemark_eval.py, solitaire_server.py, ufc_server.py, kernelbench_env.py, ...);
- a `collect_trajectories` that returns the wrong shape is one line naming the field and what was expected
  (sanskrit_poetry_env.py returns message lists where groups belong).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.compat.datafiles import scan_data_files
from atropos_cli.env.main_block import main_block_class
from atropos_cli.env.registry import resolve_env
from atropos_cli.env.shape import groups_problem, pair_problem
from atropos_cli.errors import EnvLoadError
from test_atropos_corpus import sdist_root

TWO_CLASSES = "tool_use_turnlevel_advantage_server.py"
RUBIKS = "community/selcube/rubiks_cube_environment.py"
SANSKRIT = "community/sanskrit_poetry/sanskrit_poetry_env.py"


@pytest.fixture(scope="module")
def envs() -> Path:
    return sdist_root() / "environments"


def _port(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["port", *args])
    return result.exit_code, " ".join(result.output.split())


# -- 1. a file with several env classes -----------------------------------------------------------------


def test_a_file_with_two_env_classes_runs_the_one_its_main_block_runs(envs: Path) -> None:
    path = str(envs / TWO_CLASSES)
    assert main_block_class((envs / TWO_CLASSES).read_text()) == "MultiTurnToolUseTurnLevelAdvantageEnv"
    assert resolve_env(path).__name__ == "MultiTurnToolUseTurnLevelAdvantageEnv"
    assert resolve_env(f"{path}:BaseMTGRPOEnv").__name__ == "BaseMTGRPOEnv"

    code, output = _port(path)
    assert code == 0, output
    assert "env class: MultiTurnToolUseTurnLevelAdvantageEnv, the one its __main__ block runs" in output
    code, output = _port(f"{path}:BaseMTGRPOEnv")
    assert code == 0, output
    assert "env class: BaseMTGRPOEnv (named after ':')" in output
    code, output = _port(f"{path}:MTGRPOEnv")
    assert code == 2 and f"error: {path} defines no class 'MTGRPOEnv'" in output
    assert "hint: its classes: MTGRPOEnvConfig, BaseMTGRPOEnv, MultiTurnToolUseTurnLevelAdvantageEnv" in output


def test_several_env_classes_and_no_main_block_is_one_error_naming_them(envs: Path, tmp_path: Path) -> None:
    source = (envs / TWO_CLASSES).read_text()
    head, _, _ = source.partition('if __name__ == "__main__":')
    copy = tmp_path / "two_classes.py"
    copy.write_text(head)
    with pytest.raises(EnvLoadError) as caught:
        resolve_env(str(copy))
    assert "defines several envs (BaseMTGRPOEnv, MultiTurnToolUseTurnLevelAdvantageEnv)" in caught.value.message
    assert caught.value.hint == f"pick one: {copy}:BaseMTGRPOEnv"


def test_the_main_block_may_run_the_class_through_a_function_of_the_file() -> None:
    source = "def main():\n    B.cli()\n\nif '__main__' == __name__:\n    main()\n"
    assert main_block_class(source) == "B"
    assert main_block_class("A.cli()\n") is None  # outside the block: not what `python FILE` runs


# -- 2. every server call failed ------------------------------------------------------------------------


def test_port_run_reports_every_server_call_failing_as_no_group(envs: Path, tmp_path: Path, monkeypatch) -> None:
    """On the shipped model (a 256-token context) every call of rubiks_cube fails and the env drops its group
    itself: that is a failed attempt (then the format-aware fake answers), never "it runs here"."""
    monkeypatch.chdir(tmp_path)
    code, output = _port(str(envs / RUBIKS), "--run")
    shipped = "on the shipped local model (atropos-tiny-arith): no group: every server call failed ("
    assert shipped in output and "has a context of 256 tokens" in output, output
    assert "the env filtered its group" not in output
    assert "trying the format-aware fake server" in output
    assert code == 0 and "one group ran on the format-aware fake server" in output


def test_port_run_exits_non_zero_when_every_call_to_the_named_server_failed(
    envs: Path, tmp_path: Path, monkeypatch, fake_server
) -> None:
    monkeypatch.chdir(tmp_path)
    server = fake_server(error_rate=1.0, error_status=400)
    code, output = _port(str(envs / RUBIKS), "--run", "--base-url", server.base_url)
    assert code == 1, output
    said = f"on the server at {server.base_url}: no group: every server call failed ("
    assert said in output and "injected error (HTTP 400)" in output
    assert f"error: the env produced no group: every server call failed ({server.errors_sent} errors)" in output


# -- 3. the data files an env reads ---------------------------------------------------------------------


def test_port_lists_the_data_files_an_env_reads_and_whether_each_is_there(envs: Path) -> None:
    def found(file: str) -> list[tuple[str, str, bool, str | None]]:
        return [(f.path, f.anchor, f.exists, f.run_from) for f in scan_data_files(envs / file)]

    judge = "../../Judgemark-v2/data/"  # a sibling checkout (Path(__file__).parent.parent.parent / ...)
    assert found("eval_environments/judgemark_eval.py") == [
        (judge + "judgemark_v3_samples_3_iter.json", "relative to the file", False, None),
        (judge + "judge_prompts_v3_noref_nocot_noanchor_x96.json", "relative to the file", False, None),
        (judge + "rubric_criteria.txt", "relative to the file", False, None),
        (judge + "rubric_score_anchoring.txt", "relative to the file", False, None),
    ]
    assert found("community/ufc_prediction_env/ufc_server.py") == [
        ("fighter_stats.csv", "relative to the file", True, None),  # os.path.join(os.path.dirname(__file__), ...)
        ("large_dataset.csv", "relative to the file", True, None),
    ]
    assert found("kernelbench_env/kernelbench_env.py") == [
        ("prompt.txt", "relative to the working directory", False, None)
    ]
    solitaire = "environments/community/solitaire_winning_probability/qa_data.csv"  # from the repo root
    assert found("community/solitaire_winning_probability/solitaire_server.py") == [
        (solitaire, "relative to the working directory", False, "../../..")
    ]
    # a file it only writes (open(filename, "w")) is not one it needs
    assert found("instruction_following_algorithm_environment.py") == []

    code, output = _port(str(envs / "eval_environments/judgemark_eval.py"))
    assert code == 0, output
    line = f"{envs / 'eval_environments/judgemark_eval.py'}:381: data: {judge}rubric_criteria.txt"
    assert f"{line} (relative to the file): MISSING" in output
    assert "data files missing: 4 of 4" in output
    code, output = _port(str(envs / "community/solitaire_winning_probability/solitaire_server.py"))
    assert f"{solitaire} (relative to the working directory): not beside the file; present from ../../.." in output


def test_the_data_file_scan_follows_each_way_of_opening_a_file(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "rows.csv").write_text("a\n1\n")
    (tmp_path / "prompts.json").write_text("{}")
    env = tmp_path / "env.py"
    env.write_text(
        "import json, os\nfrom pathlib import Path\nimport pandas as pd\n"
        "HERE = Path(__file__).parent\n"
        "rows = pd.read_csv(HERE / 'data' / 'rows.csv')\n"
        "prompts = json.load(open(os.path.join(os.path.dirname(__file__), 'prompts.json')))\n"
        "extra = open('extra.txt').read()\n"
        "table = pd.read_json('data/table.jsonl', lines=True)\n"
        "open('out.jsonl', 'w').write('')\n"
        "name = f'{HERE}/x.json'\n"
    )
    assert [(f.line, f.path, f.beside_file, f.exists) for f in scan_data_files(env)] == [
        (5, "data/rows.csv", True, True),
        (6, "prompts.json", True, True),
        (7, "extra.txt", False, False),
        (8, "data/table.jsonl", False, False),
    ]


# -- 4. a wrong-shaped group ----------------------------------------------------------------------------


def test_a_wrong_shaped_group_is_one_line_naming_what_was_expected(envs: Path, tmp_path: Path, monkeypatch) -> None:
    """sanskrit_poetry_env.py returns chat message lists where groups belong (and has no postprocess_histories
    to turn them into groups): one line at its collect_trajectories, not an AttributeError inside our layer."""
    monkeypatch.chdir(tmp_path)
    code, output = _port(str(envs / SANSKRIT), "--run")
    assert code == 1
    said = (
        f"EnvCodeError: {envs / SANSKRIT}:80: SanskritPoetryEnv.collect_trajectories returned a list whose item 0 "
        "is a list of 3 dicts; expected a ScoredDataGroup (a dict of tokens, masks and scores, one entry per rollout)"
    )
    assert said in output, output
    assert "AttributeError" not in output and "_send.py" not in output


def test_each_wrong_shape_names_its_field() -> None:
    assert groups_problem({"tokens": [1, 2, 3], "masks": [[1]], "scores": [1.0]}) == (
        "a group with 'tokens' as a list of 3 ints (one rollout's, not a group's); "
        "expected a list of token-id lists, one per rollout"
    )
    assert groups_problem([{"tokens": [[1]], "masks": [[1]], "scores": 1.0}]) == (
        "a list whose item 0 has 'scores' as a float; expected a list of numbers, one per rollout"
    )
    assert groups_problem({"tokens": [[1]], "masks": [[1]], "scores": [0.5]}) is None
    assert groups_problem([None, {"scores": [1]}]) is None  # missing fields are the group's validation's
    group = {"tokens": [[1]], "masks": [[1]], "scores": [1.0]}
    assert pair_problem(group, "group") == "a dict alone; expected a pair (group, backlog)"
    assert pair_problem([], "group") == "a list of 0; expected a pair (group, backlog)"
    assert pair_problem([group, group], "group") == (
        "a list of 2 dicts (two groups, no backlog); expected a pair (group, backlog)"
    )
    assert pair_problem((group, []), "group") is None and pair_problem((None, None), "group") is None
