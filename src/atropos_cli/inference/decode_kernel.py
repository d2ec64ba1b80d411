"""The Triton program behind `decode_attention.py` (imported only once Triton is known to import, by its op).

`decode_kernel` runs one program per (row, KV head): the KV head's query heads (padded to R_PAD rows for
`tl.dot`) attend with one online softmax to the group's prompt entries [0, prompt_len[group]), then to the row's
own generated entries [0, gen_pos[row]] (at most `bucket`); `_attend` is that softmax over one block, the same for
both parts. A sliding window starts each part at the first entry inside it (whole key blocks before it are never
read); sinks (HAS_SINKS) add one logit per query head to the denominator at the end. UPCAST runs the dot products
in fp32 (Triton's interpreter multiplies bf16 as raw bits: tests only).
"""

import triton
import triton.language as tl


@triton.jit
def _attend(
    q, k_ptr, v_ptr, base, stride_pos, first, length, scale, m, total, acc,
    D: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    """(m, total, acc) carried on over the block's entries [first, length): the running max, the sum of the
    exponentials and the weighted values of each query row."""
    offs_n = tl.arange(0, BLOCK)
    offs_d = tl.arange(0, D)
    for start in range((first // BLOCK) * BLOCK, length, BLOCK):
        pos = start + offs_n
        ok = (pos >= first) & (pos < length)
        k = tl.load(k_ptr + base + pos[:, None] * stride_pos + offs_d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(v_ptr + base + pos[:, None] * stride_pos + offs_d[None, :], mask=ok[:, None], other=0.0)
        if UPCAST:
            k, v = k.to(tl.float32), v.to(tl.float32)
        s = (tl.dot(q, tl.trans(k)) * scale).to(tl.float32)  # inductor may hand `scale` in as fp64
        s = tl.where(ok[None, :], s, -1.0e30)
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.where(ok[None, :], tl.exp(s - m_new[:, None]), 0.0)  # a block wholly outside adds nothing
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    return m, total, acc


@triton.jit
def decode_kernel(
    q_ptr, pk_ptr, pv_ptr, gk_ptr, gv_ptr, plen_ptr, gpos_ptr, sinks_ptr, out_ptr,
    sq_row, sq_head,
    sp_group, sp_head, sp_pos,
    sg_row, sg_head, sg_pos,
    so_row, so_head,
    width, bucket, scale, window,
    R: tl.constexpr, R_PAD: tl.constexpr, D: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    head = tl.program_id(1)
    group = row // width
    offs_r = tl.arange(0, R_PAD)
    offs_d = tl.arange(0, D)
    r_ok = offs_r < R
    q_heads = head * R + offs_r
    q = tl.load(q_ptr + row * sq_row + q_heads[:, None] * sq_head + offs_d[None, :], mask=r_ok[:, None], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([R_PAD], -1.0e30, dtype=tl.float32)
    total = tl.zeros([R_PAD], dtype=tl.float32)
    acc = tl.zeros([R_PAD, D], dtype=tl.float32)
    plen = tl.load(plen_ptr + group).to(tl.int32)  # the group's shared prompt entries
    gpos = tl.load(gpos_ptr + row).to(tl.int32)  # the row's new token: position plen + gpos
    # the window: entries at positions > (plen + gpos) - window (no window: `window` is larger than any position)
    p_first = tl.maximum(plen + gpos - window + 1, 0)
    m, total, acc = _attend(
        q, pk_ptr, pv_ptr, group * sp_group + head * sp_head, sp_pos, p_first, plen, scale, m, total, acc,
        D, BLOCK, UPCAST,
    )  # fmt: skip
    glen = tl.minimum(gpos + 1, bucket)  # the row's own, up to its new token
    g_first = tl.maximum(gpos - window + 1, 0)
    m, total, acc = _attend(
        q, gk_ptr, gv_ptr, row * sg_row + head * sg_head, sg_pos, g_first, glen, scale, m, total, acc,
        D, BLOCK, UPCAST,
    )  # fmt: skip
    if HAS_SINKS:  # one more logit per query head in the denominator, with no value behind it
        sink = tl.load(sinks_ptr + q_heads, mask=r_ok, other=-1.0e30).to(tl.float32)
        m_new = tl.maximum(m, sink)
        alpha = tl.exp(m - m_new)
        total = total * alpha + tl.exp(sink - m_new)
        acc = acc * alpha[:, None]
    out = acc / total[:, None]
    tl.store(
        out_ptr + row * so_row + q_heads[:, None] * so_head + offs_d[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=r_ok[:, None],
    )
