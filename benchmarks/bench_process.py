"""Throughput of `atropos process` against the fake inference server with injected latency.

Ideal groups/s = concurrency / latency / requests per group (the bundled SimpleEnvs make one request of
n = group_size per group). The table gives it for the nominal latency and for the round trip that a bare httpx
client measures against the same server (the VM's timers and HTTP add to the sleep). The fake server runs in
its own process so it does not share our GIL; it does share the machine's cores.
Atropos' `process` runs one group at a time: 4.9 groups/s at 200 ms, measured once against this fake server
(printed as a constant; this script does not run Atropos).

    python benchmarks/bench_process.py [--latency 0.2] [--concurrency 1 16 64]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from atropos_cli.env.loading import load_env
from atropos_cli.formats.jsonl import JsonlWriter
from atropos_cli.runs.rollout import run_groups
from atropos_cli.testing import free_port


def start_fake_server(latency: float) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "atropos_cli.testing.fake_server",
            "--port",
            str(port),
            "--rule",
            "arithmetic",
            "--latency",
            str(latency),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    url = proc.stdout.readline().strip()  # printed once ready
    return proc, url


async def measure(url: str, concurrency: int, groups: int, out: Path) -> float:
    loaded = load_env("arithmetic", ["--openai.base_url", url, "--env.total_steps", str(groups)], None)
    await loaded.env.setup()
    with JsonlWriter(out) as writer:

        def sink(outcome):
            for group in outcome.groups:
                writer.write(group)

        started = time.perf_counter()
        await run_groups(loaded.env, num_items=groups, concurrency=concurrency, on_outcome=sink)
        elapsed = time.perf_counter() - started
    await loaded.server.aclose()
    return elapsed


def effective_latency(url: str, rounds: int = 10) -> float:
    """The server's real round trip for one request (its sleep plus this VM's timer and HTTP overhead)."""
    import httpx

    body = {"model": "m", "messages": [{"role": "user", "content": "What is 1 + 2?"}], "n": 8, "max_tokens": 16}
    with httpx.Client() as client:
        client.post(f"{url}/chat/completions", json=body)
        started = time.perf_counter()
        for _ in range(rounds):
            client.post(f"{url}/chat/completions", json=body)
    return (time.perf_counter() - started) / rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=20, help="groups per worker")
    args = parser.parse_args()
    proc, url = start_fake_server(args.latency)
    rows = []
    measured = effective_latency(url)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            asyncio.run(measure(url, 16, 32, Path(tmp) / "warm-up.jsonl"))  # imports, connection pool
            for concurrency in args.concurrency:
                groups = concurrency * args.rounds
                elapsed = asyncio.run(measure(url, concurrency, groups, Path(tmp) / f"c{concurrency}.jsonl"))
                rows.append((concurrency, groups, elapsed, groups / elapsed))
    finally:
        proc.terminate()
        proc.wait()
    print(
        f"atropos process vs fake server: {args.latency * 1000:.0f} ms nominal latency per request "
        f"({measured * 1000:.0f} ms measured round trip with a bare httpx client), 1 request (n=8) per group"
    )
    header = f"{'concurrency':>11} {'groups':>7} {'seconds':>8} {'groups/s':>9}"
    print(f"{header} {'ideal':>7} {'% ideal':>8} {'ideal (measured)':>17} {'% of it':>8}")
    for concurrency, groups, elapsed, rate in rows:
        ideal, real = concurrency / args.latency, concurrency / measured
        print(
            f"{concurrency:>11} {groups:>7} {elapsed:>8.2f} {rate:>9.1f} {ideal:>7.1f} {100 * rate / ideal:>7.1f}%"
            f" {real:>17.1f} {100 * rate / real:>7.1f}%"
        )
    print(f"{'Atropos':>11} {'':>7} {'':>8} {4.9:>9.1f} {'':>7} {'':>8}  (one group at a time; measured once)")


if __name__ == "__main__":
    main()
