"""The in-process transformers backend on the shipped model: shapes, logprobs vs a forward pass, batching,
sampling options, and the errors users see for bad models and bad prompts."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from atropos_cli.config import ServerConfig
from atropos_cli.errors import ModelLoadError
from atropos_cli.inference.base import InferenceBackend, SamplingParams
from atropos_cli.inference.local import BadRequestError, LocalBackend
from atropos_cli.resources import DEFAULT_MODEL, resolve_model_path

QUESTION = [{"role": "user", "content": "What is 12 + 7?"}]


@pytest.fixture(scope="module")
def backend():
    backend = LocalBackend(ServerConfig(server_type="local", model_name=DEFAULT_MODEL))
    yield backend
    asyncio.run(backend.aclose())


def run(coro):
    return asyncio.run(coro)


def test_backend_meets_protocol_and_names_model(backend):
    assert isinstance(backend, InferenceBackend)
    assert backend.model_name == DEFAULT_MODEL
    assert backend.version == 0
    assert backend.tokenizer.chat_template


def test_chat_returns_n_choices_with_aligned_tokens_and_logprobs(backend):
    gen = run(backend.chat(QUESTION, SamplingParams(n=6, max_tokens=16, seed=1)))
    assert len(gen.choices) == 6
    assert gen.prompt_token_ids == backend.chat_prompt_ids(QUESTION)
    for choice in gen.choices:
        assert len(choice.token_ids) == len(choice.logprobs) >= 1
        assert all(lp <= 0 for lp in choice.logprobs)
        assert choice.finish_reason in ("stop", "length")
        if choice.finish_reason == "stop":
            assert choice.token_ids[-1] == backend.tokenizer.eos_token_id
        body = [t for t in choice.token_ids if t != backend.tokenizer.eos_token_id]
        assert choice.text == backend.tokenizer.decode(body, skip_special_tokens=True)
    assert gen.usage.completion_tokens == sum(len(c.token_ids) for c in gen.choices)


def test_logprobs_agree_with_a_forward_pass(backend):
    gen = run(backend.chat(QUESTION, SamplingParams(n=4, max_tokens=16, seed=3, temperature=1.3)))
    model = backend._state.model
    assert len(gen.choices) == 4
    for choice in gen.choices:
        ids = gen.prompt_token_ids + choice.token_ids
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        start = len(gen.prompt_token_ids)
        expected = [logprobs[start - 1 + j, t].item() for j, t in enumerate(choice.token_ids)]
        assert choice.logprobs == pytest.approx(expected, abs=1e-4)


def test_seeded_request_is_the_same_alone_and_batched(backend):
    params = SamplingParams(n=4, max_tokens=16, seed=11)
    alone = run(backend.chat(QUESTION, params))

    async def crowded():
        others = [
            backend.chat([{"role": "user", "content": f"What is {i} * {i + 3}? Be quick."}], SamplingParams(n=3))
            for i in range(6)
        ]
        results = await asyncio.gather(backend.chat(QUESTION, params), *others)
        return results[0]

    batches_before = backend.batcher.batches_run
    batched = run(crowded())
    assert backend.batcher.batches_run - batches_before < 7  # the 7 concurrent requests were merged
    assert [c.token_ids for c in batched.choices] == [c.token_ids for c in alone.choices]
    for a, b in zip(alone.choices, batched.choices, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4)


def test_greedy_is_deterministic_and_max_tokens_gives_length(backend):
    greedy = run(backend.chat(QUESTION, SamplingParams(n=3, temperature=0.0, max_tokens=16)))
    assert len({tuple(c.token_ids) for c in greedy.choices}) == 1
    short = run(backend.complete("What is", SamplingParams(n=2, max_tokens=1, seed=0)))
    assert len(short.choices) == 2
    for choice in short.choices:
        assert len(choice.token_ids) == 1
        assert choice.finish_reason == ("stop" if choice.token_ids[0] == backend.tokenizer.eos_token_id else "length")


def test_stop_string_cuts_the_text(backend):
    ids = backend.chat_prompt_ids(QUESTION)
    gen = run(backend.complete(ids, SamplingParams(n=8, max_tokens=16, seed=5, stop=["1"])))
    assert len(gen.choices) == 8
    for choice in gen.choices:
        assert "1" not in choice.text
    assert any(c.finish_reason == "stop" and c.token_ids[-1] != backend.tokenizer.eos_token_id for c in gen.choices)


def test_a_stop_token_id_stops_as_its_text_does(backend):
    """`stop=[id]` (Atropos envs send the EOS id, as to vLLM): the id's text is the stop string."""
    ids = backend.chat_prompt_ids(QUESTION)
    one = backend.tokenizer.convert_tokens_to_ids("1")
    by_id = run(backend.complete(ids, SamplingParams(n=8, max_tokens=16, seed=5, stop=[one])))
    by_text = run(backend.complete(ids, SamplingParams(n=8, max_tokens=16, seed=5, stop=["1"])))
    assert [c.text for c in by_id.choices] == [c.text for c in by_text.choices]


def test_complete_accepts_token_ids_and_rejects_out_of_vocab(backend):
    ids = backend.chat_prompt_ids(QUESTION)
    gen = run(backend.complete(ids, SamplingParams(n=2, max_tokens=8, seed=0)))
    assert gen.prompt_token_ids == ids
    with pytest.raises(BadRequestError, match="outside the vocabulary"):
        run(backend.complete([10**6], SamplingParams()))


def test_prompt_longer_than_context_is_a_clear_error(backend):
    long_chat = [{"role": "user", "content": "1 " * (backend.max_model_len + 10)}]
    with pytest.raises(BadRequestError, match=r"tokens but model .* has a context of 256 tokens") as info:
        run(backend.chat(long_chat, SamplingParams()))
    assert "shorten the prompt" in info.value.hint


def test_max_tokens_is_clamped_to_the_context(backend):
    ids = backend.chat_prompt_ids(QUESTION)
    room = backend.max_model_len - len(ids)
    gen = run(backend.complete(ids, SamplingParams(n=1, max_tokens=10_000, temperature=0.0)))
    assert len(gen.choices[0].token_ids) <= room


def test_any_role_an_env_uses_is_rendered(backend):
    """The shipped template renders roles it has no special form for (blackjack's `environment`, `tool`)."""
    out = run(backend.chat([{"role": "environment", "content": "x"}, *QUESTION], SamplingParams(max_tokens=2)))
    assert out.choices and out.prompt_token_ids


def test_missing_model_path_says_so():
    with pytest.raises(ModelLoadError, match="does not exist") as info:
        LocalBackend(ServerConfig(server_type="local", model_name="./no/such/model"))
    assert "atropos-tiny-arith" in info.value.hint


def test_directory_without_tokenizer_says_so(tmp_path):
    shipped = Path(resolve_model_path(DEFAULT_MODEL))
    for name in ("config.json", "model.safetensors"):
        shutil.copy2(shipped / name, tmp_path / name)
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        LocalBackend(ServerConfig(server_type="local", model_name=str(tmp_path)))


def test_directory_without_config_says_so(tmp_path):
    with pytest.raises(ModelLoadError, match="no config.json"):
        LocalBackend(ServerConfig(server_type="local", model_name=str(tmp_path)))


def test_bad_dtype_names_the_choices():
    from atropos_cli.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown dtype 'float8'"):
        LocalBackend(ServerConfig(server_type="local", model_name=DEFAULT_MODEL, dtype="float8"))


def test_hub_id_offline_says_hub_unreachable_and_how_to_pass_a_path(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    code = (
        "from atropos_cli.inference.local import LocalBackend\n"
        "from atropos_cli.config import ServerConfig\n"
        "from atropos_cli.errors import ModelLoadError\n"
        "try:\n"
        "    LocalBackend(ServerConfig(server_type='local', model_name='some-org/no-such-model'))\n"
        "except ModelLoadError as e:\n"
        "    print(e.message); print(e.hint)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert "hub is unreachable" in out.stdout, out.stderr
    assert "some-org/no-such-model" in out.stdout
    assert "local directory" in out.stdout


def test_tiny_top_p_is_greedy(backend):
    greedy = run(backend.chat(QUESTION, SamplingParams(n=1, temperature=0.0, max_tokens=16)))
    nucleus = run(backend.chat(QUESTION, SamplingParams(n=4, temperature=1.5, top_p=1e-6, max_tokens=16, seed=2)))
    assert {tuple(c.token_ids) for c in nucleus.choices} == {tuple(greedy.choices[0].token_ids)}


def test_batcher_merges_concurrent_jobs_respects_the_size_cap_and_fans_out_errors():
    from atropos_cli.inference.batching import RequestBatcher

    seen: list[list[int]] = []

    def work(jobs: list[int]) -> list[int]:
        seen.append(list(jobs))
        if -1 in jobs:
            raise ValueError("bad job in batch")
        return [j * 10 for j in jobs]

    batcher: RequestBatcher[int, int] = RequestBatcher(work, size=lambda j: 2, max_batch_size=6)

    async def main():
        results = await asyncio.gather(*(batcher.submit(j) for j in range(7)))
        failed = await asyncio.gather(batcher.submit(-1), batcher.submit(5), return_exceptions=True)
        await batcher.aclose()
        return results, failed

    results, failed = run(main())
    assert results == [j * 10 for j in range(7)]
    assert [len(b) for b in seen[:3]] == [3, 3, 1]  # 7 jobs of 2 rows under a cap of 6 rows
    assert isinstance(failed[0], ValueError) and failed[1] == 50  # a failing batch is re-run job by job


def test_the_static_engine_is_kept_while_batches_fit_and_grows_once(backend):
    """A new engine shape means new CUDA graphs and a new compile: batches that fit the kept engine's blocks reuse
    it, and a longer one builds blocks that fit both (so alternating lengths do not rebuild every batch)."""
    from atropos_cli.inference.sampler import RowRequest

    state = backend._state
    rows = lambda prompt, new: [RowRequest(prompt_ids=[1] * prompt, max_new_tokens=new) for _ in range(8)]  # noqa: E731
    backend._engines.clear()  # the module's backend: start from no engine
    first = backend._engine(state, rows(100, 200))
    assert first.shape.prompt_len == 256  # prompt blocks in power-of-two buckets of at least 256 tokens
    assert backend._engine(state, rows(30, 100)) is first  # fits: kept
    assert backend._engine(state, rows(250, 100)) is first  # prompts of 30 to 256 tokens share the block
    grown = backend._engine(state, rows(300, 40))  # a longer prompt: rebuilt, keeping room for the old rows
    assert grown is not first and (grown.shape.prompt_len, grown.shape.gen_len) == (512, 256)
    assert backend._engine(state, rows(100, 200)) is grown


def test_engines_are_kept_per_batch_size_so_alternating_sizes_build_no_more(backend):
    """A loop's batches vary in size (a step's first group alone, then the rest; an async engine fed as rollouts
    return): each size keeps its engine, and a batch runs on a kept engine with room for it (at most ROOMY times
    its group slots), so after the first of each no batch builds one (a build is a compile of the decode step:
    seconds to a minute on a GPU). At most MAX_ENGINES are kept, the least recently used dropped first."""
    from atropos_cli.inference import local
    from atropos_cli.inference.sampler import RowRequest

    state = backend._state
    groups = lambda n: [RowRequest(prompt_ids=[g + 1] * 20, max_new_tokens=16) for g in range(n) for _ in range(8)]  # noqa: E731
    backend._engines.clear()  # the module's backend: start from no engine
    builds = backend.engine_builds
    one, many = backend._engine(state, groups(1)), backend._engine(state, groups(16))
    assert one is not many and (one.shape.groups, many.shape.groups) == (1, 16)
    for _ in range(3):
        assert backend._engine(state, groups(1)) is one and backend._engine(state, groups(16)) is many
    assert backend._engine(state, groups(4)) is many  # 16 slots hold 4 groups: no build
    assert backend.engine_builds - builds == 2
    two = backend._engine(state, groups(2))  # 16 slots would be 8x its size: its own engine
    assert two is not many and two.shape.groups == 2 and backend.engine_builds - builds == 3
    assert backend._engine(state, groups(8)) is many  # ... the most recently used are kept
    backend._engine(state, groups(1)[:4])  # a fourth shape (groups of 4): the least recently used goes
    kept = list(backend._engines.values())
    assert len(kept) == local.MAX_ENGINES and two in kept and many in kept and one not in kept
