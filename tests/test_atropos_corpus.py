"""Atropos' whole env corpus (issue 20, Must 1): every file in atroposlib 0.4.0's `environments/` that imports
atroposlib (142 files), from its sdist (`pip download --no-binary :all: --no-deps atroposlib==0.4.0`: .ci/run
fetches it into $ATROPOSLIB_SDIST; never committed, never downloaded by a test), is constructed under our layer
the way `atropos process FILE` does before its first request: import, `config_init()`, the class built with its
configs (tests/atropos_corpus_driver.py).

- Every file constructs, has no env class (a helper, a launcher, a test), or is listed in EXPECTED with the
  reason and the text of its one-line error. The count is the docs' (docs/envs-atropos.md, checked below).
- With atroposlib 0.4.0's venv (ATROPOSLIB_PYTHON, as CI builds it) the same driver constructs each file under
  the real atroposlib (results cached under /tmp: neither side of that run changes with our code), and every
  file that atroposlib constructs must construct under ours. The files atroposlib itself cannot load are
  checked against BROKEN_UPSTREAM.

Datasets loaded by name at construction get stand-in rows (tests/atropos_corpus_data.py); judges' API-key
variables are set to a dummy, as a user with keys would have them.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from atropos_cli.resources import resolve_model_path
from atropos_conformance import portable_tokenizer
from differential import missing, venv_python

CACHE = Path(os.environ.get("ATROPOS_CORPUS_CACHE", "/tmp/atropos-corpus-cache"))
SDIST = Path(os.environ.get("ATROPOSLIB_SDIST", str(CACHE / "atroposlib-0.4.0.tar.gz")))
DRIVER = Path(__file__).parent / "atropos_corpus_driver.py"
PYTHON = os.environ.get("ATROPOSLIB_PYTHON", "")
TOTAL_FILES = 142
# docs/envs-atropos.md's number: files whose env classes all construct under `atropos process` (atroposlib: 68)
CONSTRUCTED = 89

_PKG = "not installed by atropos[atroposlib]: "
# file -> (why, a text its one-line error must contain). Every file not listed constructs or has no env class.
EXPECTED: dict[str, tuple[str, str]] = {
    "code_execution_server/coding_server.py": (_PKG + "modal (a hosted sandbox)", "no module named 'modal'"),
    "community/openvla_robotics/open_robot_env.py": (_PKG + "robosuite (a simulator)", "'robosuite'"),
    "community/options_iv_prediction/options_iv_prediction.py": (_PKG + "yahooquery (market data)", "'yahooquery'"),
    "community/pay_to_play/pay_to_play_env.py": (_PKG + "eth-account (a wallet)", "pip install eth-account"),
    "community/physical_space_stl/physical_env.py": (_PKG + "trimesh", "'trimesh'"),
    "community/playwright_agent_env.py": (_PKG + "playwright (a browser)", "'playwright'"),
    "community/pokemon-showdown/pokemon_env_self_play.py": (_PKG + "poke-env (a game server)", "pip install poke-env"),
    "community/pokemon-showdown/pokemon_environment.py": (_PKG + "poke-env (a game server)", "pip install poke-env"),
    "community/quantum_hybrid/atopos_quant.py": (_PKG + "pennylane", "'pennylane'"),
    "community/quantum_hybrid/atropos.py": (_PKG + "pennylane", "'pennylane'"),
    "community/wikipedia_research/run_with_openai.py": (_PKG + "smolagents", "'smolagents'"),
    "community/wikipedia_research/wikipedia_article_creator.py": (_PKG + "smolagents", "'smolagents'"),
    "smolagents_integration/smolagents_env.py": (_PKG + "smolagents", "'smolagents'"),
    "eval_environments/verifiers_eval.py": (_PKG + "verifiers (pins its own stack)", "'verifiers'"),
    "verifiers_server.py": (_PKG + "verifiers (pins its own stack)", "'verifiers'"),
    "game_environments/textworld_env/textworld_env.py": (_PKG + "textworld (a game engine)", "'textworld'"),
    "game_environments/textworld_env/textworld_local_server.py": (_PKG + "textworld", "'textworld'"),
    "infinimath/infinimath_env.py": (_PKG + "mathgenerator", "'mathgenerator'"),
    "infinimath/infinimath_local_server.py": (_PKG + "mathgenerator", "'mathgenerator'"),
    # code the sdist does not ship (git submodules, sibling repos, modules left out of the upload)
    "community/bleuberi/bleuberi_env.py": ("the sdist lacks its sibling module `training`", "'training'"),
    "community/pytorch_optimizer_coding/optimizer_benchmark_environmenr.py": ("imports `atropos`", "'atropos'"),
    "community/pytorch_optimizer_coding/run_optimizer_benchmark.py": ("imports a package `atropos`", "'atropos'"),
    "community/selcube/test_rubiks_cube.py": ("the sdist lacks rubiks_cube_visualizer", "'rubiks_cube_visualizer'"),
    "kernelbench_env/kernelbench_env.py": ("needs the KernelBench checkout (`src.eval`)", "no module named 'src"),
    "game_environments/diplomacy_environment/diplomacy_env_minimal.py": ("AI_Diplomacy submodule", "AI_Diplomacy"),
    "game_environments/diplomacy_environment/diplomacy_local_server.py": ("AI_Diplomacy submodule", "AI_Diplomacy"),
    # names atroposlib 0.4.0 itself lacks (these files fail the same way under it)
    "community/conversational_style_dpo/conversational_style_dpo_env.py": (
        "atroposlib 0.4.0 lacks tokenize_for_trainer_dpo", "has no 'tokenize_for_trainer_dpo'"),
    "community/ufc_prediction_env/ufc_image_env.py": ("atroposlib 0.4.0 lacks OpenaiConfig", "has no 'OpenaiConfig'"),
    "community/ufc_prediction_env/ufc_server.py": ("atroposlib 0.4.0 lacks OpenaiConfig", "has no 'OpenaiConfig'"),
    "sft_loader_server.py": ("atroposlib 0.4.0 lacks OpenaiConfig", "has no 'OpenaiConfig'"),
    # broken in the file itself (the same error under atroposlib 0.4.0)
    "community/dynastai/src/web/api.py": ("a relative import above its package", "relative import beyond"),
    "community/starmap_compression/starmap_compression.py": ("__init__ takes no `config=`", "argument 'config'"),
    "community/xitter_env/xitter_env.py": ("a @dataclass config missing its fields", "missing 13 required"),
    "dataset_environment/launch_local_dataset_run.py": ("a launcher that exits at import", "SystemExit"),
    "eval_environments/mixeval_eval.py": ("config_init returns a config without its judge fields", "judge_api_key_env"),
    "eval_environments/mtbench_eval.py": ("config_init returns a config without its judge fields", "judge_api_key_env"),
}  # fmt: skip
# files atroposlib 0.4.0 itself cannot construct, by the cause its error names (`python FILE process` fails there)
BROKEN_UPSTREAM = {
    "unexpected keyword argument 'slurm'": "its __init__ takes slurm_job_id; atroposlib's CLI passes slurm=",
    "Can't instantiate abstract class": "it does not implement an abstract method (evaluate, get_next_item)",
    "cannot import name 'OpenaiConfig'": "atroposlib 0.4.0 has no OpenaiConfig",
    "cannot import name 'tokenize_for_trainer_dpo'": "atroposlib 0.4.0 has no tokenize_for_trainer_dpo",
}


def sdist_root() -> Path:
    """atroposlib 0.4.0's sdist (.ci/run fetches it into $ATROPOSLIB_SDIST; the tests never download), unpacked
    once under CACHE."""
    root = CACHE / "atroposlib-0.4.0"
    if (root / "environments").is_dir():
        return root
    if not SDIST.is_file():
        missing(
            f"atroposlib 0.4.0's sdist is not at {SDIST}: `pip download --no-binary :all: --no-deps "
            f"atroposlib==0.4.0 -d {SDIST.parent}` (.ci/run does), or point ATROPOSLIB_SDIST at it"
        )
    CACHE.mkdir(parents=True, exist_ok=True)
    with tarfile.open(SDIST) as tar:
        tar.extractall(CACHE, filter="data")
    return root


def corpus_files(root: Path) -> list[str]:
    envs = root / "environments"
    return sorted(str(p.relative_to(envs)) for p in envs.rglob("*.py") if "atroposlib" in p.read_text(errors="ignore"))


def run_driver(python: str, args: list[str], files: list[str], chunks: int = 2) -> dict[str, dict[str, Any]]:
    """The driver over `files` in `chunks` parallel processes; its JSON lines by file."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env.update(WANDB_MODE="disabled", ATROPOS_VERBOSE="")

    def one(part: list[str]) -> str:
        argv = [python, str(DRIVER), *args, *part]
        return subprocess.run(argv, capture_output=True, text=True, timeout=900, env=env, cwd=CACHE).stdout

    parts = [files[i::chunks] for i in range(chunks)]
    with ThreadPoolExecutor(chunks) as pool:
        lines = [line for out in pool.map(one, parts) for line in out.splitlines() if line.startswith("{")]
    results = {r["file"]: r for r in map(json.loads, lines)}
    assert set(results) == set(files), f"the driver gave no result for {sorted(set(files) - set(results))}"
    return results


def reference_usable() -> bool:
    if not PYTHON or not Path(PYTHON).exists():
        return False
    done = subprocess.run([PYTHON, "-c", "import atroposlib"], capture_output=True, timeout=120)
    return done.returncode == 0


@pytest.fixture(scope="module")
def corpus() -> tuple[Path, Path, list[str]]:
    root = sdist_root()
    tokenizer = portable_tokenizer(resolve_model_path("atropos-tiny-arith"), CACHE / "tokenizer")
    return root, tokenizer, corpus_files(root)


@pytest.fixture(scope="module")
def ours(corpus: tuple[Path, Path, list[str]]) -> dict[str, dict[str, Any]]:
    root, tokenizer, files = corpus
    return run_driver(sys.executable, ["--ours", str(root), str(tokenizer)], files)


@pytest.fixture(scope="module")
def reference(corpus: tuple[Path, Path, list[str]]) -> dict[str, dict[str, Any]]:
    """The corpus under the real atroposlib 0.4.0, cached by the driver's and its data's content."""
    venv_python("ATROPOSLIB_PYTHON", "atroposlib 0.4.0")
    if not reference_usable():
        missing(f"{PYTHON} cannot import atroposlib: rebuild atroposlib 0.4.0's venv (.ci/run builds it)")
    root, tokenizer, files = corpus
    key = hashlib.sha256(DRIVER.read_bytes() + (DRIVER.parent / "atropos_corpus_data.py").read_bytes()).hexdigest()
    cached = CACHE / f"reference-{key[:16]}.json"
    if cached.is_file():
        return json.loads(cached.read_text())
    results = run_driver(PYTHON, [str(root), str(tokenizer)], files)
    cached.write_text(json.dumps(results))
    return results


def test_the_corpus_is_the_one_counted(corpus: tuple[Path, Path, list[str]]) -> None:
    files = corpus[2]
    assert len(files) == TOTAL_FILES
    assert set(EXPECTED) <= set(files)


def test_every_env_file_constructs_under_atropos(ours: dict[str, dict[str, Any]]) -> None:
    surprises = []
    for file, result in sorted(ours.items()):
        error = result["error"] or ""
        ok = EXPECTED[file][1] in error if file in EXPECTED else result["status"] in ("ok", "no-env")
        if not ok:
            surprises.append(f"{file}: {result['status']} {error}")
    assert not surprises, "\n".join(surprises)
    constructed = sum(r["status"] == "ok" for r in ours.values())
    assert constructed >= CONSTRUCTED, f"{constructed} of {TOTAL_FILES} construct; the docs say {CONSTRUCTED}"


def test_every_error_is_one_line_naming_the_file_and_line(ours: dict[str, dict[str, Any]]) -> None:
    """A load error is our one line: the env file, its line, the missing name or the package to install."""
    for file, result in ours.items():
        error = result["error"] or ""
        if error.startswith("EnvLoadError") and "no module named" in error:
            assert f"{file}:" in error and ("hint: pip install" in error or "env surface" in error), error
        assert "\n" not in error


def test_what_atroposlib_constructs_ours_constructs(
    ours: dict[str, dict[str, Any]], reference: dict[str, dict[str, Any]]
) -> None:
    lost = [
        f"{file}: {ours[file]['error']}"
        for file, result in reference.items()
        if result["status"] == "ok" and ours[file]["status"] != "ok"
    ]
    assert not lost, "\n".join(lost)
    for file, (why, _) in EXPECTED.items():
        if why.startswith("atroposlib 0.4.0 lacks"):
            assert "cannot import name" in (reference[file]["error"] or ""), f"{file}: {reference[file]}"
    upstream = {
        cause: sorted(f for f, r in reference.items() if cause in (r["error"] or "")) for cause in BROKEN_UPSTREAM
    }
    assert all(upstream.values()), f"a documented atroposlib breakage no longer shows: {upstream}"


def test_the_docs_state_the_constructed_count():
    """docs/envs-atropos.md's corpus count is CONSTRUCTED of TOTAL_FILES (this file checks the count itself)."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "envs-atropos.md").read_text()
    assert f"**{CONSTRUCTED} of {TOTAL_FILES} construct**" in page
