"""Record real request/response pairs from atroposlib's `run-api` into tests/data/atroposlib/session.json.

Run with our venv's python; it starts atroposlib's server from its own venv (never our dependency):

    ATROPOSLIB_PYTHON=/tmp/atroposlib-venv/bin/python .venv/bin/python benchmarks/record_atroposlib.py

tests/test_api_app.py replays the same requests against `atropos api` and compares the answers, so the
default test run checks our wire shapes without atroposlib installed.
"""

from __future__ import annotations

import gzip
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

OUT = Path(__file__).resolve().parent.parent / "tests" / "data" / "atroposlib" / "session.json"

REGISTRATION = {
    "wandb_group": "grp", "wandb_project": "proj", "batch_size": 4, "max_token_len": 64,
    "checkpoint_dir": "ckpt", "save_checkpoint_interval": 10, "starting_step": 0, "num_steps": 100,
}  # fmt: skip
ENV = {"max_token_length": 64, "desired_name": "demo", "weight": 1.0, "group_size": 2, "min_batch_allocation": None}


def group(seed: int, size: int = 2, env_id: int | None = 0) -> dict:
    toks = [[seed, seed + 1, seed + 2 + i] for i in range(size)]
    return {
        "tokens": toks,
        "masks": [[-100, t[1], t[2]] for t in toks],
        "scores": [float(i % 2) for i in range(size)],
        "messages": [[{"role": "user", "content": f"q{seed}"}] for _ in range(size)],
        "env_id": env_id,
    }


# (name, method, path, json body, gzip the body?)
STEPS = [
    ("root", "GET", "/", None, False),
    ("info_unregistered", "GET", "/info", None, False),
    ("wandb_info_unregistered", "GET", "/wandb_info", None, False),
    ("batch_unregistered", "GET", "/batch", None, False),
    ("register", "POST", "/register", REGISTRATION, False),
    ("register_env_before_start", "POST", "/register-env", ENV, False),
    ("batch_empty", "GET", "/batch", None, False),
    ("register_env", "POST", "/register-env", ENV, False),
    ("register_env_same_name", "POST", "/register-env", ENV, False),
    ("info", "GET", "/info", None, False),
    ("wandb_info", "GET", "/wandb_info", None, False),
    ("scored_data", "POST", "/scored_data", group(10), False),
    ("scored_data_gzip", "POST", "/scored_data", group(20), True),
    ("scored_data_mixed_size", "POST", "/scored_data", group(30, size=1), False),
    ("scored_data_list", "POST", "/scored_data_list", [group(40), group(50)], False),
    ("status", "GET", "/status", None, False),
    ("status_env", "GET", "/status-env", {"env_id": 0}, False),
    ("latest_example", "GET", "/latest_example", None, False),
    ("batch", "GET", "/batch", None, False),
    ("batch_second", "GET", "/batch", None, False),
    ("status_after_batch", "GET", "/status", None, False),
    ("disconnect_env", "POST", "/disconnect-env", {"env_id": 1}, False),
    ("reset_data", "GET", "/reset_data", None, False),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_steps(base: str) -> list[dict]:
    out = []
    with httpx.Client(base_url=base, timeout=30) as client:
        for name, method, path, body, gz in STEPS:
            headers = {"Content-Type": "application/json"} if body is not None else {}
            content = None if body is None else json.dumps(body).encode()
            if gz and content is not None:
                content = gzip.compress(content)
                headers["Content-Encoding"] = "gzip"
            resp = client.request(method, path, content=content, headers=headers)
            is_json = resp.headers.get("content-type", "").startswith("application/json")
            out.append({
                "name": name, "method": method, "path": path, "request": body, "gzip": gz,
                "status": resp.status_code, "response": resp.json() if is_json else resp.text,
            })  # fmt: skip
    return out


def main() -> None:
    python = os.environ.get("ATROPOSLIB_PYTHON", "/tmp/atroposlib-venv/bin/python")
    port = free_port()
    cmd = [python, "-m", "atroposlib.cli.run_api", "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(300):
            try:
                httpx.get(base + "/", timeout=1)
                break
            except httpx.TransportError:
                time.sleep(0.1)
        exchanges = run_steps(base)
    finally:
        proc.terminate()
        proc.wait(10)
    version = subprocess.run(
        [python, "-c", "import atroposlib, importlib.metadata as m; print(m.version('atroposlib'))"],
        capture_output=True,
        text=True,
    ).stdout.strip()
    OUT.write_text(json.dumps({"atroposlib": version, "exchanges": exchanges}, indent=1) + "\n")
    print(f"wrote {len(exchanges)} exchanges from atroposlib {version} to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
