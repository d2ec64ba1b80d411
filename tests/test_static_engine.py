"""The static engine (the CUDA default of the local backend) keeps the sampling contract, checked on CPU where it
runs the same step eagerly: the same greedy tokens, finish reasons and text as the loop sampler; raw logprobs
equal to a forward pass; seeded rows reproducible whatever the slot count; stop strings cut where a per-token
check would; groups queued behind full group slots (continuous batching); a group's rows sharing one prompt
block give what they give alone; the split attention equals attention over prompt + generated tokens."""

from __future__ import annotations

import pytest
import torch

from atropos_cli.inference.engine import (
    EngineShape,
    GroupCache,
    StaticEngine,
    _chunks,
    engine_shape,
    gen_bucket,
    group_attention,
    sample_step,
)
from atropos_cli.inference.local import load_model
from atropos_cli.inference.sampler import RowRequest, sample_rows
from atropos_cli.resources import DEFAULT_MODEL
from tiny_models import tiny_causal_lm


@pytest.fixture(scope="module")
def shipped():
    state = load_model(DEFAULT_MODEL, "cpu", "float32")
    return state.model, state.tokenizer


def engine(model, tokenizer, rows, max_rows: int, sync_every: int = 8) -> StaticEngine:
    return StaticEngine(model, tokenizer, engine_shape(rows, max_rows), sync_every=sync_every)


def prompts(tokenizer, n: int) -> list[list[int]]:
    return [tokenizer.encode(f"<|user|>What is {i} + {3 * i + 1}?<|end|><|assistant|>") for i in range(n)]


def test_greedy_rows_match_the_loop_sampler(shipped):
    model, tokenizer = shipped
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=6 + i % 5, temperature=0.0)
        for i, p in enumerate(prompts(tokenizer, 11))
    ]
    expected = sample_rows(model, tokenizer, rows)
    got = engine(model, tokenizer, rows, 4, sync_every=3).run(rows)  # 11 rows queue
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
    first = engine(model, tokenizer, rows, 2, sync_every=4).run(rows)
    again = engine(model, tokenizer, rows, 8, sync_every=7).run(rows)
    assert [r.token_ids for r in first] == [r.token_ids for r in again]
    other_seed = [RowRequest(**{**vars(r), "seed": r.seed + 100}) for r in rows]
    assert [r.token_ids for r in engine(model, tokenizer, rows, 8).run(other_seed)] != [r.token_ids for r in first]
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
    got = engine(model, tokenizer, rows, 4).run(rows)
    assert [(r.token_ids, r.text, r.finish_reason) for r in got] == [
        (r.token_ids, r.text, r.finish_reason) for r in expected
    ]
    assert any(r.finish_reason == "stop" and r.token_ids[-1] != tokenizer.eos_token_id for r in got)


class Ids:
    eos_token_id, pad_token_id = None, 0

    def decode(self, ids, skip_special_tokens=True):
        return " ".join(map(str, ids))


def forward_logprobs(model, prompt, tokens) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([prompt + tokens])).logits[0].float(), -1)
    return [float(logp[len(prompt) - 1 + j, t]) for j, t in enumerate(tokens)]


def test_groups_share_a_prompt_block_and_match_rows_alone():
    """A GQA model; groups of 3 and 5 rows (one larger than the width: two chunks), more groups than slots (they
    queue), each row's tokens equal to the same seeded row decoded with a prompt block of its own."""
    model = tiny_causal_lm("qwen", 89, seed=1).eval()
    gen = torch.Generator().manual_seed(0)
    ps = [torch.randint(1, 89, (n,), generator=gen).tolist() for n in (3, 9, 5, 12, 7)]
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=20 + 3 * k, temperature=1.0, seed=10 * i + k)
        for i, p in enumerate(ps)
        for k in range(5 if i == 1 else 3)
    ]
    shape = engine_shape(rows, 16)
    assert (shape.width, shape.groups) == (4, 4)  # width: the most common group size (3) rounded up; 16 rows
    grouped = StaticEngine(model, Ids(), EngineShape(4, 2, shape.prompt_len, shape.gen_len), sync_every=6).run(rows)
    alone = StaticEngine(model, Ids(), EngineShape(1, 8, shape.prompt_len, shape.gen_len), sync_every=5).run(rows)
    for row, a, b in zip(rows, grouped, alone, strict=True):
        assert a.token_ids == b.token_ids and len(a.token_ids) == row.max_new_tokens and a.finish_reason == "length"
        assert a.logprobs == pytest.approx(forward_logprobs(model, row.prompt_ids, a.token_ids), abs=1e-4)
    assert len({tuple(r.token_ids) for r in grouped[:3]}) == 3  # a group's rows sample apart (their own seeds)


def test_group_attention_equals_attention_over_prompt_and_generated_tokens():
    """2 group slots x 3 rows, 4 query heads on 2 KV heads: the split softmax against a plain SDPA over each row's
    prompt entries (its group's) followed by its own generated entries."""
    torch.manual_seed(0)
    shape = EngineShape(width=3, groups=2, prompt_len=8, gen_len=8)
    cache = GroupCache(1, shape, heads=2, dim=4, dtype=torch.float32, device=torch.device("cpu"))
    for t in (cache.prompt_k[0], cache.prompt_v[0], cache.gen_k[0], cache.gen_v[0]):
        t.copy_(torch.randn_like(t))
    cache.prompt_len.copy_(torch.tensor([5, 8]))
    cache.gen_pos.copy_(torch.tensor([0, 3, 6, 1, 7, 2]))
    cache.bucket = 8
    cache.refresh_masks()
    q = torch.randn(6, 4, 1, 4)

    class Layer:
        layer_idx = 0

    out, _ = group_attention(Layer(), q, None, None, None, scaling=0.4, atropos_kv=cache)
    for row in range(6):
        g, n_p, n_g = row // 3, int(cache.prompt_len[row // 3]), int(cache.gen_pos[row]) + 1
        k = torch.cat([cache.prompt_k[0][g, :, :n_p], cache.gen_k[0][row, :, :n_g]], 1).repeat_interleave(2, 0)
        v = torch.cat([cache.prompt_v[0][g, :, :n_p], cache.gen_v[0][row, :, :n_g]], 1).repeat_interleave(2, 0)
        ref = torch.nn.functional.scaled_dot_product_attention(q[row], k, v, scale=0.4)  # [4, 1, 4]
        assert torch.allclose(out[row, 0], ref[:, 0], atol=1e-5)


def test_a_prompt_that_came_twice_does_not_widen_the_engine():
    """Two items of a step with the same prompt make one group of 16 among groups of 8: the engine keeps the
    width of the step's groups (the 16 run as two chunks) instead of a second engine twice as wide."""

    def group(prompt: list[int], n: int) -> list[RowRequest]:
        return [RowRequest(prompt_ids=prompt, max_new_tokens=16, seed=k) for k in range(n)]

    rows = [row for g in range(30) for row in group([g + 1] * 5, 8)] + group([99] * 5, 16)
    shape = engine_shape(rows, 512)
    assert (shape.width, shape.groups) == (8, 32)  # 32 chunks of 8 rows: the 256 rows at once
    assert engine_shape(group([1], 3) + group([2], 5) + group([3], 5), 64).width == 8  # a tie: the larger
    assert engine_shape(group([1], 8), 4).width == 4  # at most the batch cap


def test_prefill_chunks_stay_within_the_token_budget():
    assert _chunks([10, 10, 10, 10], 25) == [(0, 2), (2, 4)]
    assert _chunks([100, 1, 1], 50) == [(0, 1), (1, 3)]  # one oversized prompt still gets its own chunk
    assert engine_shape([RowRequest(prompt_ids=[1] * 200, max_new_tokens=100)], 8) == EngineShape(1, 8, 256, 128)
    assert [gen_bucket(n) for n in (1, 128, 129, 200, 256)] == [128, 128, 256, 256, 256]


def test_a_batch_that_ends_by_length_runs_no_replay_past_its_budget():
    """The loop launches the next steps before it reads the last ones; it stops launching once no row can need
    more: 1 prefill token + 16 decode steps at 4 a launch is 4 launches, not 5."""
    model = tiny_causal_lm("qwen", 89, seed=1).eval()
    rows = [RowRequest(prompt_ids=[3, 4, 5 + i // 4], max_new_tokens=17, seed=i) for i in range(8)]
    eng = StaticEngine(model, Ids(), engine_shape(rows, 8), sync_every=4)
    launches = []
    original = eng._run_steps
    eng._run_steps = lambda top_p, bucket: (launches.append(bucket), original(top_p, bucket))  # type: ignore[method-assign]
    out = eng.run(rows)
    assert [len(r.token_ids) for r in out] == [17] * 8 and len(launches) == 4


def test_the_compiled_step_fuses_projections_and_follows_weight_syncs():
    """The compiled decode step (inductor, here on CPU) runs q/k/v and gate/up as one matrix product each over
    weights laid end to end, with the same tokens and logprobs as the eager step; an in-place weight sync (what
    `copy_weights` does) reaches the fused products, with no rebuild."""
    import atropos_cli.inference.engine as engine_module
    from atropos_cli.inference import fuse

    model = tiny_causal_lm("qwen", 89, seed=1).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert fuse.share_storage(model) == 4 and fuse.share_storage(model) == 0  # 2 layers x 2 groups, once
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # same names, same values
    fused = []

    def counting(gm, example_inputs):
        fused.append(fuse.fuse_linears(gm, example_inputs))
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    rows = [RowRequest(prompt_ids=[3, 4, 5 + i // 4], max_new_tokens=9, seed=i) for i in range(8)]
    shape = engine_shape(rows, 8)
    compile_fn = engine_module._compiled

    def compiled_counting(fn, backend="inductor"):
        return compile_fn(fn, counting if backend is fuse.backend else backend)

    engine_module._compiled = compiled_counting
    try:
        compiled = StaticEngine(model, Ids(), shape, sync_every=4, compile_step=True)
        got = compiled.run(rows)
    finally:
        engine_module._compiled = compile_fn
    assert fused == [4]
    eager = StaticEngine(model, Ids(), shape, sync_every=4, compile_step=False).run(rows)
    for a, b in zip(got, eager, strict=True):
        assert a.token_ids == b.token_ids and a.logprobs == pytest.approx(b.logprobs, abs=1e-4)
    other = tiny_causal_lm("qwen", 89, seed=2).eval()
    with torch.no_grad():
        for key, tensor in model.state_dict().items():
            tensor.copy_(other.state_dict()[key])
    synced = compiled.run(rows)
    fresh = StaticEngine(other, Ids(), shape, sync_every=4, compile_step=False).run(rows)
    assert [r.token_ids for r in synced] == [r.token_ids for r in fresh] != [r.token_ids for r in got]
    for a, b in zip(synced, fresh, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_the_two_stage_vocabulary_reductions_equal_the_plain_ones():
    """The sampler reduces over the vocabulary in chunks (more parallel rows on a GPU): the same token as argmax,
    ties included (the first maximum), and the same log-sum-exp within fp32 rounding."""
    from atropos_cli.inference.engine import _argmax, _vocab_chunks

    assert [_vocab_chunks(v) for v in (151936, 32000, 384, 151665)] == [64, 16, 1, 1]
    gen = torch.Generator().manual_seed(0)
    ties = torch.randint(0, 4, (16, 151936), generator=gen).float()  # every row has thousands of maxima
    assert torch.equal(_argmax(ties), ties.argmax(-1))
    logits = torch.randn(16, 32000, generator=gen) * 5
    assert torch.equal(_argmax(logits), logits.argmax(-1))
    ones = torch.ones(16)
    seeds, counters = torch.arange(16), torch.full((16,), 3)
    token, logp = sample_step(logits, ones, ones > 0, ones, seeds, counters, use_top_p=False)  # greedy rows
    assert torch.equal(token, logits.argmax(-1))
    assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(1, token[:, None])[:, 0], atol=1e-5)
