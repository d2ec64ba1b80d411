"""Blackjack: the simulator, and a multi-turn run whose tokens stay exact across turns.

The token test uses a real byte-level tokenizer whose ids equal the fake server's (one id per UTF-8 byte),
so the prompts the env sends as token ids can be checked on the server side.
"""

from __future__ import annotations

import json
import re

from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.env.registry import resolve_env

FAKE_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def game_module():
    import sys

    resolve_env("blackjack")
    return sys.modules["atropos_cli.envs.blackjack"]


def test_hand_totals_and_dealer_rules():
    bj = game_module()
    assert bj.hand_total(["A", "K"]) == 21
    assert bj.hand_total(["A", "A", "9"]) == 21
    assert bj.hand_total(["K", "Q", "5"]) == 25
    game = bj.BlackjackGame("0:eval:1")
    again = bj.BlackjackGame("0:eval:1")
    assert game.player == again.player and game.dealer == again.dealer  # seeded deck
    score = game.finish()
    assert score in (-1.0, 0.0, 1.0) and bj.hand_total(game.dealer) >= 17
    assert bj.parse_move("I think I should HIT") == "hit"
    assert bj.parse_move("hit? no, stand.") == "stand"
    assert bj.parse_move("pass") is None


def byte_tokenizer_dir(tmp_path):
    """A byte-level BPE with no merges: token id == byte value, like the fake server's tokenisation."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    printable += list(range(ord("®"), ord("ÿ") + 1))
    byte_to_char, extra = {}, 0
    for b in range(256):  # GPT-2's bytes_to_unicode table
        if b in printable:
            byte_to_char[b] = chr(b)
        else:
            byte_to_char[b] = chr(256 + extra)
            extra += 1
    assert set(byte_to_char.values()) == set(alphabet)
    tok = Tokenizer(models.BPE(vocab={c: b for b, c in byte_to_char.items()}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, chat_template=FAKE_TEMPLATE)
    assert fast.encode("hé", add_special_tokens=False) == list("hé".encode())
    fast.save_pretrained(tmp_path / "tok")
    return tmp_path / "tok"


def test_multi_turn_tokens_are_exact_and_prefix_preserving(fake_server, tmp_path):
    prompts: list[str] = []

    def policy(prompt: str, index: int) -> str:
        prompts.append(prompt)
        total = int(re.findall(r"total (\d+)", prompt)[-1])
        return "hit" if total < 17 else "stand"

    server = fake_server(rule=policy)
    out = tmp_path / "bj"
    result = CliRunner().invoke(
        app,
        ["process", "blackjack", "--out", str(out), "--num-groups", "4", "--group-size", "2",
         "--openai.base_url", server.base_url, "--openai.server_type", "vllm",
         "--env.tokenizer_name", str(byte_tokenizer_dir(tmp_path))],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (out / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 4 and all(len(g["tokens"]) == 2 for g in groups)  # --num-groups 4 --group-size 2
    multi = 0
    for group in groups:
        assert not group["meta"]["tokens_missing"]
        for tokens, masks, logprobs, chat in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], group["messages"], strict=True
        ):
            replies = [m["content"] for m in chat if m["role"] == "assistant"]
            multi += len(replies) > 1
            # Masks only on the model's turns: the trained ids are exactly the replies' bytes, in order.
            trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
            assert bytes(trained).decode() == "".join(replies)
            # Logprobs are the server's for trained tokens, 1.0 on masked positions.
            for t, m, lp in zip(tokens, masks, logprobs, strict=True):
                assert lp == (1.0 if m == -100 else -round(0.05 + (t % 13) / 10, 4))
            # Every prompt this hand sent was a prefix of the final token sequence (one per reply).
            text = bytes(tokens).decode()
            sent = {p for p in prompts if text.startswith(p)}
            assert len(sent) == len(replies)
    assert multi > 0


def test_blackjack_on_the_shipped_model_keeps_tokens_and_logprobs(tmp_path):
    import pytest

    from atropos_cli.resources import shipped_models

    if "atropos-tiny-arith" not in shipped_models():
        pytest.skip("the shipped model is not built here")
    from atropos_cli.inference.tokenizer import load_tokenizer

    out = tmp_path / "bj"
    result = CliRunner().invoke(
        app, ["process", "blackjack", "--out", str(out), "--num-groups", "1", "--group-size", "2"]
    )
    assert result.exit_code == 0, result.output
    group = json.loads((out / "groups.jsonl").read_text().splitlines()[0])
    tokenizer = load_tokenizer("atropos-tiny-arith")
    for tokens, masks, logprobs, chat in zip(
        group["tokens"], group["masks"], group["inference_logprobs"], group["messages"], strict=True
    ):
        trained = [t for t, m in zip(tokens, masks, strict=True) if m != -100]
        replies = "".join(m["content"] for m in chat if m["role"] == "assistant")
        assert tokenizer.decode(trained, skip_special_tokens=True) == replies
        assert all(lp < 0 for lp, m in zip(logprobs, masks, strict=True) if m != -100)
        assert all(lp == 1.0 for lp, m in zip(logprobs, masks, strict=True) if m == -100)
