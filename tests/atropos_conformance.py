"""The conformance suite's harness: run an Atropos env file under atroposlib 0.4.0 (its own venv) and under
our CLI against the same fake inference server, and read back the groups each wrote.

- `ConformanceRule`: the fake server's answers, a function of the prompt and of how often that prompt was
  seen, so both runs get the same answers whatever order concurrent requests arrive in.
- `ENV_FLAGS`: the extra flags each env file needs (its second server, its checkpoint folder).
- `run_reference()` / `run_ours()`: one `process` run each; `comparable()` keeps what must match.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from atropos_cli.testing.format_rule import CountingRule

ENVS_DIR = Path(__file__).parent / "data" / "atropos_envs"
ENV_FILES = sorted(p.name for p in ENVS_DIR.glob("*.py"))
ENV_FLAGS: dict[str, list[str]] = {
    "managed_guess_game.py": ["--openai.server_type", "vllm"],
    "managed_branches.py": ["--openai.server_type", "vllm"],
    "judge_second_server.py": ["--env.judge_base_url", "{base_url}"],
    "teacher_distill.py": ["--env.teacher_base_url", "{base_url}"],
    "checkpointing_env.py": ["--env.ckpt_dir", "{out}/ckpts"],
}
COMPARED = (
    "tokens",
    "masks",
    "scores",
    "advantages",
    "inference_logprobs",
    "distill_token_ids",
    "distill_logprobs",
    "messages",
    "overrides",
)
_QUESTION = re.compile(r"What is (-?\d+) ([+\-*]) (-?\d+)\?")


def _arithmetic(found: re.Match[str], k: int) -> str:
    a, op, b = int(found[1]), found[2], int(found[3])
    right = a + b if op == "+" else a - b if op == "-" else a * b
    return [str(right), str(right + 1), str(right), f"maybe {right - 2}"][k % 4]


def _tools(tail: str, prompt: str, k: int) -> str | None:
    if tail.startswith("Tool result:"):
        result = re.search(r"Tool result: (-?\d+)", tail)
        return f"The answer is {result[1]}" if result and k % 2 == 0 else "Not sure."
    expression = re.search(r"compute: ([0-9+\-*]+)", tail)
    if expression is None:
        return None
    if k % 3 == 2:
        return "I will not use tools."
    call = {"name": "calculator", "arguments": {"expression": expression[1]}}
    return f"<tool_call>{json.dumps(call)}</tool_call>"


def _game(tail: str, prompt: str, k: int) -> str | None:
    if "Guess my number" in tail:
        return f"GUESS {1 + (2 * k) % 9}"
    if "Guess again" in tail:
        last = int(re.findall(r"GUESS (\d+)", prompt)[-1])
        return f"GUESS {last + (1 if 'Too low' in tail else -1) * (1 + k % 2)}"
    return None


def answer(prompt: str, k: int) -> str:
    """The scripted answer to the k-th request seen with this exact prompt."""
    tail = prompt.rsplit("<|user|>", 1)[-1]
    if "JUDGE" in tail:
        candidate = tail.split("CANDIDATE:", 1)[-1].split("<|end|>")[0].strip()
        return "VERDICT: good" if candidate.isdigit() and int(candidate) % 2 == 0 else "VERDICT: bad"
    for special in (_tools, _game):
        found = special(tail, prompt, k)
        if found is not None:
            return found
    letters = re.search(r"Count the letter '(.)' in \"(\w+)\"", tail)
    if letters:
        n = letters[2].count(letters[1])
        return str(n if k % 2 == 0 else n + 1)
    question = _QUESTION.search(tail)
    return _arithmetic(question, k) if question else f"no idea {k}"


class ConformanceRule(CountingRule):
    """A fake-server rule: `answer_fn(prompt, times this prompt was seen before)` (default: `answer`)."""

    def __init__(self, answer_fn: Callable[[str, int], str] | None = None) -> None:
        super().__init__(answer_fn or answer)


def portable_tokenizer(model_dir: str | Path, dst: Path) -> Path:
    """The shipped tokenizer in a form transformers 4 (atroposlib's venv) and 5 both read: its
    `extra_special_tokens` list becomes `additional_special_tokens`. Same vocabulary, same ids."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "chat_template.jinja"):
        if (Path(model_dir) / name).exists():
            shutil.copy(Path(model_dir) / name, dst / name)
    config = json.loads((Path(model_dir) / "tokenizer_config.json").read_text())
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        config["additional_special_tokens"] = extra
    config.pop("backend", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(config))
    return dst


def process_flags(env_file: str, base_url: str, tokenizer: Path, out: Path) -> list[str]:
    """The flags of one `process` run, the same for atroposlib's CLI and ours."""
    flags = ["--env.data_path_to_save_groups", str(out / "groups.jsonl"), "--env.use_wandb", "false"]
    flags += ["--env.tokenizer_name", str(tokenizer), "--openai.base_url", base_url, "--openai.api_key", "x"]
    flags += ["--openai.model_name", "fake-model", "--openai.tokenizer_name", str(tokenizer)]
    extra = [f.format(base_url=base_url, out=out) for f in ENV_FLAGS.get(env_file, [])]
    return flags + extra


def _run(argv: list[str], out: Path, timeout_s: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    env.pop("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", None)
    out.mkdir(parents=True, exist_ok=True)
    return subprocess.run(argv, cwd=out, env=env, capture_output=True, text=True, timeout=timeout_s)


def run_reference(python: str, env_file: str, base_url: str, tokenizer: Path, out: Path) -> list[dict[str, Any]]:
    """`python ENV.py process ...` under atroposlib 0.4.0; the groups it wrote to its jsonl."""
    argv = [python, str(ENVS_DIR / env_file), "process", *process_flags(env_file, base_url, tokenizer, out)]
    done = _run(argv, out, 90)
    assert done.returncode == 0, f"{env_file} failed under atroposlib:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return read_groups(out / "groups.jsonl")


def run_reference_batch(
    python: str, jobs: list[tuple[str, str, Path]], tokenizer: Path, out: Path
) -> dict[str, list[dict[str, Any]]]:
    """Several (env_file, base_url, out_dir) runs under atroposlib in one interpreter; their groups by env."""
    specs = [
        {"env_file": str(ENVS_DIR / name), "out": str(d), "argv": process_flags(name, url, tokenizer, d)}
        for name, url, d in jobs
    ]
    jobs_file = out / "jobs.json"
    jobs_file.write_text(json.dumps(specs))
    driver = Path(__file__).parent / "atropos_reference_driver.py"
    done = _run([python, str(driver), str(jobs_file)], out, 600)
    results = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    failed = [r for r in results if not r["ok"]]
    assert len(results) == len(jobs) and not failed, f"atroposlib runs failed: {failed or done.stderr[-3000:]}"
    return {name: read_groups(d / "groups.jsonl") for name, _, d in jobs}


def run_ours_in_process(env_file: str, base_url: str, tokenizer: Path, out: Path) -> list[dict[str, Any]]:
    """`atropos process ENV.py ...` through our Typer app in this process (the CLI code, without a new
    interpreter per env); the groups it wrote."""
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    out.mkdir(parents=True, exist_ok=True)
    args = [
        "process",
        str(ENVS_DIR / env_file),
        "--concurrency",
        "1",
        *process_flags(env_file, base_url, tokenizer, out),
    ]
    cwd = os.getcwd()
    os.chdir(out)
    try:
        result = CliRunner().invoke(app, args)
    finally:
        os.chdir(cwd)
    assert result.exit_code == 0, f"{env_file} failed under atropos:\n{result.output[-3000:]}"
    return read_groups(out / "groups.jsonl")


def run_ours(env_file: str, base_url: str, tokenizer: Path, out: Path) -> list[dict[str, Any]]:
    """`atropos process ENV.py ...` (the env file unmodified); the groups it wrote."""
    argv = [str(Path(sys.executable).parent / "atropos"), "process", str(ENVS_DIR / env_file), "--concurrency", "1"]
    done = _run(argv + process_flags(env_file, base_url, tokenizer, out), out, 90)
    assert done.returncode == 0, f"{env_file} failed under atropos:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return read_groups(out / "groups.jsonl")


def read_groups(path: Path) -> list[dict[str, Any]]:
    assert path.is_file(), f"no groups written to {path}"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def comparable(group: dict[str, Any]) -> tuple[str, list[tuple[str, ...]]]:
    """A group as its group_overrides plus the sorted per-rollout rows of the compared fields (the order of
    rollouts inside a group may differ: concurrent requests of one prompt are answered in arrival order)."""
    rows = []
    for i in range(len(group["tokens"])):
        row = []
        for key in COMPARED:
            value = group.get(key)
            item = value[i] if value else None
            if key == "scores" and isinstance(item, int):  # atroposlib writes an env's int score (0) as given,
                item = float(item)  # ours the typed float (0.0): the same score
            row.append(json.dumps(item, sort_keys=True))  # key order is no part of a message (envs build them from
            # frozensets, whose order changes with each interpreter's hash seed)
        rows.append(tuple(row))
    return json.dumps(group.get("group_overrides") or None, sort_keys=True), sorted(rows)


def reference_transformers_major(python: str) -> int:
    """The major version of transformers in atroposlib's venv (0.4.0's tokenize_for_trainer needs < 5)."""
    code = "import transformers; print(transformers.__version__.split('.')[0])"
    done = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    return int(done.stdout.strip() or 0)
