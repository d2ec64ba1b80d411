"""Load test of the trajectory API: `atropos api` (durable, --state-dir) and, in the same run, atroposlib's
`run-api` when its venv exists (ATROPOSLIB_PYTHON, default /tmp/atroposlib-venv/bin/python).

    .venv/bin/python benchmarks/bench_api.py [--producers 8] [--seconds 10] [--depths 1000,5000,10000]

Phase 1 (throughput): K producers POST gzip'd groups of 8 x 512 tokens to /scored_data as fast as they can
while one trainer pulls batches of 64 sequences; reports groups/s in, sequences/s out, p50/p99 of POST and
GET /batch. Phase 2 (depth): for each depth, a fresh server is filled to that many groups with no trainer
pulling (posting lists of 16 groups); then GET /batch is timed (first call and p50/p99 of 20) and the RSS
read (bytes per queued token = RSS growth while filling / queued tokens).
Every server runs as a subprocess on 127.0.0.1 with a free port and is stopped at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import gzip
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson

GROUP, SEQ_LEN, BATCH = 8, 512, 64
REG = {
    "wandb_group": "bench", "wandb_project": "bench", "batch_size": BATCH, "max_token_len": 4096,
    "checkpoint_dir": "ckpt", "save_checkpoint_interval": 1000, "starting_step": 0, "num_steps": 10**6,
}  # fmt: skip


def make_group(rng: random.Random) -> dict:
    tokens = [[rng.randrange(150_000) for _ in range(SEQ_LEN)] for _ in range(GROUP)]
    masks = [[-100] * 128 + t[128:] for t in tokens]
    return {"tokens": tokens, "masks": masks, "scores": [rng.choice([0.0, 1.0]) for _ in range(GROUP)]}


def bodies(n: int, per_request: int = 1) -> list[bytes]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        groups = [make_group(rng) for _ in range(per_request)]
        out.append(gzip.compress(orjson.dumps(groups[0] if per_request == 1 else groups), compresslevel=1))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


class RawHttp:
    """A minimal keep-alive HTTP/1.1 client: the load generator must cost far less CPU than the server it
    measures (httpx spends ~1 ms of CPU per request, which on 2 cores would cap what we can observe)."""

    def __init__(self, url: str) -> None:
        self.host, self.port = url.removeprefix("http://").split(":")
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def request(self, method: str, path: str, body: bytes = b"", gz: bool = False) -> tuple[int, bytes]:
        if self.writer is None:
            self.reader, self.writer = await asyncio.open_connection(self.host, int(self.port))
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
        head += "Content-Type: application/json\r\n" + ("Content-Encoding: gzip\r\n" if gz else "") + "\r\n"
        self.writer.write(head.encode() + body)
        assert self.reader is not None
        raw = await self.reader.readuntil(b"\r\n\r\n")
        status = int(raw.split(b" ", 2)[1])
        length, chunked = 0, False
        for line in raw.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line.split(b":")[1])
            chunked = chunked or line.startswith(b"transfer-encoding: chunked")
        if not chunked:
            return status, await self.reader.readexactly(length)
        parts = []
        while size := int((await self.reader.readuntil(b"\r\n")).strip(), 16):
            parts.append(await self.reader.readexactly(size))
            await self.reader.readexactly(2)
        await self.reader.readexactly(2)
        return status, b"".join(parts)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


@dataclass
class Target:
    name: str
    cmd: list[str]
    state_dir: str | None = None
    proc: subprocess.Popen | None = None
    url: str = ""
    results: dict = field(default_factory=dict)

    def start(self) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        if self.state_dir:
            shutil.rmtree(self.state_dir, ignore_errors=True)
        cmd = [c.replace("{port}", str(port)) for c in self.cmd]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(300):
            try:
                httpx.get(self.url + "/", timeout=1)
                return
            except httpx.TransportError:
                time.sleep(0.1)
        raise RuntimeError(f"{self.name} did not start: {cmd}")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] * 1000


async def throughput(url: str, producers: int, seconds: float, payloads: list[bytes]) -> dict:
    post_lat: list[float] = []
    get_lat: list[float] = []
    delivered = accepted = 0
    stop_at = time.perf_counter() + seconds
    async with httpx.AsyncClient(base_url=url, timeout=60) as client:
        await client.post("/register", json=REG)
        await client.get("/batch")

    async def producer(i: int) -> None:
        nonlocal accepted
        http, k = RawHttp(url), i
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            status, _ = await http.request("POST", "/scored_data", payloads[k % len(payloads)], gz=True)
            post_lat.append(time.perf_counter() - t0)
            if status == 200:
                accepted += 1
            elif status == 503:
                await asyncio.sleep(0.05)
            k += producers
        await http.close()

    async def trainer() -> None:
        nonlocal delivered
        http = RawHttp(url)
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            _, body = await http.request("GET", "/batch")
            get_lat.append(time.perf_counter() - t0)
            batch = orjson.loads(body).get("batch")
            if batch:
                delivered += sum(len(g["tokens"]) for g in batch)
            else:
                await asyncio.sleep(0.01)
        await http.close()

    start = time.perf_counter()
    await asyncio.gather(trainer(), *(producer(i) for i in range(producers)))
    elapsed = time.perf_counter() - start
    return {
        "ingest_groups_s": accepted / elapsed,
        "accepted": accepted,
        "delivered_seqs_s": delivered / elapsed,
        "post_p50_ms": pct(post_lat, 0.5),
        "post_p99_ms": pct(post_lat, 0.99),
        "get_p50_ms": pct(get_lat, 0.5),
        "get_p99_ms": pct(get_lat, 0.99),
    }


async def depth(target: Target, d: int, list_bodies: list[bytes]) -> dict:
    """On a freshly started server: fill to `d` groups, then time 20 GET /batch and read RSS."""
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
    async with httpx.AsyncClient(base_url=target.url, timeout=120) as client:
        await client.post("/register", json=REG)
        baseline = rss_mib(target.proc.pid)  # type: ignore[union-attr]
        queued, k = 0, 0
        sem = asyncio.Semaphore(4)

        async def post(body: bytes) -> None:
            async with sem:
                (await client.post("/scored_data_list", content=body, headers=headers)).raise_for_status()

        while queued < d:
            n = min(64, (d - queued + 15) // 16)
            await asyncio.gather(*(post(list_bodies[(k + j) % len(list_bodies)]) for j in range(n)))
            k += n
            queued += 16 * n
        full_rss = rss_mib(target.proc.pid)  # type: ignore[union-attr]
        lat = []
        for _ in range(20):
            t0 = time.perf_counter()
            batch = (await client.get("/batch")).json()["batch"]
            lat.append(time.perf_counter() - t0)
            assert batch and sum(len(g["tokens"]) for g in batch) == BATCH
    return {
        "first_ms": lat[0] * 1000,
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
        "rss_mib": full_rss,
        "bytes_per_token": (full_rss - baseline) * 2**20 / (queued * GROUP * SEQ_LEN),
    }


def report(targets: list[Target], producers: int, seconds: float) -> str:
    lines = [f"## Throughput: {producers} producers x {seconds:.0f} s, groups of {GROUP}x{SEQ_LEN}, batches of {BATCH}"]
    lines.append(
        "| server | ingest groups/s | delivered seq/s | POST p50/p99 ms | GET /batch p50/p99 ms | server CPU ms/group |"
    )
    lines.append("|---|---|---|---|---|---|")
    for t in targets:
        r = t.results["throughput"]
        lines.append(
            f"| {t.name} | {r['ingest_groups_s']:.0f} | {r['delivered_seqs_s']:.0f} | "
            f"{r['post_p50_ms']:.1f} / {r['post_p99_ms']:.1f} | {r['get_p50_ms']:.1f} / {r['get_p99_ms']:.1f} | "
            f"{r['server_cpu_ms_per_group']:.2f} |"
        )
    lines.append("")
    lines.append("## GET /batch with N groups queued (no trainer pulling while filling)")
    lines.append("| server | queued | first GET ms | GET p50 / p99 ms | RSS MiB | RSS bytes per queued token |")
    lines.append("|---|---|---|---|---|---|")
    for t in targets:
        for d, r in t.results["depth"].items():
            lines.append(
                f"| {t.name} | {d} | {r['first_ms']:.1f} | {r['p50_ms']:.1f} / {r['p99_ms']:.1f} | "
                f"{r['rss_mib']:.0f} | {r['bytes_per_token']:.1f} |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--producers", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--depths", default="1000,5000,10000")
    ap.add_argument("--skip-atroposlib", action="store_true")
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    tmp = tempfile.mkdtemp(prefix="bench-api-")
    cli = "from atropos_cli.cli.app import main; main()"
    state = os.path.join(tmp, "state")
    ours = [sys.executable, "-c", cli, "api", "--port", "{port}", "--state-dir", state, "--status-every", "0",
            "--max-queue-groups", str(max(depths) + 2000)]  # fmt: skip
    targets = [Target("atropos api (durable)", ours, state_dir=state)]
    theirs = os.environ.get("ATROPOSLIB_PYTHON", "/tmp/atroposlib-venv/bin/python")
    if not args.skip_atroposlib and Path(theirs).exists():
        cmd = [theirs, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", "{port}"]
        targets.append(Target("atroposlib 0.4.0 run-api", cmd))
    single, lists = bodies(64), bodies(16, per_request=16)
    try:
        for t in targets:
            t.start()
            print(f"running {t.name} ...", file=sys.stderr)
            cpu0 = cpu_s(t.proc.pid)  # type: ignore[union-attr]
            t.results["throughput"] = asyncio.run(throughput(t.url, args.producers, args.seconds, single))
            used = cpu_s(t.proc.pid) - cpu0  # type: ignore[union-attr]
            t.results["throughput"]["server_cpu_ms_per_group"] = (
                used * 1000 / max(1, t.results["throughput"]["accepted"])
            )
            t.stop()
            t.results["depth"] = {}
            for d in depths:  # a fresh server per depth: the first GET then really forms from d queued groups
                t.start()
                t.results["depth"][d] = asyncio.run(depth(t, d, lists))
                t.stop()
    finally:
        for t in targets:
            t.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print(report(targets, args.producers, args.seconds))


if __name__ == "__main__":
    main()
