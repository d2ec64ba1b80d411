"""Every model family's exact attention on the GPU: the engine's decode path at its CUDA defaults (the Triton
kernel with windows and sinks; the plain path for soft-capped scores) and the trainer's CUDA packing (the varlen
flash kernel with the window; padded rows for sinks and soft-caps), against transformers' eager forward of the
same tokens in fp32. The CPU suite checks the same in fp32 within 2e-4 (tests/test_model_families.py); here the
engine runs fp32 weights through TF32 dot products and the trainer computes in bf16, so the bound is that noise,
far below what a wrong window costs (sequences are five windows long)."""

from __future__ import annotations

import pytest
import torch

from atropos_cli.families import FAMILIES, build
from atropos_cli.inference.engine import StaticEngine, engine_shape
from atropos_cli.inference.sampler import RowRequest
from test_model_families import VOCAB, _groups, _Tokenizer, sequences


def reference(name: str, tokens: list[int], device: str) -> torch.Tensor:
    model = build(name, VOCAB, tiny=True, attn_implementation="eager", device=device)
    with torch.no_grad():
        logits = model(torch.tensor([tokens], device=device)).logits[0].float()
    target = torch.tensor(tokens[1:], device=device)[:, None]
    return torch.log_softmax(logits[:-1], -1).gather(1, target)[:, 0].cpu()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_engine_on_cuda_equals_the_eager_forward(cuda, name):
    model = build(name, VOCAB, tiny=True, device=cuda)
    prompts = [p[:20] for p in sequences(2, seed=1)]
    rows = [RowRequest(prompt_ids=p, max_new_tokens=24, temperature=t, seed=i) for p in prompts for i, t in
            enumerate((0.0, 1.0))]  # fmt: skip
    results = StaticEngine(model, _Tokenizer(), engine_shape(rows, 8)).run(rows)  # the CUDA default: compiled
    assert len(results) == 4
    for row, result in zip(rows, results, strict=True):
        expected = reference(name, row.prompt_ids + result.token_ids, cuda)[len(row.prompt_ids) - 1 :]
        assert len(result.logprobs) == len(expected) == 24
        err = (torch.tensor(result.logprobs) - expected).abs().max().item()
        assert err < 5e-3, f"{name}: engine logprobs on CUDA differ from eager by {err:.2e}"


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_trainer_on_cuda_equals_the_eager_forward(cuda, name):
    from atropos_cli.trainer.step.batching import prepare
    from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer

    seqs = sequences(3, seed=2)
    model = build(name, VOCAB, tiny=True, device=cuda)
    trainer = GRPOTrainer(GRPOConfig(out="unused", device=cuda, compile=False, cuda_graphs=False), model=model)
    samples = prepare(_groups(seqs), scale_rewards=True, dynamic_sampling=False, max_len=128).samples
    batches = list(trainer._micro_batches(samples))
    assert batches, "the trainer laid out no micro-batch"
    got = {}
    with torch.no_grad():
        for mb in batches:
            logp = trainer._logprobs(trainer.model, mb.to(cuda)).float().cpu()
            mask = mb.loss_mask.cpu()
            for i in range(mask.shape[0]):
                row = logp[i][mask[i] == 1]
                got[len(row)] = row
    for seq in seqs:
        expected = reference(name, seq, cuda)[5:]
        err = (got[len(expected)] - expected).abs()
        assert err.mean().item() < 0.02 and err.max().item() < 0.15, (
            f"{name} ({trainer.pack}): trainer logprobs on CUDA differ from eager by {err.mean():.3f} mean, "
            f"{err.max():.3f} max"
        )
