"""The engine's decode attention as one Triton kernel: a row's query heads over its group's shared prompt block,
then over its own generation block, in one pass with an online softmax (flash-decoding).

Where it sits: the CUDA default where Triton imports (`engine.attention_kind`): an engine's cache fetches the op
(`op()`) when it is built and `engine.group_attention` calls it once a layer a decode step. torch's fused kernel on
each block, merged by log-sum-exps, is the fallback and the variant `bench_generation.py` compares it against
(H100, 0.5B shape, batch 512: this kernel 118.9k tok/s, fused 106.6k, same run: results/generation_gpu.md).
The kernel replaces, per layer and step, the query copy, two attention kernels with their expanded bias
tensors, and the merge: one launch. The Triton program itself is `decode_kernel.py`.

Layout (the engine's `GroupCache`): prompt blocks [groups, kv heads, prompt_len, dim], generation blocks [rows,
kv heads, gen_len, dim] with rows = groups x width (row s belongs to group s // width). Row s attends to its
group's prompt entries [0, prompt_len[group]) and its own generation entries [0, gen_pos[s]] (the current token's
key/value is already written at gen_pos[s]), never past `bucket`. One program per (row, kv head) holds that KV
head's `hq / hk` query heads (padded to 16 rows for `tl.dot`, the GQA trick): each key/value is read once for
all of them. A group's rows read the same prompt entries, which stay in L2 between them.

Registered with `torch.library.triton_op`, so torch.compile traces it as a user-defined Triton kernel inside the
compiled decode step and CUDA-graph capture records it like any kernel. Tests run it on CPU tensors through
Triton's interpreter (TRITON_INTERPRET=1).
"""

# no `from __future__ import annotations`: triton_op reads the op's annotations as real types

import functools
from typing import Any

__all__ = ["available", "decode_attention"]

BLOCK_N = 64  # keys per inner iteration
NO_WINDOW = 1 << 30  # the kernel's window when there is none: beyond any position


@functools.cache
def available() -> bool:
    """Whether Triton and torch's triton_op are importable (the kernel is built on first use)."""
    try:
        import triton  # noqa: F401
        from torch.library import triton_op, wrap_triton  # noqa: F401
    except ImportError:
        return False
    return True


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def op() -> Any:
    """The registered custom op, to be called as op(q, prompt_k, prompt_v, gen_k, gen_v, prompt_len, gen_pos, sinks,
    width, bucket, scale, window) (`decode_attention`'s arguments; no sinks: an empty tensor, no window: 0).
    Fetch it outside torch.compile's tracing (the engine does, when it builds its cache): the cached builder is
    a graph break for dynamo."""
    return _op()


@functools.cache
def _op() -> Any:
    """The registered custom op (built once: defining it needs triton)."""
    from atropos_cli import compile_cache

    compile_cache.enable()  # before triton reads its cache directory
    import torch
    import triton
    from torch.library import triton_op, wrap_triton

    from atropos_cli.inference.decode_kernel import decode_kernel

    @triton_op("atropos::group_decode_attention", mutates_args={})
    def group_decode_attention(
        q: torch.Tensor,
        prompt_k: torch.Tensor,
        prompt_v: torch.Tensor,
        gen_k: torch.Tensor,
        gen_v: torch.Tensor,
        prompt_len: torch.Tensor,
        gen_pos: torch.Tensor,
        sinks: torch.Tensor,
        width: int,
        bucket: int,
        scale: float,
        window: int,
    ) -> torch.Tensor:
        rows, hq, dim = q.shape
        hk = prompt_k.shape[1]
        r = hq // hk
        out = torch.empty((rows, hq, dim), dtype=q.dtype, device=q.device)
        wrap_triton(decode_kernel)[(rows, hk)](
            q, prompt_k, prompt_v, gen_k, gen_v, prompt_len, gen_pos, sinks, out,
            q.stride(0), q.stride(1),
            prompt_k.stride(0), prompt_k.stride(1), prompt_k.stride(2),
            gen_k.stride(0), gen_k.stride(1), gen_k.stride(2),
            out.stride(0), out.stride(1),
            width, bucket, scale, window if window > 0 else NO_WINDOW,
            R=r, R_PAD=max(16, triton.next_power_of_2(r)), D=dim, BLOCK=BLOCK_N, UPCAST=_interpreted(),
            HAS_SINKS=sinks.numel() > 0,
        )  # fmt: skip
        return out

    return group_decode_attention


def decode_attention(
    q: Any,
    prompt_k: Any,
    prompt_v: Any,
    gen_k: Any,
    gen_v: Any,
    prompt_len: Any,
    gen_pos: Any,
    width: int,
    bucket: int,
    scale: float,
    window: int | None = None,
    sinks: Any = None,
) -> Any:
    """Attention of each row's query heads q [rows, hq, dim] over its group's prompt entries [0, prompt_len[g])
    and its own generation entries [0, gen_pos[row]] (at most `bucket`): [rows, hq, dim] in q's dtype.
    `window`: only entries at positions > (prompt_len[g] + gen_pos[row]) - window (a sliding window);
    `sinks` [hq]: one more logit per query head in the softmax's denominator (attention sinks).

    prompt_k/v [groups, hk, prompt_len_max, dim] and gen_k/v [rows, hk, gen_len, dim] must have a unit stride in
    their last dimension (the engine's blocks are contiguous); dim a power of two >= 16."""
    import torch

    sink = sinks if sinks is not None else torch.empty(0, dtype=torch.float32, device=q.device)
    return _op()(q, prompt_k, prompt_v, gen_k, gen_v, prompt_len, gen_pos, sink, width, bucket, scale, window or 0)
