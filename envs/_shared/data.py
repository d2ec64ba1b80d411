"""Loading an env's records: a local jsonl/json/parquet file (`--env.data_path`) or a Hugging Face dataset.

Used by the dataset-backed envs (gsm8k, math, code, judge). Local files are read without `datasets`; the hub
path imports `datasets` only when it is taken, so listing envs and offline tests never touch it. Missing
files and missing columns are `ConfigError`s that name the path and the columns.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import socket
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from atropos_cli.errors import ConfigError
from atropos_cli.quiet import quiet_datasets

__all__ = [
    "BUNDLED_DATA",
    "load_local_records",
    "load_hub_records",
    "check_hub_access",
    "hub_reachable",
    "check_columns",
    "cycle_shuffled",
    "load_split_records",
]

BUNDLED_DATA = Path(__file__).resolve().parents[1] / "_data"  # the bundled envs' own data files (envs/_data)

LOCAL_SUFFIXES = (".jsonl", ".json", ".parquet")


def load_local_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a .jsonl / .json (list of objects) / .parquet file, as dicts."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(
            f"data file {str(path)!r} does not exist",
            hint="pass --env.data_path PATH to a .jsonl, .json or .parquet file",
        )
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix == ".jsonl":
        return _read_jsonl(path)
    if suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
            raise ConfigError(
                f"{path}: a .json data file must hold a list of objects", hint="or use .jsonl, one object a line"
            )
        return data
    raise ConfigError(
        f"data file {str(path)!r} has an unsupported suffix {suffix!r}",
        hint="use one of: " + ", ".join(LOCAL_SUFFIXES),
    )


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"not valid JSON ({exc.msg})", hint="fix or delete that line", file=str(path), line=lineno
            ) from None
        if not isinstance(row, dict):
            raise ConfigError(
                f"expected a JSON object, got {type(row).__name__}",
                hint="each line holds one item as a JSON object",
                file=str(path),
                line=lineno,
            )
        rows.append(row)
    return rows


_HUB_PROBE_S = 3.0


def _hub_endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


_OFFLINE_VARS = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def _hub_offline() -> bool:
    return any(os.environ.get(k, "").upper() in ("1", "ON", "YES", "TRUE") for k in _OFFLINE_VARS)


def hub_reachable(endpoint: str, timeout: float = _HUB_PROBE_S) -> bool:
    """Whether a TCP connection to the hub opens within `timeout` s (DNS included); True behind a proxy,
    whose reachability this cannot judge."""
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")):
        return True
    url = urlsplit(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)

    def connect() -> None:
        socket.create_connection((url.hostname or "", port), timeout=timeout).close()

    with ThreadPoolExecutor(max_workers=1) as pool:  # getaddrinfo has no timeout of its own
        future = pool.submit(connect)
        try:
            future.result(timeout=timeout)
        except (OSError, FuturesTimeout):
            return False
    return True


def _hub_hint(required: Sequence[str]) -> str:
    columns = f" with columns {', '.join(required)}" if required else ""
    local = f"pass --env.data_path PATH to a local .jsonl/.json/.parquet file{columns}"
    if _hub_offline():
        return f"HF_HUB_OFFLINE is set and the dataset is not in your Hugging Face cache: {local}"
    return f"{local}; or, if the dataset is in your Hugging Face cache, set HF_HUB_OFFLINE=1"


def check_hub_access(name: str, required: Sequence[str] = ()) -> None:
    """Return once `datasets` is installed and the hub answers (or HF_HUB_OFFLINE says to use the cache only);
    else a ConfigError within a few seconds (not `datasets`' ~30 s of retries) that names the way out."""
    if importlib.util.find_spec("datasets") is None:
        raise ConfigError(
            f"loading {name!r} from the Hugging Face hub needs the `datasets` package",
            hint='pip install "atropos[hf]", or pass --env.data_path to a local file',
        )
    endpoint = _hub_endpoint()
    if not _hub_offline() and not hub_reachable(endpoint):
        raise ConfigError(f"cannot reach the Hugging Face hub ({endpoint}) to load {name!r}", hint=_hub_hint(required))


def load_hub_records(name: str, config: str | None, split: str, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """A split of a hub dataset through `datasets` (network on first use, then its cache); every failure is
    a one-line ConfigError."""
    check_hub_access(name, required)
    import datasets

    try:
        with quiet_datasets():
            return list(datasets.load_dataset(name, config, split=split))
    except Exception as exc:  # datasets raises ConnectionError, FileNotFoundError, ValueError, hub errors...
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(
            f"cannot load {name!r} ({split}) from the Hugging Face hub: {reason}", hint=_hub_hint(required)
        ) from None


def check_columns(rows: Sequence[dict[str, Any]], required: Sequence[str], source: str) -> None:
    """Raise a ConfigError naming every required column the first row lacks (and the ones it has)."""
    if not rows:
        raise ConfigError(f"{source} has no rows", hint="point --env.data_path at a non-empty file")
    missing = [c for c in required if c not in rows[0]]
    if missing:
        raise ConfigError(
            f"{source} lacks column(s) {', '.join(repr(c) for c in missing)}",
            hint=f"columns found: {', '.join(sorted(rows[0]))}; needed: {', '.join(required)}",
        )


def cycle_shuffled(rows: Sequence[Any], seed: int) -> Iterator[Any]:
    """Endless epochs over `rows`, reshuffled each epoch with a seeded RNG (the train split's order)."""
    epoch = 0
    while True:
        order = list(range(len(rows)))
        random.Random(f"{seed}:{epoch}").shuffle(order)
        for index in order:
            yield rows[index]
        epoch += 1


def load_split_records(
    data_path: str | None, dataset_name: str, dataset_config: str | None, split: str, required: Sequence[str]
) -> tuple[list[dict[str, Any]], str]:
    """Rows of a split from `data_path` (local jsonl/parquet) or the hub (train -> train, else test), checked
    for the `required` columns; returns (rows, a description of the source for error messages)."""
    if data_path:
        rows, source = load_local_records(data_path), repr(data_path)
    else:
        hub_split = "train" if split == "train" else "test"
        rows = load_hub_records(dataset_name, dataset_config, hub_split, required)
        source = f"{dataset_name} ({hub_split})"
    check_columns(rows, required, source)
    return rows, source
