"""Per-token log-probs in fp32 without ever holding a [batch, tokens, vocab] logits tensor.

Where it sits: `grpo.py` runs the transformer body (everything but the LM head) to get hidden states, keeps the
trained positions only (h [N, H]; prompt positions never need logits) and calls
`flat_token_logprobs(h, lm_head_weight, targets, inv_temperature)` here.

How: a custom autograd function walks the N positions in chunks of `chunk_size`. For each chunk it computes
logits = h·Wᵀ with fp32 accumulation, scales by the rollout's 1/temperature, takes an fp32 log-softmax and keeps
only the target token's log-prob (and the logsumexp, for backward). Backward recomputes each chunk's logits
(cheap compared to storing them) and forms the gradient in closed form:
d logp / d logits = onehot(target) - softmax(logits), so grad_h = g·(onehot - p)·W and
grad_W = Σ (g·(onehot - p))ᵀ·h, added in fp32 straight into the caller's gradient buffer when it gives one.
Peak extra memory is one chunk of logits, [chunk, vocab] fp32, instead of [B·T, vocab] twice (bf16 logits +
fp32 log-softmax) in a naive implementation. On CUDA the per-chunk elementwise work is fused by torch.compile.

Why fp32: a log-softmax of bf16 logits carries a few percent of gradient error (the issue measured 4.2% for
Atropos' trainer); here only the matmul inputs are bf16 (when the model computes in bf16), the logits and
everything after them are fp32.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..config import DEFAULT_CHUNK

__all__ = ["flat_token_logprobs", "naive_token_logprobs", "DEFAULT_CHUNK"]

MIXED_MM = True  # becomes False once torch.mm(..., out_dtype=float32) is found unsupported
FUSE = True  # torch.compile the per-chunk elementwise work on CUDA (set False to compare with eager)


def _mm(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """a·b with inputs in `dtype` and an fp32 result (fp32 accumulation on GPU tensor cores)."""
    if dtype == torch.float32:
        return a.float() @ b.float()
    global MIXED_MM
    if MIXED_MM:
        try:
            return torch.mm(a.to(dtype), b.to(dtype), out_dtype=torch.float32)
        except (RuntimeError, TypeError):  # no bf16-in/fp32-out kernel here (CPU, older torch)
            MIXED_MM = False
    # an fp32 product (TF32 where allowed): never round the logits themselves to bf16
    return a.float() @ b.float()


def _chunk_logp(logits: torch.Tensor, targets: torch.Tensor, inv_temp: torch.Tensor | None):
    """(log-prob of each target, logsumexp) of one chunk's fp32 logits scaled by 1/T: one read of the chunk."""
    if inv_temp is not None:
        logits = logits * inv_temp[:, None]
    lse = torch.logsumexp(logits, dim=-1)
    return logits.gather(1, targets[:, None]).squeeze(1) - lse, lse


def _chunk_dlogits(logits, targets, inv_temp, lse, grad, dtype):
    """d loss / d logits = g/T · (onehot(target) - softmax(logits/T)), in the compute dtype.

    `lse` is the forward's logsumexp, so backward needs no second reduction over the vocabulary. In place on the
    chunk's logits: eager, no second [chunk, vocab] buffer."""
    g = (grad if inv_temp is None else grad * inv_temp)[:, None]
    if inv_temp is not None:
        logits = logits.mul_(inv_temp[:, None])
    d = logits.sub_(lse[:, None]).exp_().mul_(-g)
    return d.scatter_add_(1, targets[:, None], g).to(dtype)


def _chunk_dlogits_fused(logits, targets, inv_temp, lse, grad, dtype):
    """The same, written for torch.compile: the one-hot as a comparison (not a scatter), so the whole
    expression is one elementwise kernel: one fp32 read and one compute-dtype write of the chunk."""
    g = (grad if inv_temp is None else grad * inv_temp)[:, None]
    scaled = logits if inv_temp is None else logits * inv_temp[:, None]
    vocab = torch.arange(logits.shape[1], device=logits.device)
    onehot = (vocab[None, :] == targets[:, None]).to(logits.dtype)
    return ((onehot - torch.exp(scaled - lse[:, None])) * g).to(dtype)


_KERNELS: dict[str, Callable[..., Any]] = {}
_CHUNK_FNS: dict[str, dict[str, Callable[..., Any]]] = {
    "eager": {"logp": _chunk_logp, "dlogits": _chunk_dlogits},
    "fused": {"logp": _chunk_logp, "dlogits": _chunk_dlogits_fused},
}


def _kernel(name: str, device: torch.device) -> Callable[..., Any]:
    """The chunk function, fused into one kernel by torch.compile on CUDA (eager elsewhere).

    Eager, each elementwise step is a pass over the [chunk, vocab] fp32 buffer (0.6 GB at 1024 x 152k): about
    five in backward. Fused, it is one read and one write of the chunk."""
    if device.type != "cuda" or not FUSE:
        return _CHUNK_FNS["eager"][name]
    if name not in _KERNELS:
        _KERNELS[name] = torch.compile(_CHUNK_FNS["fused"][name], dynamic=True)
    return _KERNELS[name]


MIXED_ADDMM = True  # becomes False once torch.addmm(..., out_dtype=float32, out=acc) is found unsupported


def _add_mm_(acc: torch.Tensor, a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    """acc += a·b in place (fp32 acc): on CUDA one GEMM with beta=1, not a product and then a [V, H] add pass."""
    global MIXED_ADDMM
    if dtype != torch.float32 and MIXED_ADDMM and acc.is_cuda:
        try:
            torch.addmm(acc, a.to(dtype), b.to(dtype), out_dtype=torch.float32, out=acc)
            return
        except (RuntimeError, TypeError):
            MIXED_ADDMM = False
    acc += _mm(a, b, dtype)


def _chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) chunks of `size` rows; a last chunk of a single row joins the one before it. The compiled
    chunk kernels are dynamic in the row count, but torch specialises a size of 1: a micro-batch whose trained
    positions were 1 more than a multiple of `size` recompiled both kernels mid-run (H200: a 6-step benchmark
    row lost ~15% to it; benchmarks/results/trainer_gpu.md)."""
    bounds = list(range(0, n, size)) + [n]
    if len(bounds) > 2 and bounds[-1] - bounds[-2] == 1:
        del bounds[-2]
    return list(zip(bounds[:-1], bounds[1:], strict=False))


def _softcapped(logits: torch.Tensor, softcap: float | None) -> torch.Tensor:
    """cap * tanh(logits / cap): the final-logit soft-cap of models that have one (Gemma 2), in fp32."""
    return logits if softcap is None else torch.tanh(logits / softcap) * softcap


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, inv_temp, chunk_size, weight_grad, softcap):  # type: ignore[override]
        n, dtype = h.shape[0], h.dtype
        w_t = weight.to(dtype).t()  # cast once per call, not per chunk (an fp32 master -> bf16 compute copy)
        out = torch.empty(n, dtype=torch.float32, device=h.device)
        lse = torch.empty(n, dtype=torch.float32, device=h.device)
        chunk_logp = _kernel("logp", h.device)
        for start, end in _chunks(n, chunk_size):
            temp = None if inv_temp is None else inv_temp[start:end]
            logits = _softcapped(_mm(h[start:end], w_t, dtype), softcap)
            out[start:end], lse[start:end] = chunk_logp(logits, targets[start:end], temp)
        ctx.save_for_backward(h, weight, targets, inv_temp, lse)
        ctx.chunk_size, ctx.weight_grad, ctx.softcap = chunk_size, weight_grad, softcap
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        h, weight, targets, inv_temp, lse = ctx.saved_tensors
        n, chunk, dtype = h.shape[0], ctx.chunk_size, h.dtype
        w = weight.to(dtype)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        # the LM head's gradient accumulates in fp32: straight into the caller's buffer when it gives one (the
        # fp32 master's .grad: no [vocab, hidden] temporary), else into a new one; not at all for a frozen head
        grad_w = ctx.weight_grad
        if grad_w is None and ctx.needs_input_grad[1]:
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        chunk_dlogits = _kernel("dlogits", h.device)
        grad_out = grad_out.contiguous()
        for start, end in _chunks(n, chunk):
            temp = None if inv_temp is None else inv_temp[start:end]
            logits = _mm(h[start:end], w.t(), dtype)  # recomputed: storing [n, vocab] would cost far more
            slope = None
            if ctx.softcap is not None:  # d(cap * tanh(x / cap)) / dx = 1 - tanh(x / cap)^2
                logits = _softcapped(logits, ctx.softcap)
                slope = 1 - (logits / ctx.softcap).square()
            dlogits = chunk_dlogits(logits, targets[start:end], temp, lse[start:end], grad_out[start:end], dtype)
            if slope is not None:
                dlogits = (dlogits.float() * slope).to(dtype)
            del logits, slope
            if grad_h is not None:
                grad_h[start:end] = _mm(dlogits, w, dtype).to(dtype)
            if grad_w is not None:
                _add_mm_(grad_w, dlogits.t(), h[start:end], dtype)
        if ctx.weight_grad is not None or grad_w is None:
            return grad_h, None, None, None, None, None, None
        return grad_h, grad_w.to(weight.dtype), None, None, None, None, None


def flat_token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    inv_temperature: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    weight_grad: torch.Tensor | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """log softmax(h·Wᵀ / T)[target] for N positions: hidden [N, H], targets [N], inv_temperature [N] or None.

    `weight_grad`: an fp32 [V, H] buffer that backward adds the head's gradient into (autograd then gets none
    for `weight`); None: the gradient goes to `weight.grad` the usual way. `softcap`: the model's final-logit
    soft-cap (logits = cap * tanh(h·Wᵀ / cap) before the temperature), where its config has one."""
    inv = None if inv_temperature is None else inv_temperature.to(torch.float32).contiguous()
    return _ChunkedLogprob.apply(hidden, weight, targets.long(), inv, chunk_size, weight_grad, softcap)


def naive_token_logprobs(hidden, weight, targets, temperature=None, softcap=None):
    """The reference: full fp32 logits and log-softmax (used by tests and the benchmark's error check)."""
    logits = _softcapped(hidden.float() @ weight.float().t(), softcap)
    if temperature is not None:
        logits = logits / temperature.float().reshape(-1, *([1] * (targets.dim() - 1)), 1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
