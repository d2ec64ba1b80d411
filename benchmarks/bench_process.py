"""Throughput of `atropos process` against the fake inference server with injected latency.

Ideal groups/s = concurrency / latency / requests per group (the bundled SimpleEnvs make one request of
n = group_size per group). The table gives it for the nominal latency and for the round trip that a bare httpx
client measures against the same server (the VM's timers and HTTP add to the sleep). The fake server runs in
its own process so it does not share our GIL; it does share the machine's cores, so the table also gives the
CPU each side spent per group (ours: this process; the server's: read from /proc, Linux only).
Atropos' `process` runs one group at a time: 4.9 groups/s at 200 ms, measured once against this fake server
(printed as a constant; this script does not run Atropos).

    python benchmarks/bench_process.py [--latency 0.2] [--concurrency 1 16 64] [--repeat 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
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


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process so far (None where there is no /proc)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


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


def run_rows(url: str, server_pid: int, concurrencies: list[int], rounds: int, repeat: int) -> list[tuple]:
    """(concurrency, groups, seconds, groups/s, our CPU ms/group, server CPU ms/group) per measured run."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(measure(url, 16, 32, Path(tmp) / "warm-up.jsonl"))  # imports, connection pool
        for concurrency in concurrencies:
            for _ in range(repeat):
                groups = concurrency * rounds
                ours, theirs = time.process_time(), cpu_seconds(server_pid)
                elapsed = asyncio.run(measure(url, concurrency, groups, Path(tmp) / f"c{concurrency}.jsonl"))
                ours, after = time.process_time() - ours, cpu_seconds(server_pid)
                server = (after - theirs) / groups if after is not None and theirs is not None else None
                rows.append((concurrency, groups, elapsed, groups / elapsed, ours / groups, server))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--rounds", type=int, default=20, help="groups per worker")
    parser.add_argument("--repeat", type=int, default=1, help="runs per concurrency (the spread on a busy box)")
    args = parser.parse_args()
    proc, url = start_fake_server(args.latency)
    try:
        measured = effective_latency(url)
        rows = run_rows(url, proc.pid, args.concurrency, args.rounds, args.repeat)
    finally:
        proc.terminate()
        proc.wait()
    print(
        f"atropos process vs fake server: {args.latency * 1000:.0f} ms nominal latency per request "
        f"({measured * 1000:.0f} ms measured round trip with a bare httpx client), 1 request (n=8) per group"
    )
    header = f"{'concurrency':>11} {'groups':>7} {'seconds':>8} {'groups/s':>9}"
    print(f"{header} {'ideal':>7} {'% ideal':>8} {'ideal (measured)':>17} {'% of it':>8}  CPU ms/group: ours server")
    for concurrency, groups, elapsed, rate, ours, server in rows:
        ideal, real = concurrency / args.latency, concurrency / measured
        cpu = f"{1000 * ours:>5.2f} {1000 * server:>6.2f}" if server is not None else f"{1000 * ours:>5.2f}      -"
        print(
            f"{concurrency:>11} {groups:>7} {elapsed:>8.2f} {rate:>9.1f} {ideal:>7.1f} {100 * rate / ideal:>7.1f}%"
            f" {real:>17.1f} {100 * rate / real:>7.1f}%  {cpu:>24}"
        )
    print(f"{'Atropos':>11} {'':>7} {'':>8} {4.9:>9.1f} {'':>7} {'':>8}  (one group at a time; measured once)")


if __name__ == "__main__":
    main()
