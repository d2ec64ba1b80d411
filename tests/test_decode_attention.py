"""The engine's Triton decode-attention kernel and its 32-bit sampling hash, on CPU.

The kernel runs here through Triton's interpreter on CPU tensors, in a pytest subprocess started with
TRITON_INTERPRET=1 (Triton reads it when it is first imported, which another test may already have done): the
same program the GPU compiles (masks, loops, online softmax, the GQA head mapping, strides), with its dot
products in fp32 (the interpreter multiplies bf16 as raw bits). Checked against attention written out by hand
over each row's prompt entries (its group's) then its own generated entries; then the whole engine, whose greedy
tokens and raw logprobs with the kernel equal those of the plain attention path. The hash: bit for bit the int64
hash it replaces, so every sampled token is unchanged."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from atropos_cli.inference import decode_attention as kernel
from atropos_cli.inference import engine as engine_module

INNER = os.environ.get("TRITON_INTERPRET") == "1"  # this file run again by test_kernel_tests_in_the_interpreter
needs_triton = pytest.mark.skipif(not kernel.available(), reason="triton is not installed (the dev extra has it)")
inner_only = pytest.mark.skipif(not INNER, reason="runs in test_kernel_tests_in_the_interpreter's subprocess")


@needs_triton
def test_kernel_tests_in_the_interpreter():
    """The kernel tests below, in a fresh interpreter with TRITON_INTERPRET=1 from the start."""
    if INNER:
        pytest.skip("the subprocess itself")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    select = "kernel_equals or kernel_in_the_engine"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k", select]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert re.search(r"\b10 passed", done.stdout), done.stdout[-2000:]


def by_hand(q, pk, pv, gk, gv, plen, gpos, width, bucket, scale, window=None, sinks=None):
    rows, hq, _ = q.shape
    hk = pk.shape[1]
    r = hq // hk
    out = torch.empty(q.shape, dtype=torch.float32)
    for s in range(rows):
        g, n_gen = s // width, min(int(gpos[s]) + 1, bucket)
        p = int(plen[g]) + int(gpos[s])  # the new token's position
        for h in range(hk):
            k = torch.cat([pk[g, h, : plen[g]], gk[s, h, :n_gen]]).float()
            v = torch.cat([pv[g, h, : plen[g]], gv[s, h, :n_gen]]).float()
            positions = torch.cat([torch.arange(int(plen[g])), int(plen[g]) + torch.arange(n_gen)])
            scores = q[s, h * r : (h + 1) * r].float() @ k.T * scale
            if window is not None:
                scores = scores.masked_fill(positions[None, :] <= p - window, float("-inf"))
            if sinks is not None:
                scores = torch.cat([scores, sinks[h * r : (h + 1) * r, None].float()], dim=1)
            weights = torch.softmax(scores, -1)[:, : k.shape[0]]
            out[s, h * r : (h + 1) * r] = weights @ v
    return out


@inner_only
@pytest.mark.parametrize(
    "groups,width,kv_heads,ratio,dim,prompt,gen,bucket,dtype,tol,window,sinks",
    [
        (3, 4, 2, 7, 64, 130, 80, 64, torch.float32, 1e-5, None, False),  # Qwen2.5-0.5B's heads; prompts past
        # one key block
        (2, 3, 2, 2, 16, 64, 256, 128, torch.bfloat16, 2e-2, None, False),  # the shipped model's; bucket < block
        (2, 2, 1, 1, 32, 10, 20, 20, torch.bfloat16, 2e-2, None, False),  # no GQA
        # sliding windows: inside the generation block only, across both blocks, past whole key blocks
        (3, 4, 2, 4, 32, 130, 80, 80, torch.float32, 1e-5, 8, False),
        (2, 2, 2, 2, 16, 150, 40, 40, torch.float32, 1e-5, 100, False),
        (2, 2, 2, 8, 64, 70, 30, 30, torch.float32, 1e-5, 70, True),  # window and sinks (gpt-oss)
        (2, 3, 1, 4, 16, 40, 20, 20, torch.bfloat16, 2e-2, None, True),  # sinks alone
    ],
)
def test_kernel_equals_attention_over_the_group_prompt_then_the_row(
    groups, width, kv_heads, ratio, dim, prompt, gen, bucket, dtype, tol, window, sinks
):
    assert kernel_error(groups, width, kv_heads, ratio, dim, prompt, gen, bucket, dtype, "cpu", window, sinks) < tol


def kernel_error(
    groups, width, kv_heads, ratio, dim, prompt, gen, bucket, dtype, device, window=None, sinks=False
) -> float:
    """The kernel on `device` against `by_hand` on the CPU, for random inputs of that shape: the largest error."""
    gen_ = torch.Generator().manual_seed(groups * dim)
    rows = groups * width
    rand = lambda *shape: torch.randn(*shape, generator=gen_).to(dtype)  # noqa: E731
    q = rand(rows, 1, kv_heads * ratio, dim).transpose(1, 2)[:, :, 0, :]  # the model's layout: strided heads
    pk, pv, gk, gv = (rand(*s) for s in [(groups, kv_heads, prompt, dim)] * 2 + [(rows, kv_heads, gen, dim)] * 2)
    plen = torch.randint(1, prompt + 1, (groups,), generator=gen_)
    plen[-1] = 1  # a free group slot keeps one entry
    gpos = torch.randint(0, gen, (rows,), generator=gen_)
    gpos[0] = 0  # a row's first generated token
    sink = torch.randn(kv_heads * ratio, generator=gen_) * 3 if sinks else None
    args = [t.to(device) for t in (q, pk, pv, gk, gv, plen, gpos)]
    on_device = sink.to(device) if sink is not None else None
    out = kernel.decode_attention(*args, width, bucket, dim**-0.5, window, on_device)
    assert out.device.type == torch.device(device).type and out.dtype == dtype and out.shape == q.shape
    expected = by_hand(q, pk, pv, gk, gv, plen, gpos, width, bucket, dim**-0.5, window, sink)
    return (out.float().cpu() - expected).abs().max().item()


@inner_only
def test_kernel_in_the_engine_decodes_as_plain_attention(monkeypatch):
    """The shipped model (head dim 16), greedy rows in groups: the same tokens and raw logprobs whichever
    attention the decode step uses."""
    assert_same_decoding_either_way(monkeypatch, "cpu", questions=3, tol=1e-4)


def assert_same_decoding_either_way(monkeypatch, device: str, questions: int, tol: float) -> None:
    """The shipped model in fp32 on `device`, two greedy rows per question: the engine gives the same tokens,
    finish reasons and logprobs (to `tol`) with the plain attention path and with the kernel."""
    from atropos_cli.inference.local import load_model
    from atropos_cli.inference.sampler import RowRequest
    from atropos_cli.resources import DEFAULT_MODEL

    state = load_model(DEFAULT_MODEL, device, "float32")
    tok = state.tokenizer
    rows = [
        RowRequest(prompt_ids=tok.encode(f"<|user|>What is {i} + {2 * i}?<|end|><|assistant|>"), max_new_tokens=12)
        for i in range(questions)
        for _ in range(2)
    ]
    shape = engine_module.engine_shape(rows, 8)
    results = {}
    for kind in ("plain", "triton"):
        monkeypatch.setattr(engine_module, "ATTENTION", kind)
        engine = engine_module.StaticEngine(state.model, tok, shape, sync_every=4)
        assert (engine.cache.decode_op is not None) == (kind == "triton")
        results[kind] = engine.run(rows)
    assert len(results["plain"]) == len(rows) > 0
    for a, b in zip(results["plain"], results["triton"], strict=True):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert a.logprobs == pytest.approx(b.logprobs, abs=tol)


@inner_only
@pytest.mark.parametrize("family", ["gpt_oss", "gemma3"])
def test_kernel_in_the_engine_decodes_windowed_families_as_plain_attention(monkeypatch, family):
    """Interleaved sliding windows (and gpt-oss's sinks) on rows running past the window: the kernel gives the
    plain path's tokens and raw logprobs (which tests/test_model_families.py checks against eager)."""
    from atropos_cli.families import build
    from atropos_cli.inference.sampler import RowRequest

    model = build(family, 512, tiny=True)

    class Tokenizer:
        pad_token_id, eos_token_id = 0, None

        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 511, (20,), generator=gen).tolist() for _ in range(2)]
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=20, temperature=t, seed=i)
        for p in prompts
        for i, t in enumerate((0.0, 1.0))
    ]
    shape = engine_module.engine_shape(rows, 4)
    results = {}
    for kind in ("plain", "triton"):
        monkeypatch.setattr(engine_module, "ATTENTION", kind)
        results[kind] = engine_module.StaticEngine(model, Tokenizer(), shape, sync_every=4).run(rows)
    for a, b in zip(results["plain"], results["triton"], strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) == 20
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_the_kernel_is_the_cuda_default_where_triton_imports_and_resolved_when_the_cache_is_built(monkeypatch):
    """The Triton kernel is the CUDA default (measured faster on an H100), torch's fused kernel where Triton is
    missing; the choice is read when an engine builds its cache, outside the compiled step."""
    from atropos_cli.inference import decode_attention

    monkeypatch.setattr(engine_module, "ATTENTION", None)
    assert engine_module.attention_kind(is_cuda=False) == "plain"
    assert engine_module.attention_kind(is_cuda=True) == ("triton" if decode_attention.available() else "fused")
    monkeypatch.setattr(decode_attention, "available", lambda: False)
    assert engine_module.attention_kind(is_cuda=True) == "fused"
    shape = engine_module.EngineShape(width=2, groups=1, prompt_len=8, gen_len=8)
    cache = engine_module.GroupCache(1, shape, heads=1, dim=16, dtype=torch.float32, device=torch.device("cpu"))
    assert cache.attention == "plain" and cache.decode_op is None


def test_the_32_bit_hash_is_the_64_bit_hash_bit_for_bit():
    """The [rows x vocabulary] noise in int32 (native on GPUs; int64 multiplies are emulated): the same bits as
    the masked int64 hash for every (seed, counter, vocab id), so a seeded row samples the same tokens."""
    mask = engine_module._MASK32
    gen = torch.Generator().manual_seed(0)
    seeds = torch.randint(0, 2**32, (32,), generator=gen)
    seeds[0] = 2**32 - 1  # the top bit set: negative once in int32
    counters = torch.randint(0, 10_000, (32,), generator=gen)
    vocab = 151_936
    row = engine_module._mix((seeds ^ engine_module._mix(counters & mask)) & mask)
    wide = engine_module._mix((row[:, None] + torch.arange(vocab)[None, :] * 0x1B873593) & mask)
    narrow = engine_module._mix32(row.to(torch.int32)[:, None] + torch.arange(vocab, dtype=torch.int32) * 0x1B873593)
    assert narrow.dtype == torch.int32 and torch.equal(narrow.long() & mask, wide)


def test_sampling_noise_is_uniform_and_the_same_in_any_slot():
    """The uniforms the sampler draws: mean 1/2, variance 1/12 over a vocabulary; a seeded row's noise does not
    depend on which slot it occupies (the sampler picks the same token for it in any batch)."""
    logits = torch.zeros(4, 50_000)
    ones = torch.ones(4)
    seeds = torch.tensor([7, 7, 8, 7])
    counters = torch.tensor([3, 3, 3, 4])
    token, _ = engine_module.sample_step(logits, ones, ones < 0, ones, seeds, counters, use_top_p=False)
    assert token[0] == token[1] and len({int(token[0]), int(token[2]), int(token[3])}) == 3
    vocab = torch.arange(50_000, dtype=torch.int32)
    bits = engine_module._mix32(torch.tensor([123], dtype=torch.int32)[:, None] + vocab * 0x1B873593)
    uniform = (((bits >> 8) & 0xFFFFFF).float() + 0.5) / 16777216.0
    assert abs(uniform.mean().item() - 0.5) < 0.01 and abs(uniform.var().item() - 1 / 12) < 0.005
