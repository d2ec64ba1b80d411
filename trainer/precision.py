"""Weights, gradients and the optimizer in the three precisions `--dtype` offers; none loses a small update.

Where it sits: `GRPOTrainer` builds one `Precision` and calls `after_backward()` after each micro-batch and
`step()` once per batch. Modes:

- `fp32`: fp32 weights, fp32 compute. The CPU default; exact.
- `bf16`: fp32 weights (the master copy itself), bf16 compute through autocast; the residual stream stays
  fp32 because the embedding is fp32. Gradients land in fp32 `.grad`.
- `bf16-pure`: the model's weights are bf16 (fastest kernels, half the weight memory), and an fp32 master
  copy lives beside them: each micro-batch's bf16 gradients are added into fp32 accumulators (so accumulation
  over micro-batches rounds nothing away), AdamW updates the fp32 master, and the master is copied back
  into the bf16 weights. A 1e-6 update accumulates in the master even when one step is below bf16's
  resolution — the failure of keeping only bf16 weights (Atropos' trainer).
"""

from __future__ import annotations

from typing import Any, Literal

__all__ = ["Precision", "DTYPES", "Dtype"]

Dtype = Literal["fp32", "bf16", "bf16-pure"]
DTYPES = ("fp32", "bf16", "bf16-pure")


class Precision:
    def __init__(self, model: Any, dtype: Dtype, device: str, lr: float, betas, weight_decay: float) -> None:
        import torch

        self.dtype = dtype
        self.params = [p for p in model.parameters() if p.requires_grad]
        fused = device.startswith("cuda")
        if dtype == "bf16-pure":
            self.master = [p.detach().float().clone() for p in self.params]
            for m in self.master:
                m.grad = torch.zeros_like(m)
            # parameters only: buffers such as RoPE's inv_freq stay fp32 (in bf16, positions would drift)
            for p in self.params:
                p.data = p.data.to(torch.bfloat16)
            optimized = self.master
        else:
            self.master = None
            optimized = self.params
        self.optimizer = torch.optim.AdamW(optimized, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)

    @property
    def compute_dtype(self) -> Any:
        import torch

        return torch.float32 if self.dtype == "fp32" else torch.bfloat16

    def autocast(self, device: str) -> Any:
        import contextlib

        import torch

        if self.dtype == "bf16" and device.startswith("cuda"):
            return torch.autocast("cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def after_backward(self) -> None:
        """bf16-pure: move this micro-batch's bf16 gradients into the fp32 accumulators."""
        if self.master is None:
            return
        for m, p in zip(self.master, self.params, strict=True):
            if p.grad is not None:
                m.grad.add_(p.grad)
                p.grad = None

    def step(self, grad_clip: float) -> Any:
        """Clip, update, zero; returns the pre-clip gradient norm (a device tensor: no host sync)."""
        import torch

        optimized = self.master if self.master is not None else self.params
        grad_norm = torch.nn.utils.clip_grad_norm_(optimized, grad_clip)
        self.optimizer.step()
        if self.master is not None:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.master)
            for m in self.master:
                m.grad.zero_()
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def sync_from_model(self) -> None:
        """After weights were loaded into the model (resume): refresh the fp32 master from them."""
        if self.master is None:
            return
        import torch

        with torch.no_grad():
            for m, p in zip(self.master, self.params, strict=True):
                m.copy_(p)
