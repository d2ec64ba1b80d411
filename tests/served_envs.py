"""Helpers of the served-env adapters' tests (openenv:, ors:): `atropos process` in this process, waiting for an
exported server, and token faithfulness of a multi-turn group (each rollout's trained tokens are its replies,
one run of unmasked tokens per assistant message, in order)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.tokens import MASKED


def process(args: list[str], out: Path, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """`atropos process ...` through our Typer app in this process; the groups it wrote."""
    result = CliRunner().invoke(app, ["process", *args, "--out", str(out)], env=env)
    assert result.exit_code == 0, result.output[-3000:]
    return [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]


def wait_for_export(server: subprocess.Popen, port: int, timeout_s: float = 120) -> None:
    """Poll `atropos export openenv`'s /health until it answers; fail if the process exits or time runs out."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert server.poll() is None and time.monotonic() < deadline, "export did not come up"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.1)  # polling a starting process, bounded by the deadline


def trained_segments(tokens: list[int], masks: list[int]) -> list[list[int]]:
    """The runs of trained (unmasked) tokens: one per model reply."""
    segments: list[list[int]] = []
    previous_masked = True
    for token, mask in zip(tokens, masks, strict=True):
        if mask != MASKED:
            if previous_masked:
                segments.append([])
            segments[-1].append(token)
            assert mask == token
        previous_masked = mask == MASKED
    return segments


def tokenizer() -> Any:
    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import DEFAULT_MODEL

    return load_tokenizer(DEFAULT_MODEL)


def assert_faithful(group: dict[str, Any]) -> None:
    """Each rollout's trained tokens are its replies, one segment per assistant message, in order."""
    tok = tokenizer()
    for tokens, masks, chat in zip(group["tokens"], group["masks"], group["messages"], strict=True):
        replies = [m["content"] for m in chat if m["role"] == "assistant"]
        segments = trained_segments(tokens, masks)
        assert len(segments) == len(replies)
        for segment, reply in zip(segments, replies, strict=True):
            assert tok.decode(segment, skip_special_tokens=True).strip() == reply.strip()


def assert_one_line_errors(cases: dict[str, str], tmp_path: Path) -> None:
    """Each `process SPEC` of `cases` (spec -> the message it must print) is refused with one error line, exit 2,
    before any model loads, and writes nothing."""
    for spec, message in cases.items():
        args = ["process", *spec.split(), "--num-groups", "1", "--out", str(tmp_path / "x")]
        result = CliRunner().invoke(app, args, env={"COLUMNS": "300"})
        assert result.exit_code == 2 and message in result.output, (spec, result.output)
        assert "Traceback" not in result.output and "local backend" not in result.output
        assert not (tmp_path / "x" / "groups.jsonl").exists()
