"""Checkpoints in Hugging Face format under OUT/checkpoints/step-N, and finding the latest one to resume from.

Where it sits: `grpo.py` calls `save_checkpoint` every `save_every` steps, at the end and on Ctrl-C; `atropos
train --resume` calls `latest_checkpoint` and `load_optimizer_state`. A checkpoint is a directory any HF tool
(and vLLM) can load: `save_pretrained` weights + config + tokenizer, plus `trainer_state.json` (step, config)
and `optimizer.pt` (AdamW moments, so a resumed run continues exactly). A LoRA run saves the merged weights
there and its adapter alone under step-N/adapter/ (`lora.py`), which is what --resume reloads. A checkpoint
is written to a temporary name and renamed when complete, so a crash mid-save never leaves a half checkpoint
that --resume would pick.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from .lora import ADAPTER_DIR, is_lora_model, save_adapter, save_merged

__all__ = [
    "save_checkpoint",
    "prune_checkpoints",
    "latest_checkpoint",
    "read_trainer_state",
    "load_optimizer_state",
    "CHECKPOINTS",
]

CHECKPOINTS = "checkpoints"
_STEP = re.compile(r"^step-(\d+)$")


def _step_dirs(out: Path) -> list[tuple[int, Path]]:
    root = out / CHECKPOINTS
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP.match(p.name)) and p.is_dir()]
    return sorted(found)


def save_checkpoint(
    out: Path, step: int, model: Any, tokenizer: Any, optimizer: Any, state: dict[str, Any], keep: int
) -> Path:
    """Write OUT/checkpoints/step-N atomically; keep only the newest `keep` (0 keeps all)."""
    import torch

    final = out / CHECKPOINTS / f"step-{step}"
    tmp = out / CHECKPOINTS / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    if is_lora_model(model):  # the merged weights (a plain HF model, for vLLM) + the adapter (for --resume)
        save_merged(model, tmp)
        save_adapter(model, tmp / ADAPTER_DIR)
    else:
        model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=2, default=str))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    prune_checkpoints(out, keep)
    return final


def prune_checkpoints(out: Path, keep: int) -> None:
    """Keep only the newest `keep` checkpoints (0 keeps all)."""
    if keep > 0:
        for _, old in _step_dirs(out)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)


def latest_checkpoint(out: Path) -> Path | None:
    dirs = _step_dirs(out)
    return dirs[-1][1] if dirs else None


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / "trainer_state.json"
    return json.loads(path.read_text()) if path.is_file() else {"step": int(checkpoint.name.split("-")[-1])}


def load_optimizer_state(checkpoint: Path, optimizer: Any) -> bool:
    import torch

    path = checkpoint / "optimizer.pt"
    if not path.is_file():
        return False
    optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return True
