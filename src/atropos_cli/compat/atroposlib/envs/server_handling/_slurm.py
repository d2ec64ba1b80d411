"""atroposlib's Slurm discovery of inference servers (`--slurm true`, or a ServerBaseline inside a job).

Inside an allocation (`SLURM_JOB_NODELIST`), the nodes after the first `NUM_TRAINING_NODES` serve inference:
`8 // INFER_TP` servers each, at http://NODE:9000/v1, :9001, ... (atroposlib's layout). The node list is
expanded by `scontrol show hostnames`, or, without scontrol, from its bracket syntax (`gpu[01-03,07],cpu1`).
Fewer than two nodes: the configured servers stay as they are (`--slurm`) or the four local ones at
localhost:9004..9007 (a ServerBaseline), as atroposlib does. Outside a Slurm job (no SLURM_JOB_NODELIST)
slurm=True keeps the configured servers with a warning (atroposlib fails with a KeyError, so an env whose
`__init__` defaults to slurm=True, as most do, still constructs). A job of several nodes without
NUM_TRAINING_NODES is a ConfigError with a hint.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess

from atropos_cli.errors import ConfigError

__all__ = ["expand_nodelist", "inference_urls"]

logger = logging.getLogger(__name__)


def _expand_part(part: str) -> list[str]:
    found = re.fullmatch(r"(.*?)\[([^\]]+)\](.*)", part)
    if not found:
        return [part]
    head, ranges, tail = found.groups()
    names: list[str] = []
    for chunk in ranges.split(","):
        low, _, high = chunk.partition("-")
        width = len(low)
        for number in range(int(low), int(high or low) + 1):
            names.extend(f"{head}{number:0{width}d}{rest}" for rest in _expand_part(tail))
    return names


def expand_nodelist(nodelist: str) -> list[str]:
    """Host names of a Slurm node list (scontrol's answer when it is installed)."""
    if shutil.which("scontrol"):
        out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, check=False)
        return [line for line in out.stdout.splitlines() if line]
    parts = re.findall(r"[^,\[]+(?:\[[^\]]*\][^,\[]*)*", nodelist)
    return [name for part in parts for name in _expand_part(part.strip()) if name]


def inference_urls() -> list[str] | None:
    """The inference servers' URLs of this Slurm job; None with fewer than two nodes (nothing to split)."""
    nodelist = os.environ.get("SLURM_JOB_NODELIST")
    if not nodelist:
        logger.warning("slurm is set but this is not a Slurm job (no SLURM_JOB_NODELIST): the configured servers")
        return None
    nodes = expand_nodelist(nodelist)
    if len(nodes) < 2:
        return None
    try:
        training = int(os.environ["NUM_TRAINING_NODES"])
        per_node = 8 // int(os.environ.get("INFER_TP", "1"))
    except (KeyError, ValueError):
        raise ConfigError(
            "a Slurm job of several nodes needs NUM_TRAINING_NODES (and INFER_TP, default 1) as integers",
            hint="export NUM_TRAINING_NODES=<nodes running the trainer> (the rest serve inference)",
        ) from None
    return [f"http://{node}:{9000 + i}/v1" for node in nodes[training:] for i in range(per_node)]
