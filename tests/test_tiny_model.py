"""The shipped model `atropos-tiny-arith` (files, tokenizer, accuracy band on the arithmetic env) and the SFT
path that trains it (`atropos_cli.trainer.sft`) plus the tokenizer/model builders (`atropos_cli.trainer.tiny_model`)."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from atropos_cli.config import ServerConfig
from atropos_cli.env.registry import resolve_env
from atropos_cli.errors import ConfigError, OutputExistsError, RecordError
from atropos_cli.inference.base import SamplingParams
from atropos_cli.inference.local import LocalBackend
from atropos_cli.resources import DEFAULT_MODEL, resolve_model_path, shipped_models
from atropos_cli.trainer.sft import SFTConfig, encode_chat, load_chats, run_sft
from atropos_cli.trainer.tiny_model import TinyModelSizes, init_model, save_init, train_tokenizer

SHIPPED = Path(resolve_model_path(DEFAULT_MODEL))
REPO = Path(__file__).resolve().parents[1]


def test_shipped_model_is_small_complete_and_found_by_short_name():
    assert DEFAULT_MODEL in shipped_models()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "README.md"):
        assert (SHIPPED / name).is_file(), name
    size = sum(p.stat().st_size for p in SHIPPED.iterdir())
    assert size < 8 * 2**20, f"shipped model is {size} bytes"
    card = (SHIPPED / "README.md").read_text()
    assert "python examples/build_tiny_model.py --seed 0" in card


def test_shipped_tokenizer_spells_numbers_digit_by_digit_and_has_a_chat_template():
    from atropos_cli.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("1234", add_special_tokens=False)) == list("1234")
    chat = [{"role": "user", "content": "What is 2 + 3?"}]
    text = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>What is 2 + 3?<|end|><|assistant|>"
    assert tokenizer.eos_token == "<|end|>"
    assert tokenizer.decode(tokenizer.encode("any text: é ✓")) == "any text: é ✓"  # byte fallback


def _shipped_scores(temperature: float | None, n: int) -> list[list[float]]:
    """Rewards of the shipped model on 64 eval items x n samples (default temperature: the env's, 1.0)."""
    env_cls = resolve_env("arithmetic")
    config, _ = env_cls.config_init()
    env = env_cls(config.model_copy(update={"eval_size": 64}), server=None)
    backend = LocalBackend(ServerConfig(server_type="local", model_name=DEFAULT_MODEL))
    temperature = config.temperature if temperature is None else temperature
    params = SamplingParams(n=n, temperature=temperature, max_tokens=config.max_token_length)
    items = list(env.items("eval"))

    async def sample():
        try:
            return await asyncio.gather(
                *(
                    backend.chat(env.messages_for(it), params.model_copy(update={"seed": i}))
                    for i, it in enumerate(items)
                )
            )
        finally:
            await backend.aclose()

    gens = asyncio.run(sample())
    return [[env.reward(c.text, it)["score"] for c in g.choices] for it, g in zip(items, gens, strict=True)]


def test_shipped_model_accuracy_is_between_30_and_70_percent():
    """64 eval items x 8 samples at the env's default sampling: groups must disagree."""
    scores = _shipped_scores(None, 8)
    accuracy = sum(map(sum, scores)) / (64 * 8)
    assert 0.3 <= accuracy <= 0.7, accuracy
    mixed = sum(1 for group in scores if 0 < sum(group) < 8)
    assert mixed >= 16, f"only {mixed} of 64 groups have differing scores"


def test_shipped_model_knows_more_than_it_samples():
    """Trained on 40% near-miss answers: greedy is mostly right, so GRPO has headroom above the 36% sampled."""
    greedy = sum(s for group in _shipped_scores(0.0, 1) for s in group) / 64
    assert greedy >= 0.65, greedy


def test_recipe_noisy_demonstrations_keep_the_right_answer_the_most_frequent(tmp_path):
    spec = importlib.util.spec_from_file_location("build_tiny_model", REPO / "examples" / "build_tiny_model.py")
    recipe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(recipe)
    arith = recipe._arith_module()
    clean = [json.loads(line) for line in _chats(recipe, tmp_path / "clean.jsonl", 0.0)]
    noisy = [json.loads(line) for line in _chats(recipe, tmp_path / "noisy.jsonl", 0.4)]
    wrong = []
    for a, b in zip(clean, noisy, strict=True):
        assert a["messages"][0] == b["messages"][0]  # same questions: the noise has its own seeded stream
        question = a["messages"][0]["content"].removeprefix("What is ").removesuffix("?")
        right = eval(question)  # noqa: S307 - our own generated "a op b"
        assert int(a["messages"][1]["content"]) == right
        wrong.append(int(b["messages"][1]["content"]) - right)
    misses = [d for d in wrong if d]
    assert 0.35 <= len(misses) / len(wrong) <= 0.45
    assert set(misses) == {-3, -2, -1, 1, 2, 3}  # spread: each wrong value is far rarer than the right one
    assert arith.ArithmeticConfig().max_operand == 30


def _chats(recipe, path: Path, noise: float):
    recipe.write_chats(path, 2000, 0, noise, 3)
    return path.read_text().splitlines()


def test_tokenizer_builder_and_init_model(tmp_path):
    tokenizer = train_tokenizer(["What is 12 + 30? 42", "What is 7 * 8? 56"] * 20, vocab_size=300)
    assert tokenizer.convert_ids_to_tokens(tokenizer.encode("907", add_special_tokens=False)) == ["9", "0", "7"]
    sizes = TinyModelSizes(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64, max_position_embeddings=64)
    model = init_model(tokenizer, sizes, seed=0)
    assert model.config.vocab_size == len(tokenizer)
    out = save_init(model, tokenizer, tmp_path / "init")
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_encode_chat_trains_only_on_assistant_turns():
    from atropos_cli.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    chat = [
        {"role": "system", "content": "Answer with a number."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "What is 5 * 2?"},
        {"role": "assistant", "content": "10"},
    ]
    ids, labels = encode_chat(tokenizer, chat)
    assert tokenizer.decode(ids) == tokenizer.apply_chat_template(chat, tokenize=False)
    trained = [i for i, label in zip(ids, labels, strict=True) if label != -100]
    assert tokenizer.decode(trained) == "5<|end|>10<|end|>"


def test_load_chats_reads_messages_and_prompt_completion_rows(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    jsonl = _write_jsonl(tmp_path / "a.jsonl", [{"prompt": "What is 1 + 1?", "completion": "2"}])
    pq.write_table(
        pa.Table.from_pylist(
            [{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "3"}]}]
        ),
        tmp_path / "b.parquet",
    )
    chats = load_chats([str(jsonl), str(tmp_path / "b.parquet")])
    assert chats[0][-1] == {"role": "assistant", "content": "2"}
    assert chats[1][0]["content"] == "hi"


def test_sft_bad_data_names_the_file_and_line(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_chats([str(tmp_path / "missing.jsonl")])
    bad = _write_jsonl(
        tmp_path / "bad.jsonl",
        [{"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]}, {"text": "no chat"}],
    )
    with pytest.raises(RecordError, match=r"bad.jsonl:2: row has neither 'messages' nor 'prompt'/'completion'"):
        load_chats([str(bad)])
    no_answer = _write_jsonl(tmp_path / "q.jsonl", [{"messages": [{"role": "user", "content": "x"}]}])
    with pytest.raises(RecordError, match="no assistant message"):
        load_chats([str(no_answer)])


def test_run_sft_learns_a_chat_and_saves_a_loadable_model(tmp_path):
    """Teach the shipped model a wrong fact; greedy decoding of the saved model must then say it."""
    data = _write_jsonl(tmp_path / "d.jsonl", [{"prompt": "What is 2 + 2?", "completion": "5"}] * 16)
    config = SFTConfig(
        data=str(data), model=DEFAULT_MODEL, out=str(tmp_path / "out"), max_steps=25, lr=3e-3, batch_size=8
    )
    logs: list[dict] = []
    out = run_sft(config, on_log=logs.append)
    assert logs and logs[-1]["step"] == 25
    assert json.loads((out / "sft_config.json").read_text())["max_steps"] == 25
    backend = LocalBackend(ServerConfig(server_type="local", model_name=str(out)))
    question = [{"role": "user", "content": "What is 2 + 2?"}]
    gen = asyncio.run(backend.chat(question, SamplingParams(temperature=0.0, max_tokens=8)))
    asyncio.run(backend.aclose())
    assert gen.choices[0].text == "5"
    with pytest.raises(OutputExistsError, match="not empty"):
        run_sft(config)


@pytest.mark.slow
def test_recipe_rebuilds_a_model_end_to_end(tmp_path):
    """A shortened run of the shipped model's recipe: data, tokenizer, SFT, checkpoint pick, model card."""
    cmd = [
        sys.executable, str(REPO / "examples" / "build_tiny_model.py"), "--seed", "1", "--out", str(tmp_path / "m"),
        "--chats", "3000", "--steps", "60", "--save-every", "30", "--eval-items", "16",
    ]  # fmt: skip
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "accuracy" in result.stdout
    assert (tmp_path / "m" / "model.safetensors").is_file() and (tmp_path / "m" / "README.md").is_file()


CHAT = [
    {"role": "system", "content": "Answer with a number."},
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "5"},
    {"role": "user", "content": "What is 5 * 2?"},
    {"role": "assistant", "content": "10"},
]


def test_chat_template_marks_assistant_tokens_for_answer_only_loss():
    from atropos_cli.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    out = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert tokenizer.decode([i for i, m in zip(ids, mask, strict=True) if m]) == "5<|end|>10<|end|>"
    # The markers render nothing: the text is what the model was trained and is sampled on.
    assert tokenizer.apply_chat_template(CHAT, tokenize=False) == (
        "<|system|>Answer with a number.<|end|><|user|>What is 2 + 3?<|end|><|assistant|>5<|end|>"
        "<|user|>What is 5 * 2?<|end|><|assistant|>10<|end|>"
    )


def test_chat_template_renders_every_prefix_of_a_chat_as_a_prefix():
    from atropos_cli.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    full = tokenizer.apply_chat_template(CHAT, tokenize=False)
    for k in range(1, len(CHAT)):
        assert full.startswith(tokenizer.apply_chat_template(CHAT[:k], tokenize=False)), k
        if CHAT[k]["role"] == "assistant":
            prompt = tokenizer.apply_chat_template(CHAT[:k], tokenize=False, add_generation_prompt=True)
            assert full.startswith(prompt), k


def test_the_recipe_and_the_shipped_files_carry_the_same_template():
    from atropos_cli.trainer.tiny_model import CHAT_TEMPLATE

    assert (SHIPPED / "chat_template.jinja").read_text() == CHAT_TEMPLATE
    assert json.loads((SHIPPED / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE


@pytest.mark.filterwarnings("ignore::FutureWarning")  # trl 1.16 sets transformers' deprecated arg names
def test_trl_sft_with_assistant_only_loss_trains_on_our_messages_dataset(tmp_path):
    """TRL as a user runs it: SFTTrainer(assistant_only_loss=True) on `sft-gen`'s default `messages` rows."""
    trl = pytest.importorskip("trl")
    from datasets import Dataset

    from atropos_cli.inference.tokenizer import load_tokenizer
    from atropos_cli.resources import resolve_model_path

    rows = [
        {"messages": [{"role": "user", "content": f"What is {i} + 1?"}, {"role": "assistant", "content": str(i + 1)}]}
        for i in range(8)
    ]
    config = trl.SFTConfig(
        output_dir=str(tmp_path / "out"), assistant_only_loss=True, max_steps=1, per_device_train_batch_size=4,
        report_to=[], use_cpu=True, save_strategy="no", logging_steps=1,
    )  # fmt: skip
    trainer = trl.SFTTrainer(
        model=resolve_model_path(DEFAULT_MODEL),
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=load_tokenizer(DEFAULT_MODEL),
    )
    example = trainer.train_dataset[0]
    trained = [label for label in example["labels"] if label != -100]
    assert trainer.processing_class.decode(trained) == "1<|end|>"  # the answer and its EOS, not the prompt
    assert trainer.train().training_loss > 0


def test_chat_template_renders_any_role_none_content_parts_and_tool_calls():
    """Envs send roles beyond system/user/assistant (blackjack: `environment`, tool envs: `tool`), content as
    None or a list of parts, and assistant `tool_calls`: each renders, as real templates do, instead of raising."""
    from atropos_cli.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(DEFAULT_MODEL)
    call = {"id": "c0", "type": "function", "function": {"name": "hit", "arguments": '{"a": 1}'}}
    chat = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "hi "}, {"type": "image_url"}, {"type": "text", "text": "you"}],
        },
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "ok", "tool_call_id": "c0"},
        {"role": "environment", "content": "You drew a 5."},
        {"role": "assistant", "content": "stick", "tool_calls": [{"name": "x", "arguments": {"b": [1, 2]}}]},
    ]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == (
        '<|user|>hi you<|end|><|assistant|><tool_call>{"name": "hit", "arguments": {"a": 1}}</tool_call><|end|>'
        "<|tool|>ok<|end|><|environment|>You drew a 5.<|end|>"
        '<|assistant|>stick<tool_call>{"name": "x", "arguments": {"b": [1, 2]}}</tool_call><|end|>'
    )
    out = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    trained = tokenizer.decode([i for i, m in zip(out["input_ids"], out["assistant_masks"], strict=True) if m])
    assert trained == (
        '<tool_call>{"name": "hit", "arguments": {"a": 1}}</tool_call><|end|>'
        'stick<tool_call>{"name": "x", "arguments": {"b": [1, 2]}}</tool_call><|end|>'
    )
    # the unknown role's header is text, not a special token the model never saw
    env_turn = tokenizer.apply_chat_template(chat[3:4], tokenize=True, return_dict=True)["input_ids"]
    assert tokenizer.convert_ids_to_tokens(env_turn)[0] != "<|environment|>"


def test_shipped_chat_template_is_the_trainer_s():
    from atropos_cli.trainer.tiny_model import CHAT_TEMPLATE

    config = json.loads((SHIPPED / "tokenizer_config.json").read_text())
    assert config["chat_template"] == CHAT_TEMPLATE
    assert (SHIPPED / "chat_template.jinja").read_text().strip() == CHAT_TEMPLATE


def test_atropos_models_prints_a_directory_transformers_loads(tmp_path):
    """What TRL users need: the shipped model's path, printed by `atropos models`, loads with from_pretrained."""
    from transformers import AutoModelForCausalLM
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    result = CliRunner().invoke(app, ["models"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    name, path = result.output.splitlines()[0].split("  ")
    assert name == DEFAULT_MODEL
    assert AutoModelForCausalLM.from_pretrained(path).config.vocab_size > 0
