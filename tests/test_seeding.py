"""Seeded sampling: a run's --seed seeds every request, so the same seed gives the same groups."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.config import ServerConfig
from atropos_cli.inference.base import seeded_requests
from atropos_cli.inference.router import ServerManager
from atropos_cli.testing.threaded import ThreadedServer


def _groups(out: Path) -> dict[int, tuple[list[float], list[str]]]:
    lines = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    return {g["meta"]["index"]: (g["scores"], [chat[-1]["content"] for chat in g["messages"]]) for g in lines}


def test_the_same_seed_gives_the_same_groups_on_the_local_backend(tmp_path):
    def run(name: str, *flags: str) -> dict[int, tuple[list[float], list[str]]]:
        args = ["process", "arithmetic", "--out", str(tmp_path / name), "--num-groups", "6", *flags]
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0, result.output
        return _groups(tmp_path / name)

    first = run("a", "--concurrency", "6")
    again = run("b", "--concurrency", "2")  # batched differently: same samples
    assert first == again
    other = run("c", "--seed", "1")
    assert other != first


def _recording_server(bodies: list[dict]) -> ThreadedServer:
    async def chat(request: Request) -> JSONResponse:
        body = await request.json()
        bodies.append(body)
        choices = [
            {"index": i, "message": {"role": "assistant", "content": "4"}, "finish_reason": "stop"}
            for i in range(body.get("n", 1))
        ]
        return JSONResponse({"id": "x", "object": "chat.completion", "model": body["model"], "choices": choices})

    return ThreadedServer(Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])).start()


def test_requests_inside_a_group_carry_derived_seeds_to_openai_compatible_servers():
    bodies: list[dict] = []
    server = _recording_server(bodies)
    try:
        config = ServerConfig(base_url=f"{server.url}/v1", server_type="openai", model_name="m")

        async def ask(key: str) -> None:
            manager = ServerManager([config])
            try:
                with seeded_requests(0, key):
                    for _ in range(2):
                        await manager.chat_completion(messages=[{"role": "user", "content": "2+2?"}], n=2)
                await manager.chat_completion(messages=[{"role": "user", "content": "2+2?"}])  # outside: unseeded
                with seeded_requests(0, key):
                    await manager.chat_completion(messages=[{"role": "user", "content": "2+2?"}], seed=7)
            finally:
                await manager.aclose()

        asyncio.run(ask("3:item-3"))
        asyncio.run(ask("3:item-3"))
        asyncio.run(ask("4:item-4"))
    finally:
        server.stop()
    seeds = [body.get("seed") for body in bodies]
    first, again, other = seeds[0:4], seeds[4:8], seeds[8:12]
    assert first == again and first[0] != first[1] and other[:2] != first[:2]
    assert first[2] is None and first[3] == 7  # no group, no seed; an explicit seed wins
    assert all(s is None or 0 <= s < 2**63 for s in seeds)
