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

from atropos_cli.config import read_saved

from .weights.lora import ADAPTER_DIR, is_lora_model, save_adapter, save_merged

__all__ = [
    "save_checkpoint",
    "temporary_dir",
    "begin_checkpoint",
    "finish_checkpoint",
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

    tmp = begin_checkpoint(out, step)
    if is_lora_model(model):  # the merged weights (a plain HF model, for vLLM) + the adapter (for --resume)
        save_merged(model, tmp)
        save_adapter(model, tmp / ADAPTER_DIR)
    else:
        model.save_pretrained(tmp)
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    return finish_checkpoint(out, step, tmp, state, keep)


def temporary_dir(out: Path, step: int) -> Path:
    """Where step N's checkpoint is written until it is complete (never picked by --resume)."""
    return out / CHECKPOINTS / f".tmp-step-{step}"


def begin_checkpoint(out: Path, step: int) -> Path:
    """An empty `temporary_dir` for step N's checkpoint (a leftover of a crashed save is removed)."""
    tmp = temporary_dir(out, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def finish_checkpoint(out: Path, step: int, tmp: Path, state: dict[str, Any], keep: int) -> Path:
    """Write trainer_state.json into the complete `tmp`, rename it to OUT/checkpoints/step-N (what --resume may
    pick from then on) and keep only the newest `keep` checkpoints (0 keeps all)."""
    (tmp / "trainer_state.json").write_text(json.dumps({"step": step, **state}, indent=2, default=str))
    final = out / CHECKPOINTS / f"step-{step}"
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    if keep > 0:
        for _, old in _step_dirs(out)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def latest_checkpoint(out: Path) -> Path | None:
    dirs = _step_dirs(out)
    return dirs[-1][1] if dirs else None


def read_trainer_state(checkpoint: Path) -> dict[str, Any]:
    path = checkpoint / "trainer_state.json"
    if not path.is_file():
        return {"step": int(checkpoint.name.split("-")[-1])}
    return dict(read_saved(path, "resume from another checkpoint (delete this one) or train into a new --out"))


def load_optimizer_state(checkpoint: Path, optimizer: Any) -> bool:
    import torch

    path = checkpoint / "optimizer.pt"
    if not path.is_file():
        return False
    optimizer.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return True
