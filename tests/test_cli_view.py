"""`atropos view` end to end: real run dirs and files in, HTML pages out, messages and exit codes, --serve."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.formats.jsonl import JsonlWriter
from atropos_cli.formats.parquet import write_parquet
from atropos_cli.types import GroupMeta, RolloutFailure, ScoredGroup

runner = CliRunner()


def group(i: int, size: int = 4) -> ScoredGroup:
    return ScoredGroup(
        scores=[float((i + r) % 2) for r in range(size)],
        messages=[
            [{"role": "user", "content": f"{i} + {i}"}, {"role": "assistant", "content": str(2 * i + r)}]
            for r in range(size)
        ],
        meta=GroupMeta(env="arithmetic", item_id=f"train-{i}"),
    )


def make_run(directory: Path, n: int, failures: int = 0) -> Path:
    with JsonlWriter(directory / "groups.jsonl") as out:
        for i in range(n):
            out.write(group(i))
    if failures:
        with JsonlWriter(directory / "failures.jsonl") as out:
            for _ in range(failures):
                out.write(RolloutFailure(kind="rollout", error_type="TimeoutError", error="no answer"))
    return directory


def card_count(html_path: Path) -> int:
    html = html_path.read_text(encoding="utf-8")
    data = re.search(r'id="atropos-data">(.*?)</script>', html, re.S).group(1)
    return len(json.loads(data)["groups"])


def test_view_a_run_dir_writes_its_index_html(tmp_path: Path) -> None:
    run = make_run(tmp_path / "runs" / "arith", 16, failures=2)
    result = runner.invoke(app, ["view", str(run)])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        f"rendered 16 groups (64 rollouts) to {run / 'index.html'}; 2 failed rollouts in failures.jsonl"
    )
    html = (run / "index.html").read_text(encoding="utf-8")
    assert card_count(run / "index.html") == 16
    assert '<div class="stat warn"><div class="n">2</div><div class="l">failed rollouts</div>' in html


def test_view_a_file_writes_stem_html_beside_it_or_to_out(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 3)
    write_parquet([group(i) for i in range(5)], tmp_path / "data" / "mine.parquet")
    result = runner.invoke(app, ["view", str(tmp_path / "data" / "mine.parquet")])
    assert result.exit_code == 0, result.output
    assert card_count(tmp_path / "data" / "mine.html") == 5
    assert "rendered 5 groups (20 rollouts)" in result.stdout
    result = runner.invoke(app, ["view", str(run / "groups.jsonl"), "--out", str(tmp_path / "o" / "page.html")])
    assert result.exit_code == 0, result.output
    assert card_count(tmp_path / "o" / "page.html") == 3 and not (run / "groups.html").exists()


def test_a_corrupt_line_is_a_warning_and_the_rest_renders(tmp_path: Path) -> None:
    run = make_run(tmp_path / "x", 20)
    lines = (run / "groups.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    lines.insert(16, '{"scores": [1.0], "messages": [[{"role": "us\n')
    (run / "groups.jsonl").write_text("".join(lines), encoding="utf-8")
    result = runner.invoke(app, ["view", str(run)])
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(f"warning: {run / 'groups.jsonl'}:17: not valid JSON (")
    assert result.stdout.strip().endswith("; skipped 1 bad line")
    assert card_count(run / "index.html") == 20


def test_several_runs_are_labelled_by_source_in_one_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    make_run(tmp_path / "runs" / "a", 2)
    make_run(tmp_path / "runs" / "b", 3)
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["view", "runs/*"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "rendered 5 groups (20 rollouts) to view.html"
    html = (tmp_path / "view.html").read_text(encoding="utf-8")
    assert "Sources (2): runs/a, runs/b" in html
    assert '<option value="1">runs/b</option>' in html
    result = runner.invoke(app, ["view", "runs/a", "runs/b/groups.jsonl", "--out", "both.html"])
    assert result.exit_code == 0 and card_count(tmp_path / "both.html") == 5


@pytest.mark.parametrize(
    ("setup", "message", "hint"),
    [
        (lambda d: None, "error: no such file or directory", "hint: pass a run directory"),
        (lambda d: d.mkdir(), "error: no groups.jsonl or groups.parquet in", "hint: pass a run directory"),
        (
            lambda d: (d.mkdir(), (d / "groups.jsonl").write_text('{"a": 1}\n')),
            "holds no scored groups",
            "failures.jsonl and SFT/DPO datasets are not rollouts",
        ),
    ],
    ids=["missing", "empty-dir", "not-rollouts"],
)
def test_no_input_or_not_rollouts_fails_with_a_hint(tmp_path: Path, setup, message: str, hint: str) -> None:
    setup(tmp_path / "run")
    result = runner.invoke(app, ["view", str(tmp_path / "run")])
    assert result.exit_code == 2  # an input error: the same code as every command's (errors.py)
    assert message in result.stderr and hint in result.stderr
    assert not (tmp_path / "run" / "index.html").exists()


def _start_serving(args: list[str]) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "COLUMNS": "200"}
    proc = subprocess.Popen(
        [sys.executable, "-c", "from atropos_cli.cli.app import main; main()", "view", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    for _ in range(5):  # the summary line, then the URL
        line = proc.stdout.readline()
        found = re.search(r"serving (http://127\.0\.0\.1:\d+/)", line)
        if found:
            return proc, found.group(1)
        if not line:
            break
    proc.kill()
    raise AssertionError(f"no URL printed; stderr: {proc.stderr.read()}")


def test_serve_renders_on_each_load_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    run = make_run(tmp_path / "run", 4)
    proc, url = _start_serving([str(run), "--serve", "--port", "0"])
    try:
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert '<div class="n" id="stat-groups">4</div>' in page.text
        with JsonlWriter(run / "groups.jsonl", append=True) as out:  # the run goes on
            out.write(group(99))
        assert '<div class="n" id="stat-groups">5</div>' in httpx.get(url, timeout=30).text
        assert httpx.get(url + "missing", timeout=30).status_code == 404
        (run / "groups.jsonl").unlink()
        assert httpx.get(url, timeout=30).status_code == 500  # inputs gone: a real error, not a stale 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
        assert "stopped" in proc.stdout.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_on_a_busy_port_fails_with_a_hint(tmp_path: Path) -> None:
    import socket

    run = make_run(tmp_path / "run", 1)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = runner.invoke(app, ["view", str(run), "--serve", "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.stderr and "--port 0" in result.stderr


def _token_only_run(directory: Path, model: str | None = None) -> tuple[Path, str]:
    """A groups file like an API batch or a ManagedServer env writes: tokens and masks, no messages, no
    config.yaml beside it; and the completion text its tokens spell."""
    from atropos_cli.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer("atropos-tiny-arith")
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "What is 4 + 4?"}], tokenize=False,
                                           add_generation_prompt=True)  # fmt: skip
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    answer_ids = tokenizer.encode("8<|end|>", add_special_tokens=False)
    tokens = prompt_ids + answer_ids
    masks = [-100] * len(prompt_ids) + answer_ids
    meta = GroupMeta(env="managed", model=model) if model else None
    path = directory / "batch.jsonl"
    with JsonlWriter(path) as out:
        out.write(ScoredGroup(tokens=[tokens, tokens], masks=[masks, masks], scores=[1.0, 0.0], meta=meta))
    return path, "8<|end|>"


def test_tokenizer_flag_decodes_token_only_groups(tmp_path: Path) -> None:
    path, answer = _token_only_run(tmp_path)
    plain = runner.invoke(app, ["view", str(path), "--out", str(tmp_path / "ids.html")])
    assert plain.exit_code == 0, plain.output
    assert "token ids" in (tmp_path / "ids.html").read_text() and answer not in (tmp_path / "ids.html").read_text()
    decoded = runner.invoke(
        app, ["view", str(path), "--tokenizer", "atropos-tiny-arith", "--out", str(tmp_path / "t.html")]
    )
    assert decoded.exit_code == 0, decoded.output
    page = (tmp_path / "t.html").read_text()
    shown = answer.replace("<", "\\u003c").replace(">", "\\u003e")  # as the page embeds its data
    assert f'"completion (decoded tokens)","{shown}"' in page and "What is 4 + 4?" in page


def test_the_groups_meta_model_decodes_without_a_flag(tmp_path: Path) -> None:
    path, answer = _token_only_run(tmp_path, model="atropos-tiny-arith")
    result = runner.invoke(app, ["view", str(path)])
    assert result.exit_code == 0, result.output
    assert "completion (decoded tokens)" in (tmp_path / "batch.html").read_text()


def test_a_tokenizer_that_cannot_be_fetched_fails_fast_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as on a machine without the hub
    path, _ = _token_only_run(tmp_path)
    result = runner.invoke(app, ["view", str(path), "--tokenizer", "no-such-org/no-such-model"])
    assert result.exit_code != 0
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines[0].startswith("error: cannot load tokenizer 'no-such-org/no-such-model'"), result.output
    assert "Traceback" not in result.output and not (tmp_path / "batch.html").exists()


def test_a_saved_api_batch_is_decoded_with_the_tokenizer(tmp_path: Path) -> None:
    """`curl API/batch > batch.json`: Atropos' `{"batch": [groups]}` reads as its groups, decoded by --tokenizer."""
    path, answer = _token_only_run(tmp_path)
    groups = [json.loads(line) for line in path.read_text().splitlines()]
    batch = tmp_path / "saved_batch.json"
    batch.write_text(json.dumps({"batch": groups * 3}) + "\n")
    result = runner.invoke(app, ["view", str(batch), "--tokenizer", "atropos-tiny-arith"])
    assert result.exit_code == 0, result.output
    assert "rendered 3 groups (6 rollouts)" in result.output
    assert "completion (decoded tokens)" in (tmp_path / "saved_batch.html").read_text()
