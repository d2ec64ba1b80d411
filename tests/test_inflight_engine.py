"""In-flight weight updates on the static engine (the CUDA engine, here on CPU in fp32): a version swapped in
between decode steps tags the later tokens with it, and the running rows keep their KV cache: the tokens after
the swap are exactly what the new weights give on top of the old weights' keys/values (not a recompute)."""

from __future__ import annotations

import torch

from atropos_cli.families import build
from atropos_cli.inference.engine import StaticEngine, engine_shape
from atropos_cli.inference.sampler import RowRequest, cache_kwarg
from test_model_families import TOL, VOCAB, _Tokenizer, sequences

SYNC = 4  # tokens per launch of decode steps: the swap points are this far apart


def _new_weights(model) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}


def _mixed_logprobs(prompt: list[int], tokens: list[int], first_new: int, new: dict, old: dict | None = None):
    """Each token's logprob when tokens[:first_new] came from the old weights (`old`, else the CPU build's) and
    the rest from `new` reading the old weights' cache: the old model runs prompt + tokens[:first_new - 1], the
    new one continues."""
    model = build("llama", VOCAB, tiny=True, attn_implementation="eager")
    if old is not None:
        model.load_state_dict(old)
    seq = prompt + tokens
    cut = len(prompt) + first_new - 1  # the input of the first forward after the swap
    from transformers import DynamicCache

    cache, kwarg = DynamicCache(config=model.config), cache_kwarg(model)
    with torch.no_grad():
        old = model(torch.tensor([seq[:cut]]), use_cache=True, **{kwarg: cache})
        model.load_state_dict(new)
        rest = model(torch.tensor([seq[cut:-1]]), use_cache=True, **{kwarg: cache}).logits[0]
    logits = torch.cat([old.logits[0], rest]).float()[len(prompt) - 1 :]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def _recomputed_logprobs(prompt: list[int], tokens: list[int], new: dict) -> torch.Tensor:
    model = build("llama", VOCAB, tiny=True, attn_implementation="eager")
    model.load_state_dict(new)
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()[len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(tokens)[:, None])[:, 0]


def test_a_version_swapped_mid_generation_tags_later_tokens_and_keeps_the_kv_cache():
    model = build("llama", VOCAB, tiny=True)
    new = _new_weights(model)
    prompts = [p[:12] for p in sequences(2, seed=3)]
    rows = [RowRequest(prompt_ids=p, max_new_tokens=24, temperature=t, seed=5 * i + j)
            for i, p in enumerate(prompts) for j, t in enumerate((0.0, 1.0))]  # fmt: skip
    calls = []

    def swap() -> int:  # the third swap point: two launches (and the prefill) ran on version 0
        calls.append(len(calls))
        if len(calls) == 3:
            state = model.state_dict()
            with torch.no_grad():
                for key, value in new.items():
                    state[key].copy_(value)  # in place, as the weight receiver copies
        return 0 if len(calls) < 3 else 1

    engine = StaticEngine(model, _Tokenizer(), engine_shape(rows, 8), sync_every=SYNC)
    results = engine.run(rows, swap=swap)
    first_new = 1 + 2 * SYNC  # the prefill's token, then two launches of SYNC tokens each
    for row, result in zip(rows, results, strict=True):
        assert len(result.token_ids) == 24
        assert result.versions == [0] * first_new + [1] * (24 - first_new)
        mixed = _mixed_logprobs(row.prompt_ids, result.token_ids, first_new, new)
        got = torch.tensor(result.logprobs)
        assert (got - mixed).abs().max().item() < TOL
        # what dropping the cache (a recompute under the new weights) would give: far from what the engine gave
        recomputed = _recomputed_logprobs(row.prompt_ids, result.token_ids, new)[first_new:]
        assert (got[first_new:] - recomputed).abs().max().item() > 100 * TOL


def test_without_swap_points_no_versions_are_kept_and_a_cut_row_keeps_one_version_per_token():
    model = build("llama", VOCAB, tiny=True)
    rows = [RowRequest(prompt_ids=sequences(1, seed=3)[0][:12], max_new_tokens=6, temperature=1.0, seed=1)]
    engine = StaticEngine(model, _Tokenizer(), engine_shape(rows, 8), sync_every=SYNC)
    (plain,) = engine.run(rows)
    assert plain.versions is None and len(plain.token_ids) == 6
    versions = iter(range(100))
    (tagged,) = engine.run(rows, swap=lambda: next(versions))  # the prefill and launch 1 at 0, launch 2 at 1
    assert tagged.token_ids == plain.token_ids and tagged.versions == [0] * 5 + [1]
