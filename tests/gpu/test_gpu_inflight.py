"""In-flight weight updates on the CUDA engine at its default (compiled step, captured graphs, one replay ahead):
weights copied in place at a swap point reach the next replay, not the one in flight; the later tokens carry the
new version and come from the new weights reading the running rows' old KV cache. The CPU suite checks the same
in fp32 (tests/test_inflight_engine.py); the reference here is that fp32 CPU forward, within TF32's noise."""

from __future__ import annotations

import torch

from atropos_cli.families import build
from atropos_cli.inference.engine import StaticEngine, engine_shape
from atropos_cli.inference.sampler import RowRequest
from test_inflight_engine import _mixed_logprobs, _new_weights, _recomputed_logprobs
from test_model_families import VOCAB, _Tokenizer, sequences

SYNC = 8  # the engine's default replay length


def test_a_version_swapped_between_replays_on_cuda(cuda):
    model = build("llama", VOCAB, tiny=True, device=cuda)
    old = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}  # CUDA's init differs from CPU's
    new = {k: v.to(cuda) for k, v in _new_weights(build("llama", VOCAB, tiny=True)).items()}
    prompts = [p[:12] for p in sequences(2, seed=3)]
    rows = [RowRequest(prompt_ids=p, max_new_tokens=40, temperature=t, seed=5 * i + j)
            for i, p in enumerate(prompts) for j, t in enumerate((0.0, 1.0))]  # fmt: skip
    calls = []

    def swap() -> int:
        calls.append(1)
        if len(calls) == 3:
            state = model.state_dict()
            with torch.no_grad():
                for key, value in new.items():
                    state[key].copy_(value)
        return 0 if len(calls) < 3 else 1

    results = StaticEngine(model, _Tokenizer(), engine_shape(rows, 8)).run(rows, swap=swap)
    first_new = 1 + 2 * SYNC
    cpu_new = {k: v.cpu() for k, v in new.items()}
    for row, result in zip(rows, results, strict=True):
        assert result.versions == [0] * first_new + [1] * (40 - first_new)
        got = torch.tensor(result.logprobs)
        mixed = _mixed_logprobs(row.prompt_ids, result.token_ids, first_new, cpu_new, old)
        assert (got - mixed).abs().max().item() < 5e-3
        recomputed = _recomputed_logprobs(row.prompt_ids, result.token_ids, cpu_new)[first_new:]
        assert (got[first_new:] - recomputed).abs().max().item() > 0.1
