"""The conformance suite (issue 11, Must 6): every env file in tests/data/atropos_envs is an Atropos env
written against atroposlib 0.4.0. Each runs unmodified under atroposlib (its own venv, `python env.py
process`) and under ours (`atropos process env.py`), against fake inference servers that answer the same
prompts the same way, and the groups they write must match: tokens, masks, scores, advantages,
inference/distill logprobs, messages, overrides, group_overrides.

Needs ATROPOSLIB_PYTHON (atroposlib 0.4.0's venv, with transformers<5: 0.4.0's tokenize_for_trainer
reads apply_chat_template's result as a list of ids, which transformers 5 no longer returns). Without it,
each env still runs under ours and must write its groups.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from atropos_cli.resources import resolve_model_path
from atropos_cli.testing.fake_server import FakeInferenceServer
from atropos_conformance import (
    ENV_FILES,
    ConformanceRule,
    comparable,
    portable_tokenizer,
    reference_transformers_major,
    run_ours_in_process,
    run_reference_batch,
)
from differential import missing, venv_python

PYTHON = os.environ.get("ATROPOSLIB_PYTHON", "")
HAVE_REFERENCE = bool(PYTHON) and Path(PYTHON).exists()
GROUPS_PER_RUN = {"group_list_thinking.py": 4, "math_n_choices.py": 3, "per_rollout_letters.py": 3}
GROUPS_PER_RUN["checkpointing_env.py"] = 3


@cache
def reference_usable() -> bool:
    """atroposlib's venv is set and can run the suite (transformers<5: see the module docstring)."""
    return HAVE_REFERENCE and reference_transformers_major(PYTHON) < 5


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return portable_tokenizer(resolve_model_path("atropos-tiny-arith"), tmp_path_factory.mktemp("tok"))


@pytest.fixture
def server(tokenizer_dir: Path) -> Iterator[FakeInferenceServer]:
    with FakeInferenceServer(ConformanceRule(), tokenizer=str(tokenizer_dir)) as started:
        yield started


@pytest.fixture(scope="module")
def reference_groups(
    tokenizer_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Every env file under atroposlib 0.4.0 (one interpreter, one fake server each); their groups by file."""
    venv_python("ATROPOSLIB_PYTHON", "atroposlib 0.4.0")
    if not reference_usable():
        missing("atroposlib 0.4.0 needs transformers<5 in its venv: pip install 'transformers<5' (.ci/run does)")
    out = tmp_path_factory.mktemp("reference")
    servers = [FakeInferenceServer(ConformanceRule(), tokenizer=str(tokenizer_dir)).start() for _ in ENV_FILES]
    try:
        jobs = [(name, srv.base_url, out / name[:-3]) for name, srv in zip(ENV_FILES, servers, strict=True)]
        yield run_reference_batch(PYTHON, jobs, tokenizer_dir, out)
    finally:
        for srv in servers:
            srv.request_stop()
        for srv in servers:
            srv.stop()


@pytest.mark.atroposlib
@pytest.mark.parametrize("env_file", ENV_FILES)
def test_env_groups_match_atroposlib(
    env_file: str,
    reference_groups: dict[str, list[dict[str, Any]]],
    server: FakeInferenceServer,
    tokenizer_dir: Path,
    tmp_path: Path,
) -> None:
    expected = reference_groups[env_file]
    assert len(expected) == GROUPS_PER_RUN.get(env_file, 2), f"{env_file}: atroposlib wrote {len(expected)} groups"
    ours = run_ours_in_process(env_file, server.base_url, tokenizer_dir, tmp_path)
    assert sorted(map(comparable, ours)) == sorted(map(comparable, expected))


@pytest.mark.parametrize("env_file", ENV_FILES)
def test_env_runs_unmodified_under_atropos(
    env_file: str, server: FakeInferenceServer, tokenizer_dir: Path, tmp_path: Path
) -> None:
    if reference_usable():
        pytest.skip("the differential test runs each env under ours too")
    groups = run_ours_in_process(env_file, server.base_url, tokenizer_dir, tmp_path)
    assert len(groups) == GROUPS_PER_RUN.get(env_file, 2)
    assert all(len(g["tokens"]) == len(g["masks"]) == len(g["scores"]) and g["tokens"][0] for g in groups)


def test_comparison_sees_one_changed_mask_entry() -> None:
    group = {"tokens": [[1, 2], [3, 4]], "masks": [[-100, 2], [-100, 4]], "scores": [1.0, 0.0]}
    changed = {**group, "masks": [[-100, 2], [3, 4]]}
    reordered = {key: list(reversed(value)) for key, value in group.items()}
    assert comparable(group) != comparable(changed)
    assert comparable(group) == comparable(reordered)
