"""Every model family gets exactly its own attention, in the engine and in the trainer.

For each family's tiny shape (`atropos_cli.families`: windows of 8 tokens, interleaved layer kinds, sinks,
soft-caps, qk-norm, partial rotary, NoPE layers, llama3 and yarn rope, experts) on sequences of ~44 tokens,
five times the window, three sets of logprobs are checked against transformers' eager forward of the same
tokens: the engine's sampled-token logprobs (its prefill and decode attention, on CPU the plain path), the
trainer's logprobs on padded rows, and the trainer's logprobs on packed rows (CPU `--pack` rows and the CUDA
default's varlen layout, here through its dense reference). A model the engine cannot drive exactly is refused."""

from __future__ import annotations

import pytest
import torch

from atropos_cli.families import FAMILIES, build
from atropos_cli.inference.engine import StaticEngine, engine_shape, refusal
from atropos_cli.inference.sampler import RowRequest
from atropos_cli.trainer.step.batching import StaticShape, micro_batches, prepare, static_micro_batches
from atropos_cli.trainer.step.grpo import GRPOConfig, GRPOTrainer
from atropos_cli.types import ScoredGroup

FAMILY_NAMES = sorted(FAMILIES)
VOCAB = 512
TOL = 2e-4  # fp32 on CPU: the paths differ only in summation order


class _Tokenizer:
    """What the engine asks of a tokenizer: ids to text, a pad id; no EOS, so every row runs its full length."""

    pad_token_id = 0
    eos_token_id = None

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return " ".join(str(i) for i in ids)

    def convert_tokens_to_ids(self, token):
        return None


def reference_logprobs(name: str, tokens: list[int]) -> torch.Tensor:
    """log p(token t | tokens < t) for t >= 1 from transformers' eager forward (fp32)."""
    model = build(name, VOCAB, tiny=True, attn_implementation="eager")
    with torch.no_grad():
        logits = model(torch.tensor([tokens])).logits[0].float()
    return torch.log_softmax(logits[:-1], -1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]


def sequences(n: int, seed: int) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, VOCAB - 1, (30 + 7 * i,), generator=gen).tolist() for i in range(n)]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_engine_logprobs_equal_the_eager_forward(name):
    """Greedy and sampled rows, two groups sharing prompts longer than the window: each sampled token's raw
    logprob equals the eager forward's over prompt + sampled tokens."""
    model = build(name, VOCAB, tiny=True)
    assert refusal(model) is None
    prompts = [p[:20] for p in sequences(2, seed=1)]
    rows = [
        RowRequest(prompt_ids=p, max_new_tokens=24, temperature=t, seed=7 * i + j)
        for i, p in enumerate(prompts)
        for j, t in enumerate((0.0, 1.0, 1.0))
    ]
    results = StaticEngine(model, _Tokenizer(), engine_shape(rows, 8), sync_every=5).run(rows)
    assert len(results) == len(rows)
    checked = 0
    for row, result in zip(rows, results, strict=True):
        tokens = row.prompt_ids + result.token_ids
        expected = reference_logprobs(name, tokens)[len(row.prompt_ids) - 1 :]
        assert len(result.logprobs) == len(expected) > 8  # past the window
        err = (torch.tensor(result.logprobs) - expected).abs().max().item()
        assert err < TOL, f"{name}: engine logprobs differ from eager by {err:.2e}"
        checked += 1
    assert checked == 6


def _groups(seqs: list[list[int]]) -> list[ScoredGroup]:
    prompt = 6
    return [
        ScoredGroup(
            tokens=seqs,
            masks=[[-100] * prompt + s[prompt:] for s in seqs],
            scores=[1.0, 0.0, 0.5][: len(seqs)],
            generation_params={"temperature": 1.0},
            inference_logprobs=[[-1.0] * len(s) for s in seqs],
        )
    ]


def _trainer_logprobs(name: str, layout: str, seqs: list[list[int]]) -> list[torch.Tensor]:
    """The trainer's logprobs of each sample's trained tokens in one micro-batch layout."""
    from atropos_cli.trainer.step.attention import use_varlen

    model = build(name, VOCAB, tiny=True)
    trainer = GRPOTrainer(GRPOConfig(out="unused", chunk_size=16, pack=layout == "rows"), model=model)
    samples = prepare(_groups(seqs), scale_rewards=True, dynamic_sampling=False, max_len=128).samples
    if layout == "varlen":
        use_varlen(model)
        batches = static_micro_batches(samples, StaticShape(width=128, max_doc_len=64, max_docs=6))
    else:
        batches = micro_batches(samples, max_tokens=160, pack=layout == "rows")
    assert len(batches) == 1 and batches[0].loss_mask.shape[0] == len(seqs)
    batch = batches[0]
    if layout != "padded":
        assert batch.input_ids.shape[0] == 1  # every sample in one packed row
    with torch.no_grad():
        logp = trainer._logprobs(model, batch)
    rows = [logp[i][batch.loss_mask[i] == 1] for i in range(len(seqs))]
    by_length = {len(row): row for row in rows}  # the layouts order samples their own way; lengths differ
    return [by_length[len(s) - 6] for s in seqs]


@pytest.mark.parametrize("layout", ["padded", "rows", "varlen"])
@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_trainer_logprobs_equal_the_eager_forward(name, layout):
    seqs = sequences(3, seed=2)
    got = _trainer_logprobs(name, layout, seqs)
    for seq, logp in zip(seqs, got, strict=True):
        expected = reference_logprobs(name, seq)[5:]  # the tokens after the 6-token prompt
        assert logp.shape == expected.shape and len(seq) > 3 * 8
        err = (logp - expected).abs().max().item()
        assert err < TOL, f"{name} ({layout}): trainer logprobs differ from eager by {err:.2e}"


def test_a_model_the_engine_cannot_drive_exactly_is_refused():
    model = build("gemma3", VOCAB, tiny=True)
    model.config.use_bidirectional_attention = True
    assert refusal(model) == "bidirectional attention"
    model = build("llama", VOCAB, tiny=True)
    model.config.attention_chunk_size = 16
    assert refusal(model) == "chunked attention"


def test_models_whose_attention_the_varlen_kernel_lacks_train_on_padded_rows_on_cuda():
    """Sinks (gpt-oss) and soft-capped scores (Gemma 2) are not in the varlen flash kernel: the CUDA default is
    padded rows with the model's own attention, and asking for packing says why it cannot."""
    from atropos_cli.errors import ConfigError
    from atropos_cli.trainer.step.grpo import packing_mode

    for name in ("gpt_oss", "gemma2"):
        model = build(name, VOCAB, tiny=True)
        assert packing_mode(model, None, "cuda") == "off"
        with pytest.raises(ConfigError, match="varlen flash kernel"):
            packing_mode(model, True, "cuda")


def test_atropos_models_lists_every_family_with_its_paths():
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    result = CliRunner().invoke(app, ["models"], env={"COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    for family in FAMILIES.values():
        row = next(line for line in lines if line.split()[:1] == [family.name])
        assert all(shape in row for shape in family.shapes) and "static engine" in row
    gpt_oss = next(line for line in lines if line.split()[:1] == ["gpt_oss"])
    assert "sinks" in gpt_oss and "sliding window 128 on 12 of 24 layers" in gpt_oss and "padded rows" in gpt_oss


def test_train_says_the_path_before_the_first_step(tmp_path):
    from atropos_cli.paths import rollout_path

    model = build("gemma3", VOCAB, tiny=True)
    assert rollout_path(model, cuda=True).startswith("static engine: ")
    assert rollout_path(model, cuda=False).startswith("loop sampler (CPU")
    model.config.use_bidirectional_attention = True
    assert "refuses this model (bidirectional attention)" in rollout_path(model, cuda=True)
