"""Multi-turn token bookkeeping: the prefix property and exact reply tokens on real chat templates."""

from __future__ import annotations

import pytest

from atropos_cli.env.multiturn import TokenTrace
from atropos_cli.resources import shipped_models

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = ["hit stand dealer shows 10 you have 15", "I will hit. I will stand.", "abab ab ba hitstand"] * 20


@pytest.fixture(scope="module")
def chatml_tokenizer():
    """A real byte-level BPE tokenizer with a ChatML template, trained in milliseconds on a tiny corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )  # fmt: skip
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", chat_template=CHATML)


def tokenizers_under_test(chatml_tokenizer):
    yield "chatml-bpe", chatml_tokenizer
    if "atropos-tiny-arith" in shipped_models():
        from atropos_cli.inference.tokenizer import load_tokenizer

        yield "atropos-tiny-arith", load_tokenizer("atropos-tiny-arith")


def play(tokenizer, replies):
    """Three turns; replies are given as token ids chosen one character at a time (not the BPE merge)."""
    trace = TokenTrace(tokenizer)
    prompts = [trace.start([{"role": "system", "content": "Play blackjack."}, {"role": "user", "content": "15 vs 10"}])]
    for turn, text in enumerate(replies):
        ids = [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]
        if tokenizer.eos_token_id is not None:
            ids.append(tokenizer.eos_token_id)
        trace.add_reply(text, token_ids=ids, logprobs=[-0.5] * len(ids), finish_reason="stop")
        if turn < len(replies) - 1:
            prompts.append(trace.add_messages([{"role": "user", "content": f"you drew a {turn + 2}"}]))
    return trace, prompts


def test_prefix_property_and_exact_reply_tokens(chatml_tokenizer):
    for label, tokenizer in tokenizers_under_test(chatml_tokenizer):
        replies = ["hit", "hitstand", "stand"]
        trace, prompts = play(tokenizer, replies)
        for earlier, later in zip(prompts, prompts[1:], strict=False):
            assert later[: len(earlier)] == earlier, f"{label}: turn prompt is not a prefix of the next"
        assert trace.tokens[: len(prompts[-1])] == prompts[-1]
        assert len(trace.tokens) == len(trace.masks) == len(trace.logprobs)
        trained = [t for t, m in zip(trace.tokens, trace.masks, strict=True) if m != -100]
        expected = []
        for text in replies:
            expected += [i for ch in text for i in tokenizer.encode(ch, add_special_tokens=False)]
            expected += [tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else []
        assert trained == expected, f"{label}: trained tokens are not the sampled ones"
        assert [lp for lp, m in zip(trace.logprobs, trace.masks, strict=True) if m != -100] == [-0.5] * len(expected)
        assert all(lp == 1.0 for lp, m in zip(trace.logprobs, trace.masks, strict=True) if m == -100)
        # The text is the template's rendering of the whole chat, so nothing was lost or doubled.
        # (The template's newline after the last end-of-turn is not something the model generates.)
        full = tokenizer.apply_chat_template(trace.messages, tokenize=False)
        decoded = tokenizer.decode(trace.tokens)
        assert full.startswith(decoded) and full[len(decoded) :].strip() == ""


def test_retokenising_would_shift_tokens_but_the_trace_does_not(chatml_tokenizer):
    trace, _ = play(chatml_tokenizer, ["hitstand"])
    naive = chatml_tokenizer.apply_chat_template(trace.messages, tokenize=True)
    naive = list(naive["input_ids"]) if hasattr(naive, "keys") else list(naive)
    assert naive != trace.tokens  # BPE merges "hitstand" differently from the char-by-char sample
    assert chatml_tokenizer.decode(naive).rstrip("\n") == chatml_tokenizer.decode(trace.tokens)


def test_reply_without_token_ids_is_encoded_once(chatml_tokenizer):
    trace = TokenTrace(chatml_tokenizer)
    first = trace.start([{"role": "user", "content": "15 vs 10"}])
    trace.add_reply("hit", logprobs=[-0.1] * len(chatml_tokenizer.encode("hit", add_special_tokens=False)))
    second = trace.add_messages([{"role": "user", "content": "you drew a 3"}])
    assert second[: len(first)] == first
    assert trace.logprobs is not None and len(trace.logprobs) == len(trace.tokens)  # lengths agree: kept
    trace.add_reply("stand", logprobs=[-0.1] * 99)  # the server tokenised differently: dropped, not misaligned
    assert trace.logprobs is None
    assert chatml_tokenizer.decode(trace.tokens).endswith("<|im_start|>assistant\nstand")


def test_misuse_is_reported(chatml_tokenizer):
    trace = TokenTrace(chatml_tokenizer)
    trace.start([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="follows add_reply"):
        trace.add_messages([{"role": "user", "content": "again"}])
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        trace.add_reply("ab", token_ids=[1, 2], logprobs=[-0.1])
