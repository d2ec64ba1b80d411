"""The static engine (the CUDA default of the local backend) keeps the sampling contract, checked on CPU where it
runs the same step eagerly: the same greedy tokens, finish reasons and text as the loop sampler; raw logprobs
equal to a forward pass; seeded rows reproducible whatever the slot count; stop strings cut where a per-token
check would; rows queued behind full slots (continuous batching) and a ring that wraps."""

from __future__ import annotations

import pytest
import torch

from atropos_cli.inference.engine import StaticEngine, _chunks, decode_attention, ring_length
from atropos_cli.inference.local import load_model
from atropos_cli.inference.sampler import RowRequest, sample_rows
from atropos_cli.resources import DEFAULT_MODEL
from tiny_models import tiny_causal_lm


@pytest.fixture(scope="module")
def shipped():
    state = load_model(DEFAULT_MODEL, "cpu", "float32")
    return state.model, state.tokenizer


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [tokenizer.encode(f"<|user|>What is {i} + {3 * i + 1}?<|end|><|assistant|>") for i in range(n)]


def test_greedy_rows_match_the_loop_sampler(shipped):
    model, tokenizer = shipped
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=6 + i % 5, temperature=0.0)
        for i, p in enumerate(prompts(tokenizer, 11))
    ]
    expected = sample_rows(model, tokenizer, rows)
    got = StaticEngine(model, tokenizer, slots=4, length=ring_length(rows), sync_every=3).run(rows)  # 11 rows queue
    for a, b in zip(expected, got, strict=True):
        assert (b.token_ids, b.finish_reason, b.text) == (a.token_ids, a.finish_reason, a.text)
        assert b.logprobs == pytest.approx(a.logprobs, abs=1e-4)
    assert {r.finish_reason for r in got} <= {"stop", "length"}


def test_sampled_rows_have_raw_logprobs_and_are_reproducible(shipped):
    model, tokenizer = shipped
    ps = prompts(tokenizer, 7)
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=12, temperature=0.7 + 0.2 * i, top_p=0.8 if i % 2 else 1.0, seed=i)
        for i, p in enumerate(ps)
    ]
    first = StaticEngine(model, tokenizer, slots=2, length=ring_length(rows), sync_every=4).run(rows)
    again = StaticEngine(model, tokenizer, slots=8, length=ring_length(rows), sync_every=7).run(rows)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    other_seed = [RowRequest(**{**vars(r), "seed": r.seed + 100}) for r in rows]
    assert [r.token_ids for r in StaticEngine(model, tokenizer, 8, ring_length(rows)).run(other_seed)] != [
        r.token_ids for r in first
    ]
    for p, r in zip(ps, first, strict=True):
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([p + r.token_ids])).logits[0].float(), -1)
        forward = [float(logp[len(p) - 1 + j, t]) for j, t in enumerate(r.token_ids)]
        assert r.logprobs == pytest.approx(forward, abs=1e-4)


def test_stop_strings_cut_like_a_per_token_check(shipped):
    model, tokenizer = shipped
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=10, temperature=0.0, stop=["1", "3"]) for p in prompts(tokenizer, 9)
    ]
    expected = sample_rows(model, tokenizer, rows)
    got = StaticEngine(model, tokenizer, slots=4, length=ring_length(rows), sync_every=8).run(rows)
    assert [(r.token_ids, r.text, r.finish_reason) for r in got] == [
        (r.token_ids, r.text, r.finish_reason) for r in expected
    ]
    assert any(r.finish_reason == "stop" and r.token_ids[-1] != tokenizer.eos_token_id for r in got)


def test_a_wrapping_ring_and_gqa_decode_attention_match_a_full_forward():
    """A GQA model (decode_attention folds query heads), long rows through a short ring with rows queued."""
    model = tiny_causal_lm("qwen", 89, seed=1).eval()

    class Ids:
        eos_token_id, pad_token_id = None, 0

        def decode(self, ids, skip_special_tokens=True):
            return " ".join(map(str, ids))

    gen = torch.Generator().manual_seed(0)
    ps = [torch.randint(1, 89, (n,), generator=gen).tolist() for n in (3, 9, 5, 12, 7)]
    rows = [RowRequest(prompt_ids=p, max_new_tokens=20, temperature=1.0, seed=i) for i, p in enumerate(ps)]
    out = StaticEngine(model, Ids(), slots=2, length=40, sync_every=6).run(rows)  # the cursor wraps the ring
    for p, r in zip(ps, out, strict=True):
        assert len(r.token_ids) == 20 and r.finish_reason == "length"
        with torch.no_grad():
            logp = torch.log_softmax(model(torch.tensor([p + r.token_ids])).logits[0].float(), -1)
        forward = [float(logp[len(p) - 1 + j, t]) for j, t in enumerate(r.token_ids)]
        assert r.logprobs == pytest.approx(forward, abs=1e-4)
    q, k, v = torch.randn(3, 4, 1, 8), torch.randn(3, 2, 6, 8), torch.randn(3, 2, 6, 8)
    mask = torch.rand(3, 1, 1, 6) > 0.3
    mask[..., 0] = True
    folded, _ = decode_attention(None, q, k, v, mask, scaling=0.3)
    reference = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), attn_mask=mask, scale=0.3
    )
    assert torch.allclose(folded, reference.transpose(1, 2), atol=1e-6)


def test_prefill_chunks_stay_within_the_token_budget():
    assert _chunks([10, 10, 10, 10], 25) == [(0, 2), (2, 4)]
    assert _chunks([100, 1, 1], 50) == [(0, 1), (1, 3)]  # one oversized prompt still gets its own chunk
    assert ring_length([RowRequest(prompt_ids=[1] * 200, max_new_tokens=100)]) == 384
