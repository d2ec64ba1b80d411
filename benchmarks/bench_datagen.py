"""Benchmark `atropos sft-gen` / `dpo-gen`: groups/s and peak RSS from jsonl and parquet, at two input sizes.

    .venv/bin/python benchmarks/bench_datagen.py --sizes 20000,100000 [--work /tmp/bench-datagen]
    .venv/bin/python benchmarks/bench_datagen.py --atroposlib /tmp/atroposlib-venv --atroposlib-groups 2000

Builds N groups of 8 rollouts (~300 tokens of text each: a ~50-token prompt, a ~250-token completion, every
completion distinct) as groups.jsonl and groups.parquet, then runs each command as a subprocess on each file
and reads its peak RSS from wait4(). Streaming shows as a peak RSS that stays flat when N grows 5x.

`--atroposlib VENV` also times Atropos' own `atropos-sft-gen` end to end: its `run-api` on a free port, the
same groups posted with token ids, and its sft-gen (a fake trainer polling GET /batch) until it has saved
every record; it prints records/s for both tools and the ratio. atroposlib lives in its own venv outside the
repo (python3 -m venv VENV && VENV/bin/pip install atroposlib==0.4.0); it is never our dependency.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_SCRIPT = Path(sys.executable).parent / "atropos"
# The console script when installed; else the same entry point through the interpreter (PYTHONPATH=src).
ATROPOS = [str(_SCRIPT)] if _SCRIPT.exists() else [sys.executable, "-c", "from atropos_cli.cli.app import main; main()"]
WORDS = [f"w{i}" for i in range(3000)] + ["the", "a", "is", "of", "and", "so", "answer", "=", "+", "-"]


def _texts(n: int, words: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choices(WORDS, k=words)) for _ in range(n)]


def _records(n_groups: int, size: int):
    """Yield ScoredGroup-shaped dicts: tokens-free (like `atropos process` without a tokenizer)."""
    prompts, completions = _texts(997, 38, 1), _texts(4999, 190, 2)
    rng = random.Random(0)
    for g in range(n_groups):
        prompt = f"Question {g}: {prompts[g % len(prompts)]}"
        chats = [
            [
                {"role": "system", "content": "Think, then answer."},
                {"role": "user", "content": prompt},
                {"role": "assistant", "content": f"[{g}.{r}] {completions[(g * size + r) % len(completions)]}"},
            ]
            for r in range(size)
        ]
        scores = [rng.choice((0.0, 0.0, 0.25, 0.5, 1.0)) for _ in range(size)]
        meta = {"group_id": f"g{g}", "env": "bench", "model": "bench-model", "item_id": f"train-{g}"}
        yield {"scores": scores, "messages": chats, "meta": meta}


def build(work: Path, n_groups: int, size: int) -> Path:
    """Write groups.jsonl and groups.parquet for n_groups (kept between runs)."""
    from atropos_cli.formats.parquet import write_parquet
    from atropos_cli.types import ScoredGroup

    directory = work / f"groups-{n_groups}x{size}"
    if (directory / "groups.parquet").exists():
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(directory / "groups.jsonl", "w", encoding="utf-8") as handle:
        for record in _records(n_groups, size):
            handle.write(json.dumps(record, ensure_ascii=False) + "\n")
    write_parquet((ScoredGroup.model_validate(r) for r in _records(n_groups, size)), directory / "groups.parquet")
    mb = {p.suffix: p.stat().st_size / 2**20 for p in directory.iterdir()}
    print(
        f"built {n_groups} groups in {time.perf_counter() - start:.0f}s: "
        f"jsonl {mb['.jsonl']:.0f} MiB, parquet {mb['.parquet']:.0f} MiB",
        flush=True,
    )
    return directory


def measure(argv: list[str]) -> tuple[float, float, float, str]:
    """(wall seconds, CPU seconds, peak RSS MiB, stdout) of one subprocess."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=ROOT, text=True)
    output = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"command failed ({proc.returncode}): {' '.join(argv)}\n{output}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, output


def _rows_written(output: str) -> int:
    line = next(line for line in output.splitlines() if line.strip().startswith(("rows written", "pairs written")))
    return int(line.split()[-1])


def run_ours(work: Path, sizes: list[int], size: int) -> None:
    print("| groups | input | command | wall s | CPU s | groups/s | rows written | peak RSS MiB |", flush=True)
    print("|---:|---|---|---:|---:|---:|---:|---:|")
    for n in sizes:
        directory = build(work, n, size)
        for suffix in ("parquet", "jsonl"):
            for command in ("sft-gen", "dpo-gen"):
                out = work / "out" / f"{command}-{n}-{suffix}"
                argv = [*ATROPOS, command, str(directory / f"groups.{suffix}"), "--out", str(out), "--overwrite"]
                seconds, cpu, rss, output = measure(argv)
                print(
                    f"| {n} | {suffix} | {command} | {seconds:.1f} | {cpu:.1f} | {n / seconds:,.0f} | "
                    f"{_rows_written(output):,} | {rss:.0f} |",
                    flush=True,
                )


_TOKENIZER_SCRIPT = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
words = ["<unk>", "<eos>"] + [f"w{i}" for i in range(3000)]
backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>").save_pretrained(sys.argv[1])
"""


def _wire_groups(n_groups: int, size: int) -> list[dict]:
    """The benchmark groups as Atropos ScoredData (APIs need token ids: ~300 per rollout, first 50 masked)."""
    rng = random.Random(5)
    out = []
    for record in _records(n_groups, size):
        tokens = [[rng.randrange(2, 3002) for _ in range(300)] for _ in range(size)]
        masks = [[-100] * 50 + t[50:] for t in tokens]
        out.append({"tokens": tokens, "masks": masks, "scores": record["scores"], "messages": record["messages"]})
    return out


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_registered(url: str, proc: subprocess.Popen, timeout: float = 120.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the trainer process exited early ({proc.returncode})")
        try:
            if httpx.get(f"{url}/info", timeout=2).json().get("batch_size", -1) > 0:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"nobody registered at {url} within {timeout}s")


def _post_all(url: str, groups: list[dict], chunk: int = 64) -> None:
    import httpx

    with httpx.Client(timeout=120) as client:
        for i in range(0, len(groups), chunk):
            client.post(f"{url}/scored_data_list", json=groups[i : i + chunk]).raise_for_status()


def _server(argv: list[str], url: str) -> subprocess.Popen:
    import httpx

    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(300):
        try:
            httpx.get(url + "/", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit(f"server did not start: {argv}")


def _through_api(api_argv: list[str], trainer_argv: list[str], url: str, groups: list[dict]) -> tuple[float, float]:
    """(seconds from the first POST until the trainer-side tool exits, its total seconds)."""
    api = _server(api_argv, url)
    try:
        start = time.perf_counter()
        trainer = subprocess.Popen(trainer_argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        _wait_registered(url, trainer)
        posted = time.perf_counter()
        _post_all(url, groups)
        _, err = trainer.communicate(timeout=1800)
        end = time.perf_counter()
        if trainer.returncode != 0:
            raise SystemExit(f"{trainer_argv[0]} failed ({trainer.returncode}):\n{err[-2000:]}")
        return end - posted, end - start
    finally:
        api.terminate()
        api.wait(timeout=30)


def compare_atroposlib(venv: Path, work: Path, n_groups: int, size: int) -> None:
    """Atropos' run-api + atropos-sft-gen vs ours (file, and our api + sft-gen --api-url) on the same groups."""
    if n_groups % 64:
        raise SystemExit("--atroposlib-groups must be a multiple of 64 (Atropos forms batches of 8 x 64 rollouts)")
    tok = work / "atroposlib-tokenizer"
    subprocess.run([str(venv / "bin/python"), "-c", _TOKENIZER_SCRIPT, str(tok)], check=True)
    groups = _wire_groups(n_groups, size)
    expected = sum(min(3, sum(1 for x in g["scores"] if x > 0)) for g in groups)
    jsonl = work / f"wire-{n_groups}.jsonl"
    jsonl.write_text("".join(json.dumps(g) + "\n" for g in groups))
    common = ["--group-size", str(size), "--num-seqs-to-save", str(expected), "--save-top-n-per-group", "3"]
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    theirs_out = work / "atroposlib-sft.jsonl"
    theirs_out.unlink(missing_ok=True)
    theirs = _through_api(
        [str(venv / "bin/run-api"), "--host", "127.0.0.1", "--port", str(port)],
        [str(venv / "bin/atropos-sft-gen"), str(theirs_out), "--api-url", url, "--tokenizer", str(tok),
         "--save-messages", *common],
        url,
        groups,
    )  # fmt: skip
    ours_api = _through_api(
        [*ATROPOS, "api", "--port", str(port), "--status-every", "0"],
        [
            *ATROPOS,
            "sft-gen",
            "--api-url",
            url,
            "--idle-timeout",
            "5",
            "--out",
            str(work / "ours-api"),
            "--overwrite",
            *common,
        ],
        url,
        groups,
    )
    ours_file = measure([*ATROPOS, "sft-gen", str(jsonl), "--out", str(work / "ours-file"), "--overwrite", *common])
    got = sum(1 for _ in theirs_out.open())
    print(
        f"\n{n_groups} groups x {size} rollouts (~300 tokens each), {expected} SFT records expected, "
        f"atroposlib wrote {got}"
    )
    print("| tool | path | seconds (first POST -> exit) | total s | records/s |")
    print("|---|---|---:|---:|---:|")
    rows = [
        ("atroposlib 0.4.0 atropos-sft-gen", "run-api + GET /batch", *theirs),
        ("atropos sft-gen --api-url", "atropos api + GET /batch", *ours_api),
        ("atropos sft-gen", "groups.jsonl file", ours_file[0], ours_file[0]),
    ]
    for name, path, seconds, total in rows:
        print(f"| {name} | {path} | {seconds:.1f} | {total:.1f} | {expected / seconds:,.0f} |")
    print(
        f"ratio (ours via API / atroposlib, records/s): {theirs[0] / ours_api[0]:.1f}x; "
        f"ours from file / atroposlib: {theirs[0] / ours_file[0]:.1f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="20000,100000", help="comma-separated group counts")
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench-datagen"))
    parser.add_argument("--atroposlib", type=Path, default=None, help="venv with atroposlib==0.4.0")
    parser.add_argument("--atroposlib-groups", type=int, default=2000)
    args = parser.parse_args()
    cpus = len(os.sched_getaffinity(0))
    print(f"python {sys.version.split()[0]}, {cpus} CPUs usable, load {os.getloadavg()[0]:.1f}", flush=True)
    if args.sizes:
        run_ours(args.work, [int(s) for s in args.sizes.split(",")], args.group_size)
    if args.atroposlib is not None:
        compare_atroposlib(args.atroposlib, args.work, args.atroposlib_groups, args.group_size)


if __name__ == "__main__":
    main()
