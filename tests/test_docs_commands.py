"""Every command block of the docs, as a newcomer types it (issue 38).

Each fenced shell block (bash, sh, shell, console) of README.md and docs/*.md is either run here, in a fresh
directory with the checkout's `examples/` beside it, offline, on the shipped model, and must exit 0 without an
`error:` line or a traceback and write what its `--out` flags and `# -> PATH` comments name; or it carries a
marker on the line right before its fence that says why it is not run:

    <!-- docs-test skip: needs-gpu — two GPUs of one host -->

Kinds: needs-gpu, needs-network, needs-venv (a framework's own venv), server (starts a long-running server or
needs one running), long-running (minutes on a CPU), placeholders (names the reader fills in: DIR, HOST0),
tested-by (another test runs it; the reason names its file under tests/). An unmarked block is run, so a new
block that cannot run here fails this test until it is made runnable or marked. Marked blocks are still
checked: every `atropos` flag in every block must exist in that command's own `--help`.

A page's runnable blocks run in order in one directory, so a later block may use what an earlier one wrote.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = {"bash", "sh", "shell", "console"}
KINDS = {"needs-gpu", "needs-network", "needs-venv", "server", "long-running", "placeholders", "tested-by"}
MARKER = re.compile(r"^<!-- docs-test skip: (?P<kinds>[a-z-]+(?:, [a-z-]+)*) — (?P<reason>\S.*?) -->$")
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)(?P<info>[^\n`]*)$")
BLOCK_TIMEOUT_S = 300  # a hang guard only: a block that serves forever must be marked `server`


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    kinds: tuple[str, ...]  # empty: run here
    reason: str

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    def commands(self) -> str:
        """What a reader types: a console block's `$ ` lines, any other block as it is."""
        if self.lang != "console":
            return self.text
        return "\n".join(line[2:] for line in self.text.splitlines() if line.startswith("$ "))


def _lang(info: str) -> str:
    """The block's language from its info string: `bash`, `{ .bash .x }` or `bash title="..."`."""
    words = info.strip().strip("{}").split()
    return words[0].lstrip(".") if words else ""


def page_blocks(page: Path) -> tuple[list[Block], list[str]]:
    """(the page's fenced blocks, problems found while reading it: a stray marker or an unknown kind)."""
    lines = page.read_text().splitlines()
    blocks: list[Block] = []
    problems: list[str] = []
    used_markers: set[int] = set()
    inside: set[int] = set()  # lines within fences, where a marker is an example, not a marker
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = opening["indent"], opening["fence"]
        end = next(
            (j for j in range(i + 1, len(lines)) if lines[j].strip() == fence and lines[j].startswith(indent)),
            len(lines),
        )
        body = "\n".join(line[len(indent) :] for line in lines[i + 1 : end])
        inside.update(range(i, end + 1))
        kinds: tuple[str, ...] = ()
        reason = ""
        before = i - 1
        if before >= 0 and lines[before].strip().startswith("<!-- docs-test"):
            used_markers.add(before)
            marker = MARKER.match(lines[before].strip())
            if marker is None:
                problems.append(f"{page.name}:{before + 1}: malformed marker (want {MARKER.pattern})")
            else:
                kinds, reason = tuple(marker["kinds"].split(", ")), marker["reason"]
                problems += [f"{page.name}:{before + 1}: unknown kind {k!r} (one of {sorted(KINDS)})"
                             for k in kinds if k not in KINDS]  # fmt: skip
                if "tested-by" in kinds:
                    named = re.findall(r"tests/[\w/]+\.py", reason)
                    if not named or not all((ROOT / path).is_file() for path in named):
                        problems.append(f"{page.name}:{before + 1}: tested-by names no existing tests/ file")
        blocks.append(Block(page, i + 1, _lang(opening["info"]), body, kinds, reason))
        i = end + 1
    for number, line in enumerate(lines):
        if line.strip().startswith("<!-- docs-test") and number not in used_markers | inside:
            problems.append(f"{page.name}:{number + 1}: a docs-test marker not right before a fence")
    return blocks, problems


def shell_blocks() -> list[Block]:
    return [block for page in PAGES for block in page_blocks(page)[0] if block.lang in SHELL]


def test_every_command_block_is_run_or_marked_with_a_reason():
    problems = [problem for page in PAGES for problem in page_blocks(page)[1]]
    for page in PAGES:
        for block in page_blocks(page)[0]:
            # a command written into a block without a language would escape this test
            if not block.lang and re.search(r"(?m)^(\$ |atropos |pip |python )", block.text):
                problems.append(f"{block.where}: a command block without a language (mark it ```bash)")
            if block.kinds and block.lang not in SHELL:
                problems.append(f"{block.where}: a docs-test marker on a {block.lang or 'plain'} block")
    blocks = shell_blocks()
    run = [b for b in blocks if not b.kinds]
    ran_lines = {_line(line) for b in run for line in b.commands().splitlines()} - {""}
    for block in blocks:  # "this test runs it elsewhere": some of its lines are, verbatim, in a block run here
        lines = {_line(line) for line in block.commands().splitlines()}
        if "tests/test_docs_commands.py" in block.reason and not lines & ran_lines:
            problems.append(f"{block.where}: says this test runs it, but no line of it is in a run block")
    assert problems == [], "\n".join(problems)
    assert len(blocks) >= 30 and len(run) >= 6, (len(blocks), len(run))


def _line(line: str) -> str:
    """A command line without its comment and spacing."""
    return " ".join(line.split("  #", 1)[0].split())


# ---- every atropos flag in every block exists --------------------------------------------------------


def _invocations(text: str) -> list[list[str]]:
    """Each `atropos ...` (or `-m atropos_cli ...`) command of a shell text, as its words after `atropos`."""
    found = []
    for logical in text.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(logical, comments=True)
        except ValueError:
            continue
        segment: list[str] = []
        for word in [*words, ";"]:
            if word not in {"&&", "||", ";", "|"}:
                segment.append(word)
                continue
            for start, token in enumerate(segment):
                if token == "atropos" or (token == "atropos_cli" and start and segment[start - 1] == "-m"):
                    found.append(segment[start + 1 :])
                    break
            segment = []
    return found


def _option_names(command: Any) -> set[str]:
    return {name for param in command.params for name in (*param.opts, *param.secondary_opts)}


def _unknown_flags(words: list[str]) -> list[str]:
    """The `--flags` of one invocation that its command does not declare (`--env.*`/`--openai.*` pass through
    to the env's and servers' own settings and are not checked here)."""
    from atropos_cli.cli.app import COMMANDS, load_command

    if not words or words[0].startswith("-"):
        return []
    if words[0] not in COMMANDS:
        return [f"no command {words[0]!r}"]
    command, rest = load_command(words[0]), words[1:]
    while hasattr(command, "commands") and rest and rest[0] in command.commands:  # a group: `export openenv`
        command, rest = command.commands[rest[0]], rest[1:]
    known = _option_names(command) | {"--help"}
    flags = [w.split("=", 1)[0] for w in rest if w.startswith("--")]
    return [f for f in flags if "." not in f and f not in known]


def test_every_atropos_flag_in_the_docs_exists():
    wrong = []
    for block in shell_blocks():
        for words in _invocations(block.commands()):
            wrong += [f"{block.where}: atropos {' '.join(words[:1])} {flag}" for flag in _unknown_flags(words)]
    assert wrong == [], "\n".join(wrong)


def test_the_flag_check_sees_a_wrong_flag():
    assert _invocations("X=1 atropos process --num-groups 8 \\\n  --out r  # --nope\nls | atropos view r") == [
        ["process", "--num-groups", "8", "--out", "r"],
        ["view", "r"],
    ]
    assert _unknown_flags(["process", "--num-groupz", "8", "--env.anything", "1"]) == ["--num-groupz"]
    assert _unknown_flags(["export", "openenv", "arithmetic", "--port", "0"]) == []
    assert _unknown_flags(["proces"]) == ["no command 'proces'"]


# ---- the runnable blocks run ----------------------------------------------------------------------------


def _runnable_pages() -> list[Path]:
    return [page for page in PAGES if any(b.lang in SHELL and not b.kinds for b in page_blocks(page)[0])]


def _newcomer_env() -> dict[str, str]:
    """This venv's commands first on PATH, no network: the hub offline and every proxy a closed port."""
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "PYTHONHOME", "COLUMNS"}}
    dead = "http://127.0.0.1:9"
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
        HTTP_PROXY=dead, HTTPS_PROXY=dead, http_proxy=dead, https_proxy=dead,
        NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost",
        MPLBACKEND="Agg", PIP_NO_INDEX="1",
    )  # fmt: skip
    return env


def _promised_paths(text: str) -> list[str]:
    """What a block says it writes: each `--out PATH` and each `# -> PATH` comment."""
    paths = re.findall(r"--out[ =]([^\s;&|]+)", text)
    paths += re.findall(r"#\s*->\s*([\w./-]+)", text)
    return [p.strip("'\"") for p in paths]


@pytest.mark.parametrize("page", _runnable_pages(), ids=lambda p: p.name)
def test_the_page_commands_run_as_written(page: Path, tmp_path: Path):
    for name in ("examples", "constraints.txt"):  # a checkout's files that blocks name by relative path
        (tmp_path / name).symlink_to(ROOT / name)
    env = _newcomer_env()
    for block in page_blocks(page)[0]:
        if block.lang not in SHELL or block.kinds:
            continue
        text = block.commands()
        try:
            result = subprocess.run(
                ["bash", "-e", "-o", "pipefail", "-c", text],
                cwd=tmp_path, env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S, check=False,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            pytest.fail(f"{block.where} ran past {BLOCK_TIMEOUT_S}s: make it quicker or mark it long-running/server")
        output = result.stdout + result.stderr
        context = f"{block.where}:\n{text}\n--- output ---\n{output[-3000:]}"
        assert result.returncode == 0, context
        assert "Traceback (most recent call last)" not in output, context
        assert not re.search(r"(?m)^error:", output), context
        for path in _promised_paths(text):
            assert (tmp_path / path).exists(), f"{block.where} promises {path}, not written\n{context}"
