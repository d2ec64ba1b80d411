"""A rank's rows of each weight, read from a model directory's safetensors (no rank reads the whole model).

Where it sits: `meta_init.materialise` asks `CheckpointSlices.rows(key, lo, hi)` for rows lo..hi (dim 0) of each
parameter this rank holds a shard of; safetensors reads those bytes alone (`get_slice`, memory-mapped), so a
30B checkpoint costs each of 4 ranks a quarter of its size in reads and never more than one tensor's slice in
memory.

Keys are the model's own parameter names (`model.layers.0.self_attn.q_proj.weight`, ...). One layout differs
between checkpoints and transformers' modules, and is assembled here: grouped experts (Qwen3-MoE, OLMoE: the
`qwen2_moe` conversion of transformers) are stored one expert at a time (`mlp.experts.E.gate_proj.weight`,
`up_proj`, `down_proj`) and held as one [experts, ...] tensor (`mlp.experts.gate_up_proj` = gate and up
concatenated, `mlp.experts.down_proj`); a rank's rows of those are its experts, read expert by expert. A key the
checkpoint lacks in any known layout (a quantized gpt-oss checkpoint's MXFP4 `_blocks`, for one) is an error
naming it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from atropos_cli.errors import ModelLoadError

__all__ = ["CheckpointSlices"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
_GROUPED = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<kind>gate_up_proj|down_proj)$")


class CheckpointSlices:
    """The safetensors files of one model directory, opened lazily, read a slice at a time."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        index, single = directory / INDEX, directory / SINGLE
        if index.is_file():
            self.where: dict[str, str] = json.loads(index.read_text())["weight_map"]
        elif single.is_file():
            from safetensors import safe_open

            with safe_open(str(single), framework="pt") as f:
                self.where = dict.fromkeys(f.keys(), SINGLE)
        else:
            raise ModelLoadError(
                f"no safetensors weights in {str(directory)!r} ({INDEX} or {SINGLE})",
                hint="save the model with transformers' save_pretrained (safetensors is its default)",
            )
        self._files: dict[str, Any] = {}

    def _file(self, name: str) -> Any:
        from safetensors import safe_open

        if name not in self._files:
            self._files[name] = safe_open(str(self.directory / name), framework="pt")
        return self._files[name]

    def _slice(self, key: str, lo: int, hi: int) -> Any:
        return self._file(self.where[key]).get_slice(key)[lo:hi]

    def _whole(self, key: str) -> Any:
        return self._file(self.where[key]).get_tensor(key)

    def rows(self, key: str, lo: int, hi: int) -> Any:
        """Rows lo..hi (dim 0, lo < hi) of the model's tensor `key`, as stored (the checkpoint's dtype), on the CPU."""
        import torch

        if key in self.where:
            return self._slice(key, lo, hi)
        grouped = _GROUPED.match(key)
        if grouped is not None:  # experts stored one by one: this rank's experts, assembled
            prefix = grouped["prefix"]
            parts = ("gate_proj", "up_proj") if grouped["kind"] == "gate_up_proj" else ("down_proj",)
            names = [[f"{prefix}.{e}.{part}.weight" for part in parts] for e in range(lo, hi)]
            if all(name in self.where for expert in names for name in expert):
                return torch.stack([torch.cat([self._whole(n) for n in expert]) for expert in names])
        raise ModelLoadError(
            f"the checkpoint in {str(self.directory)!r} has no tensor {key!r}",
            hint="a many-GPU run reads unquantized safetensors whose names are the model's (or per-expert MoE "
            "weights); a quantized checkpoint (gpt-oss MXFP4) must be saved in bf16 first",
        )

    def close(self) -> None:
        self._files.clear()
