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

import functools
from typing import Any, Literal

__all__ = ["Precision", "DTYPES", "Dtype"]

Dtype = Literal["fp32", "bf16", "bf16-pure"]
DTYPES = ("fp32", "bf16", "bf16-pure")
BUCKET = 32  # bf16 gradients held before one foreach add moves them into the fp32 accumulators (~2 layers)


class Precision:
    def __init__(self, model: Any, dtype: Dtype, device: str, lr: float, betas, weight_decay: float) -> None:
        import torch

        self.dtype = dtype
        self.params = [p for p in model.parameters() if p.requires_grad]
        self._index = {id(p): i for i, p in enumerate(self.params)}
        fused = device.startswith("cuda")
        self.master: list[Any] | None
        if dtype == "bf16-pure":
            self.master = [p.detach().float().clone() for p in self.params]
            for m in self.master:
                m.grad = torch.zeros_like(m)
            # parameters only: buffers such as RoPE's inv_freq stay fp32 (in bf16, positions would drift);
            # frozen ones too (a LoRA run's base weights): they never update, so bf16 only halves their memory
            for p in model.parameters():
                p.data = p.data.to(torch.bfloat16)
            # each bf16 gradient goes into its fp32 accumulator the moment backward finishes it, so the model
            # never holds a full set of bf16 gradients (1 GB on a 0.5B model) next to the fp32 ones
            # (in buckets: one foreach add per BUCKET gradients instead of one add each, ~290 a micro-batch on
            # a 0.5B model, host work on the backward's critical path)
            # (the hooks hold the bucket, never `self`: a hook on a parameter that referenced the Precision would
            # make a cycle through C++ that gc cannot break, leaking every discarded trainer's model and master)
            self._bucket = _Bucket()
            for p, m in zip(self.params, self.master, strict=True):
                p.register_post_accumulate_grad_hook(functools.partial(self._bucket.move, m))
            optimized = self.master
        else:
            self.master = None
            optimized = self.params
        self.optimized: list[Any] = optimized
        self.optimizer = torch.optim.AdamW(optimized, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused)
        # a replicated many-rank run sums the gradients over ranks while the last backward runs (`sum_over`)
        self.reducer: Any = None

    def sum_over(self, reducer: Any, head: Any = None, tied: bool = False) -> None:
        """Sum the gradients over ranks with `reducer` (`replicate.OverlappedSum` over `self.optimized`, which
        now owns their storage): every finished gradient of the step's last backward is reported to it. `head`:
        the LM head's weight, whose gradient lands through `grad_sink` (reported once that has happened, see
        `watch_sink`), and through autograd too when it is `tied` to the input embedding."""
        self.reducer = reducer
        if self.master is not None:
            self._bucket.reducer = reducer  # bf16-pure: a master gradient is final once its bucket is added
        else:
            for p in self.params:  # fp32 / bf16: autograd accumulates into the reducer's views themselves
                p.register_post_accumulate_grad_hook(functools.partial(_report, reducer))
        sink = self.grad_sink(head) if head is not None else None
        if sink is not None:
            owner = self.master[self._index[id(head)]] if self.master is not None else head
            reducer.expect(owner, 2 if tied else 1)

    def last_backward(self) -> None:
        """The next forward/backward is the step's last: the reducer starts each bucket as it completes."""
        if self.reducer is not None:
            self.reducer.arm()

    def watch_sink(self, hidden: Any, param: Any) -> None:
        """`param`'s gradient is added into its sink by the backward that produces `hidden`'s gradient: report
        it then (a hook on `hidden` runs right after), so its bucket need not wait for the backward's end."""
        if self.reducer is None or not self.reducer.armed:
            return
        owner = self.master[self._index[id(param)]] if self.master is not None else param
        hidden.register_hook(functools.partial(_report_sink, self.reducer, owner))

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
        """bf16-pure: move any bf16 gradient the hooks did not take into the fp32 accumulators."""
        if self.master is None:
            return
        self._bucket.flush()
        for m, p in zip(self.master, self.params, strict=True):
            if p.grad is not None:
                m.grad.add_(p.grad)
                p.grad = None
                if self.reducer is not None:
                    self.reducer.ready([m])

    def discard_pending(self) -> None:
        """Forget bf16 gradients not yet moved into the accumulators (a CUDA graph recording that failed
        midway: it ran nothing, so the accumulators are as before it)."""
        if self.master is None:  # fp32 / bf16: .grad is the accumulator itself, untouched by a recording
            return
        self._bucket.clear()
        for p in self.params:  # bf16-pure: a bf16 .grad only ever waits to be moved
            p.grad = None

    def step(self, grad_clip: float) -> Any:
        """Clip, update, zero; returns the pre-clip gradient norm (a device tensor: no host sync)."""
        import torch

        optimized = self.optimized
        if self.reducer is not None:  # every rank's buckets summed (a rank that trained nothing adds zeros)
            self.reducer.finish()
        grad_norm = torch.nn.utils.clip_grad_norm_(optimized, grad_clip)
        self.optimizer.step()
        if self.master is not None:
            with torch.no_grad():
                torch._foreach_copy_(self.params, self.master)
        if self.reducer is not None:  # the gradients are views into its buckets: zeroed in place
            self.reducer.zero()
        elif self.master is not None:
            torch._foreach_zero_([m.grad for m in self.master])
        else:
            self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def grad_sink(self, param: Any) -> Any:
        """An fp32 buffer that `param`'s gradient may be added into directly (the LM head uses it: no [V, H]
        temporary); None if `param` is not trained. bf16-pure: its master's accumulator; else its own .grad."""
        import torch

        if not param.requires_grad:
            return None
        if self.master is not None:
            index = self._index.get(id(param))
            return None if index is None else self.master[index].grad
        if param.grad is None:
            param.grad = torch.zeros_like(param, dtype=torch.float32)
        return param.grad if param.grad.dtype == torch.float32 else None

    def sync_from_model(self) -> None:
        """After weights were loaded into the model (resume): refresh the fp32 master from them."""
        if self.master is None:
            return
        import torch

        with torch.no_grad():
            for m, p in zip(self.master, self.params, strict=True):
                m.copy_(p)


class _Bucket:
    """bf16 gradients waiting for one foreach add into their fp32 accumulators (BUCKET at a time)."""

    def __init__(self) -> None:
        self.sinks: list[Any] = []
        self.grads: list[Any] = []
        self.masters: list[Any] = []
        self.reducer: Any = None  # a replicated run: told which masters' gradients each flush completed

    def move(self, master: Any, param: Any) -> None:
        if param.grad is not None:  # None: the LM head, whose gradient went straight into `master.grad`
            self.masters.append(master)
            self.sinks.append(master.grad)
            self.grads.append(param.grad)
            param.grad = None
            if len(self.grads) >= BUCKET:
                self.flush()

    def flush(self) -> None:
        """Add the held bf16 gradients into their fp32 accumulators: cast into one fp32 scratch buffer, then
        added, two multi-tensor kernels. (One `_foreach_add_(fp32, bf16)` has mixed dtypes, which torch runs as
        one add per tensor: ~290 kernels and their host dispatch a micro-batch on a 0.5B model, H100 profile.)"""
        import torch

        if self.grads:
            sizes = [g.numel() for g in self.grads]
            scratch = torch.empty(sum(sizes), dtype=self.sinks[0].dtype, device=self.sinks[0].device)
            upcast = [v.view_as(g) for v, g in zip(scratch.split(sizes), self.grads, strict=True)]
            torch._foreach_copy_(upcast, self.grads)
            torch._foreach_add_(self.sinks, upcast)
            if self.reducer is not None:
                self.reducer.ready(self.masters)
        self.clear()

    def clear(self) -> None:
        """Hold nothing (after a flush, or to drop gradients that will never be moved)."""
        self.sinks.clear()
        self.grads.clear()
        self.masters.clear()


def _report(reducer: Any, param: Any) -> None:
    reducer.ready([param])


def _report_sink(reducer: Any, owner: Any, grad: Any) -> None:
    reducer.ready([owner])
