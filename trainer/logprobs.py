"""Per-token log-probs in fp32 without ever holding a [batch, tokens, vocab] logits tensor.

Where it sits: `grpo.py` runs the transformer body (everything but the LM head) to get hidden states
h [B, T, H], then calls `token_logprobs(h, lm_head_weight, targets, temperature)` here.

How: a custom autograd function walks the flattened tokens in chunks of `chunk_size`. For each chunk it
computes logits = h·Wᵀ with fp32 accumulation, divides by the rollout's sampling temperature, takes an fp32
log-softmax and keeps only the target token's log-prob. Backward recomputes each chunk's logits (cheap
compared to storing them) and forms the gradient in closed form:
d logp / d logits = onehot(target) - softmax(logits), so grad_h = g·(onehot - p)·W and
grad_W = Σ (g·(onehot - p))ᵀ·h. Peak extra memory is one chunk of logits, [chunk, vocab] fp32, instead of
[B·T, vocab] twice (bf16 logits + fp32 log-softmax) in a naive implementation.

Why fp32: a log-softmax of bf16 logits carries a few percent of gradient error (the issue measured 4.2% for
Atropos' trainer); here only the matmul inputs are bf16 (when the model computes in bf16), the logits and
everything after them are fp32.
"""

from __future__ import annotations

import torch

__all__ = ["token_logprobs", "naive_token_logprobs", "DEFAULT_CHUNK"]

MIXED_MM = True  # becomes False once torch.mm(..., out_dtype=float32) is found unsupported
DEFAULT_CHUNK = 1024  # tokens per chunk: 1024 x 152k vocab x 4 bytes = 0.6 GB of fp32 logits


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


class _ChunkedLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h, weight, targets, inv_temp, chunk_size):  # type: ignore[override]
        n, dtype = h.shape[0], h.dtype
        w_t = weight.to(dtype).t()  # cast once per call, not per chunk (an fp32 master -> bf16 compute copy)
        out = torch.empty(n, dtype=torch.float32, device=h.device)
        for start in range(0, n, chunk_size):
            end = min(start + chunk_size, n)
            logits = _mm(h[start:end], w_t, dtype).mul_(inv_temp[start:end, None])
            picked = logits.gather(1, targets[start:end, None]).squeeze(1)
            out[start:end] = picked - torch.logsumexp(logits, dim=-1)
        ctx.save_for_backward(h, weight, targets, inv_temp)
        ctx.chunk_size = chunk_size
        return out

    @staticmethod
    def backward(ctx, grad_out):  # type: ignore[override]
        h, weight, targets, inv_temp = ctx.saved_tensors
        n, chunk, dtype = h.shape[0], ctx.chunk_size, h.dtype
        w = weight.to(dtype)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
        for start in range(0, n, chunk):
            end = min(start + chunk, n)
            logits = _mm(h[start:end], w.t(), dtype).mul_(inv_temp[start:end, None])
            # d logp/d logits = onehot - softmax, times the upstream grad and the 1/T of the temperature scaling;
            # computed in place, so one [chunk, vocab] fp32 buffer is all the extra memory backward needs.
            lse = torch.logsumexp(logits, dim=-1, keepdim=True)
            g = (grad_out[start:end] * inv_temp[start:end])[:, None]
            dlogits = logits.sub_(lse).exp_().mul_(-g)
            dlogits.scatter_add_(1, targets[start:end, None], g)
            dlogits = dlogits.to(dtype)  # once, for both products below (a no-op in fp32)
            if grad_h is not None:
                grad_h[start:end] = _mm(dlogits, w, dtype).to(dtype)
            grad_w += _mm(dlogits.t(), h[start:end], dtype)
        return grad_h, grad_w.to(weight.dtype), None, None, None


def token_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: torch.Tensor | None = None,
    chunk_size: int = DEFAULT_CHUNK,
) -> torch.Tensor:
    """log softmax(h·Wᵀ / T)[target] per position, fp32, shape of `targets`.

    hidden [..., H]; weight [V, H] (the LM head); targets [...] int64 (masked positions may hold any valid id);
    temperature: one per row of targets' leading dim ([B]) or None for 1.0.
    """
    lead = targets.shape
    h = hidden.reshape(-1, hidden.shape[-1])
    t = targets.reshape(-1).long()
    if temperature is None:
        inv = torch.ones(t.shape[0], dtype=torch.float32, device=h.device)
    else:
        per_row = 1.0 / temperature.to(torch.float32).clamp_min(1e-6)
        inv = per_row.reshape(-1, *([1] * (len(lead) - 1))).expand(lead).reshape(-1).contiguous()
    return _ChunkedLogprob.apply(h, weight, t, inv, chunk_size).reshape(lead)


def naive_token_logprobs(hidden, weight, targets, temperature=None):
    """The reference: full fp32 logits and log-softmax (used by tests and the benchmark's error check)."""
    logits = hidden.float() @ weight.float().t()
    if temperature is not None:
        logits = logits / temperature.float().reshape(-1, *([1] * (targets.dim() - 1)), 1)
    return torch.log_softmax(logits, dim=-1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)
