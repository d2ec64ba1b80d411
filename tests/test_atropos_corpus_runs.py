"""Atropos' env files run end to end (issue 20, Must 1): files from atroposlib 0.4.0's sdist (fetched and cached
by tests/test_atropos_corpus.py's `sdist_root`), unmodified, each run as `python FILE process` under the real
atroposlib 0.4.0 (its venv, one interpreter for all, datasets replaced by tests/atropos_corpus_data.py's stand-in
rows) and as `atropos process FILE` under ours, against fake inference servers that answer each env's format
right and wrong (`corpus_answer`); the groups must be identical (tokens, masks, scores, advantages, logprobs,
messages, overrides, group_overrides).

RUNS lists the files run so far and the flags each needs. Files tried and not run, and why, are in NOT_RUN.
"""

from __future__ import annotations

import ast
import json
import os
import queue
import random
import re
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from atropos_cli.testing.fake_server import FakeInferenceServer
from atropos_conformance import COMPARED, ConformanceRule, comparable, read_groups
from atropos_corpus_data import (
    CLOCK_TIME,
    CODE,
    EVAL_GSM8K,
    EVAL_MISSED,
    GSM8K,
    IFEVAL_ANSWERS,
    INTERLEAVED_PROBLEM,
    MCQA,
    OBQA,
    PIXMO_COUNTS,
    POINTS,
    PYDANTIC_RECORDS,
    SQL_ANSWERS,
    STANDINS_PATH,
    install,
)
from differential import missing, venv_python
from test_atropos_corpus import CACHE, corpus_files, reference_usable, sdist_root

PYTHON = os.environ.get("ATROPOSLIB_PYTHON", "")
DISCOVERED_PORT = 9004  # where atroposlib looks for servers when config_init gives one APIServerConfig
# these files use managed_server: against an OpenAI server that is ATROPOS_ALLOW_DUMMY_MANAGED_SERVER's placeholders
# in both (atroposlib's DummyManagedServer, ours)
VLLM = ["--openai.server_type", "openai"]
ITEMS = 2  # items each run takes (--env.total_steps)
# file -> (extra flags, groups each run writes from its ITEMS items)
REASONING_GYM = "reasoning_gym_environment/reasoning_gym_environment.py"
RUNS: dict[str, tuple[list[str], int]] = {
    "gsm8k_server.py": ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024"], 2),
    "gsm8k_server_axolotl.py": ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024"], 2),
    "mcqa_thinking_env.py": ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024"], 2),
    "tool_calling_server.py": ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024"], 2),
    "rlaif_server.py": ([*VLLM, "--env.group_size", "2", "--env.max_token_length", "1024"], 2),
    "text_reversal_environment.py": ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024"], 2),
    "game_environments/gymnasium/blackjack/blackjack_env_no_thinking.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "2048"],
        2,
    ),
    "game_environments/gymnasium/blackjack/blackjack_env_thinking.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "2048"],
        2,
    ),
    "letter_counting_environment/letter_counting_environment.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "2048"],
        2,
    ),
    "fundamental_prediction_environment.py": ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "2048"], 2),
    # multi-turn tool calling: two sequential calls, each answered by its tool's response from the dataset
    "tool_use_multiturn_server.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "4096", "--env.scenario_category", "multistep"],
        2,
    ),
    # reasoning-gym: its generated tasks, answered from REASONING_GYM_ANSWERS (the env's own items, replayed)
    REASONING_GYM: ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "2048"], 2),
    # single-turn code: each program run against the problem's tests by the sdist's own Modal function, locally
    "code_execution_server/coding_server.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "2048", "--env.max_eval_token_length", "2048"],
        2,
    ),
    # multimodal (an image in each request); its postprocess_histories is `pass`: atroposlib writes no group
    "multimodal_dpo/clevr_cogen_a_train.py": ([*VLLM, "--env.group_size", "4"], 0),
    # multimodal, scored in collect_trajectories: a count in \boxed{}, a book's author and a clock's time in <answer>
    "multimodal_dpo/clevr_complex.py": ([*VLLM, "--env.group_size", "4"], 2),
    "multimodal_dpo/ocr_vqa.py": ([*VLLM, "--env.group_size", "4"], 2),
    "multimodal_dpo/pixmo_clocks.py": ([*VLLM, "--env.group_size", "4"], 2),
    # multimodal, its images fetched by URL (a local server the stand-in rows start)
    "multimodal_dpo/pixmo_count.py": ([*VLLM, "--env.group_size", "4"], 2),
    "multimodal_dpo/pixmo_point_explanations.py": ([*VLLM, "--env.group_size", "4"], 2),
    # an LLM judge (RLAIF, forward and swapped): the fake judges too, on WildChat's stand-in rows
    "community/philosophical_rlaif_env.py": ([*VLLM, "--env.group_size", "2", "--env.max_token_length", "4096"], 2),
    # tool calls inside the <think> block: completions stop at each call, the env runs its calculator, then resumes
    "tool_use_interleaved_thinking.py": ([*VLLM, "--env.group_size", "4"], 2),
}
# single-turn math, instruction following and formats
FORMAT_RUNS: dict[str, tuple[list[str], int]] = {
    "math_server.py": ([*VLLM, "--env.group_size", "4", "--env.max_token_length", "2048"], 2),
    "instruction_following_algorithm_environment.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024"],
        2,
    ),
    "pydantic_schema_following_environment/pydantic_schema_following_environment.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024"],
        2,
    ),
    # one answer format of its 60 (the fake writes <answer> tags) and one dataset: lists, so given in a YAML config
    # (neither CLI takes a list flag)
    # hand-written problems (no dataset): the fake answers a regex of the strings that should match, or none
    "community/regex_generation/regex_env.py": ([*VLLM, "--env.group_size", "4"], 2),
    "community/sql_query_env/sql_query_env.py": ([*VLLM, "--env.group_size", "4"], 2),
    "answer_format_environment/answer_format_environment.py": (
        [*VLLM, "--env.group_size", "4", "--env.max_token_length", "1024", "--config", str(CACHE / "xml_only.yaml")],
        2,
    ),
}
RUNS.update(FORMAT_RUNS)
CACHE.mkdir(parents=True, exist_ok=True)
(CACHE / "xml_only.yaml").write_text(  # answer_format_environment.py: one format, one (stand-in) dataset
    "env:\n  supported_formats: [xml]\n  dataset_configs:\n  - {name: atropos-corpus/answer-format, split: train, "
    "prompt_field: prompt, answer_field: answer, dataset_type: generic}\n"
)
SEED = 5  # `random` is seeded with it before each run on both sides (rlaif adds a system turn at random; blackjack
# deals by a random seed: this one deals games that sticking wins)
# tried and not run, one line each (why). Atropos main's teacher distillation is in test_atropos_main_teacher.py (it
# needs a checkout of main, which CI cannot download).
NOT_RUN = {
    "game_environments/gymnasium/gym_taxi.py": "crashes under atroposlib's venv and ours alike: gym.make('Taxi-v3') "
    "raises DeprecatedEnv in gymnasium 1.x (Taxi-v4 now); its groups are never made",
    "math_server_zero.py": "its score needs '</answer>' in the text, yet it asks the server to stop at '</answer>' "
    "(stop strings are cut, as vLLM does): every answer scores -1, every group is dropped, and atroposlib's process "
    "loop retries forever (18,000 requests in 20 s)",
    "dataset_environment/dataset_env.py": "no config_init or env_config_cls: `python FILE process` knows only "
    "BaseEnvConfig's flags, so its required dataset_name/prompt_field cannot be given (atroposlib exits 2, ours says "
    "'unknown env option'); it runs through its own launcher",
    "sft_loader_server.py": "imports OpenaiConfig, which atroposlib 0.4.0 lacks: it does not import there",
    "infinimath/infinimath_env.py": "needs mathgenerator (not in atropos[atroposlib]); under atroposlib `python FILE "
    "process` fails at its relative import (`from .curriculum import`)",
}
_GOLD = {row["question"]: row["answer"].split("#")[-1].strip() for row in GSM8K}
_LETTER = {row["prompt"].split("\n")[0]: row["ground_truth"] for row in MCQA}


# question -> answer of the items reasoning_gym_environment.py generates: its task choice, complexity and dataset
# seeds come from its own Random seeded with config_init's seed, so `replay_reasoning_gym` (the env's own setup and
# get_next_item, run once here) yields the very items both runtimes will ask about
REASONING_GYM_ANSWERS: dict[str, str] = {}


def corpus_answer(prompt: str, k: int) -> str:
    """The k-th answer to `prompt`: right on even k, wrong on odd k, in the format its env asks for."""
    question = next((q for q in _GOLD if q in prompt), None)
    if question is not None:
        gold = int(_GOLD[question]) + (k % 2)
        return f"<think>I add the numbers carefully, one step at a time.</think>\nSo the answer is \\boxed{{{gold}}}"
    topic = next((t for t in _LETTER if t in prompt), None)
    if topic is not None:  # mcqa_thinking_env: one <think> block, then "The best answer is: X"
        letter = _LETTER[topic] if k % 2 == 0 else "ABCD"[("ABCD".index(_LETTER[topic]) + 1) % 4]
        return f"<think>I compare the options one by one.</think>\nThe best answer is: {letter}"
    city = re.search(r"weather in (City\d+) today", prompt)
    if city:  # tool_calling_server.py: a think block, then the hermes tool call (the right city or another)
        name = city[1] if k % 2 == 0 else "Atlantis"
        call = json.dumps({"name": "get_weather", "arguments": {"city": name}})
        return f"<think>The user wants the weather, so I call the tool.</think>\n<tool_call>\n{call}\n</tool_call>"
    if "philosophical depth" in prompt:  # community/philosophical_rlaif_env.py's judge: it prefers "eldritch".
        # Its parser, re.search(r"\boxed{(A|B)}"), reads `\b` as a word boundary: it never matches the "\boxed{A}"
        # its prompt asks for, only "oxed{A}" after a non-word character, so the judge writes that too.
        response_a = prompt.split("[Response A]")[1].split("[Response B]")[0]
        choice = "A" if "eldritch" in response_a else "B"
        return f"<think>I weigh both.</think>\n\\boxed{{{choice}}} (oxed{{{choice}}})"
    if "[Response A]" in prompt:  # rlaif_server.py's judge: it prefers the response that says "eldritch"
        response_a = prompt.split("[Response A]")[1].split("[Response B]")[0]
        return f"<think>I weigh both.</think>\n\\boxed{{{'A' if 'eldritch' in response_a else 'B'}}}"
    if "Say hi to" in prompt:  # rlaif_server.py's rollouts: one on the judge's description, one off it
        return "Hi, from the eldritch deep." if k % 2 == 0 else "Hi there!"
    reverse = re.search(r"The text to reverse:\n(.*)", prompt)
    if reverse:  # text_reversal_environment.py: one think block, then the reversal in <reversed_text> tags
        text = reverse[1].strip()[::-1] if k % 2 == 0 else reverse[1].strip()
        return f"<think>I read it backwards.</think>\n<reversed_text>{text}</reversed_text>"
    if "hand sum is" in prompt:  # blackjack: the take_action tool call (stick), or no call at all
        call = json.dumps({"name": "take_action", "arguments": {"action": "stick"}})
        thought = "I stick on this.\n</think>\n" if prompt.endswith("<think>\n") else ""  # completes its <think>
        return f"{thought}<tool_call>\n{call}\n</tool_call>" if k % 2 == 0 else f"{thought}I will think about it."
    cubes = re.search(r"Count the (\d) cubes", prompt)
    if cubes:  # clevr_cogen_a_train.py (an image and a question): the count in \boxed{}
        return f"There are \\boxed{{{int(cubes[1]) + k % 2}}} cubes."
    one = re.search(r"How many (\w)s are in the string (.*)\?\n", prompt)
    many = re.search(r"Count the occurrences of the letters (.*) in the string (.*)\n", prompt)
    if one or many:  # letter_counting_environment.py: one think block, then the count(s) in <answer> tags
        letters, text = (one[1], one[2]) if one else (re.findall(r"'(\w)'", many[1]), many[2])  # type: ignore[index]
        counts = {c: text.lower().count(c) + k % 2 for c in letters}
        answer = counts[letters] if one else json.dumps(counts)
        return f"<think>I count each letter.</think>\n<answer>{answer}</answer>"
    outlook = re.search(r"signals the (\w+) is (\w+) by (\d+) percent", prompt)
    if outlook:  # fundamental_prediction_environment.py: one think block, then its sentence (right, or the opposite)
        metric, answer, magnitude = outlook.groups()
        answer = answer if k % 2 == 0 else {"raised": "reduced"}.get(answer, "raised")
        return (
            f"<think>I read the board.</think>\nThe {metric} will be: {answer} and the magnitude will be: {magnitude}%"
        )
    if "book me a taxi" in prompt:  # tool_use_multiturn_server.py: the weather, then (after its answer) the taxi
        name = "book_taxi" if '"temp_c": 20' in prompt else "get_weather"
        call = json.dumps({"name": name, "arguments": {"city": "Paris"}})
        return f"<think>One step at a time.</think>\n<tool_call>\n{call}\n</tool_call>" if k % 2 == 0 else "No."
    task = next((q for q in REASONING_GYM_ANSWERS if q in prompt), None)
    if task is not None:  # reasoning_gym_environment.py: its item's own answer in <answer> tags, or a wrong one
        answer = REASONING_GYM_ANSWERS[task] if k % 2 == 0 else "certainly not this"
        return f"<think>I work through the task.</think>\n<answer>{answer}</answer>"
    problem = next((q for q in CODE if f"Question: {q}" in prompt), None)
    if problem is not None:  # coding_server.py: a python block (the right program, or a wrong one)
        return f"Here is my solution.\n```python\n{CODE[problem][k % 2]}\n```\n"
    author = re.search(r"Who wrote book number (\d+)\?", prompt)
    if author:  # ocr_vqa.py: the author in <answer> tags (the right one, or the next book's)
        return f"I read the cover closely.\n<answer>Author {int(author[1]) + k % 2}</answer>"
    if "What time does the clock show" in prompt:  # pixmo_clocks.py: H:MM in <answer> tags (right, or a minute on)
        hour, minute = CLOCK_TIME
        return f"I read both hands of the clock.\n<answer>{hour}:{minute + k % 2:02d}</answer>"
    fruit = re.search(r"how many (\w+) are in the image\?", prompt)
    if fruit:  # pixmo_count.py: the count in <answer> tags (right, or one more)
        return f"I count them one by one.\n<answer>{PIXMO_COUNTS[fruit[1]] + k % 2}</answer>"
    point = next((q for q in POINTS if q in prompt), None)
    if point is not None:  # pixmo_point_explanations.py: the explanation in <answer> tags (right, or another's)
        return f"I look at the picture.\n<answer>{POINTS[point] if k % 2 == 0 else 'it is not there'}</answer>"
    if "you must use the python_interpreter or calculator tool call" in prompt:  # tool_use_interleaved_thinking.py
        question, gold = INTERLEAVED_PROBLEM
        if prompt.rstrip().endswith("</tool_response>"):  # after its calculator ran: close the think, the answer
            return f"The calculator agrees.\n</think>\n\nSo the answer is \\boxed{{{gold}}}."
        if k % 2 == 0:  # a calculator call inside the open <think> (the completion stops at "</tool_call>")
            call = json.dumps({"name": "calculator", "arguments": {"expr": question[8:-1].replace(" ", "")}})
            return f"<think>\nI add them with the calculator.\n<tool_call>{call}"
        return f"<think>\nI guess.\n</think>\n\nThe answer is \\boxed{{{int(gold) + 1}}}."
    return _format_answer(prompt, k) or f"I do not know this one, sorry ({k})."


def _format_answer(prompt: str, k: int) -> str | None:
    """The answers of the instruction-following, format and eval envs (None: not one of theirs)."""
    question = next((row for row in EVAL_GSM8K if row["question"] in prompt), None)
    if question is not None:  # eval_environments/gsm8k_eval.py: a think block, then \boxed{N}
        gold = int(question["answer"].split("#")[-1]) + (k + (question["question"] in EVAL_MISSED)) % 2
        return f"<think>I work it out.</think>\nThe answer is \\boxed{{{gold}}}."
    obqa = next((row for row in OBQA if f"Question: {row['question_stem']}" in prompt), None)
    if obqa is not None:  # eval_environments/obqa_eval.py: a think block, then the letter in <answer> tags
        letters = "ABCD"
        letter = letters[(letters.index(obqa["answerKey"]) + (k + (obqa["question_stem"] in EVAL_MISSED)) % 2) % 4]
        return f"<think>I weigh the options.</think>\n<answer>{letter}</answer>"
    question = next((q for q in SQL_ANSWERS if f"Question: {q}" in prompt), None)
    if question is not None:  # community/sql_query_env: a query in \boxed{} (run against the table by the env)
        return f"<think>One lookup.</think>\n\\boxed{{{SQL_ANSWERS[question][k % 2]}}}"
    should = re.search(r"Strings that SHOULD match:\n((?:  - .*\n)+)", prompt)
    if should:  # community/regex_generation: the alternation of the strings that should match, or no answer
        strings = [ast.literal_eval(line.strip()[2:]) for line in should[1].splitlines()]
        regex = "|".join(re.escape(text) for text in strings)
        return f"<think>I list them.</think>\n<answer>(?:{regex})</answer>" if k % 2 == 0 else "<think>Hmm.</think>"
    if "answer enclosed in <answer></answer> tags EXACTLY ONCE" in prompt:  # answer_format_environment.py's XML
        return "<think>I answer in the format asked.</think>\n<answer>42</answer>" if k % 2 == 0 else "42"
    record = next((r for p, r in PYDANTIC_RECORDS.items() if p in prompt), None)
    if record is not None:  # pydantic_schema_following_environment.py: the record (or one without `age`), formatted
        return "<think>I fill in the fields.</think>\n" + _structured(
            prompt, record if k % 2 == 0 else {**record, "age": None}
        )
    instruction = next((i for i in IFEVAL_ANSWERS if i in prompt), None)
    if instruction is not None:  # instruction_following_algorithm_environment.py: one think block, then the text
        return f"<think>I follow the instruction.</think>\n{IFEVAL_ANSWERS[instruction][k % 2]}"
    return None


def _structured(prompt: str, record: dict[str, Any]) -> str:
    """`record` (no None values) in the format and container a pydantic_schema_following system prompt asks for."""
    kind = re.search(r"structured data in (JSON|YAML|TOML|XML) format", prompt)[1].lower()  # type: ignore[index]
    fields = {key: value for key, value in record.items() if value is not None}
    if kind == "json":
        text = json.dumps(fields)
    elif kind == "xml":
        text = "<Pet>" + "".join(f"<{key}>{value}</{key}>" for key, value in fields.items()) + "</Pet>"
    else:  # YAML and TOML both read JSON's scalars
        text = "\n".join(f"{key}{':' if kind == 'yaml' else ' ='} {json.dumps(value)}" for key, value in fields.items())
    if f"<{kind}_output>" in prompt:
        return f"<{kind}_output>\n{text}\n</{kind}_output>"
    return f"```{kind}\n{text}\n```" if "markdown code block" in prompt else text


def CorpusRule() -> ConformanceRule:  # noqa: N802 - a rule factory, used like the class it returns
    """A fake-server rule that depends only on the prompt and how often it was seen (request order-proof)."""
    return ConformanceRule(corpus_answer)


def flags(file: str, base_url: str, tokenizer: Path, out: Path) -> list[str]:
    extra = RUNS[file][0]
    common = ["--env.data_path_to_save_groups", str(out / "groups.jsonl"), "--env.use_wandb", "false"]
    common += ["--env.tokenizer_name", str(tokenizer), "--env.total_steps", str(ITEMS)]
    common += ["--openai.base_url", base_url, "--openai.api_key", "x", "--openai.model_name", "fake-model"]
    return [*common, "--openai.tokenizer_name", str(tokenizer), *extra]


@pytest.fixture(scope="module")
def root() -> Path:
    root = sdist_root()
    code = root / "environments" / "code_execution_server"
    # coding_server.py reads its blacklist and appends its logs beside itself; the sdist ships neither
    (code / "perfect_indices.txt").touch()
    (code / "train_logs").mkdir(exist_ok=True)
    # its Modal function (`joeli-lcb`'s run_test) is defined by the sdist's lcb_modal_endpoint.py (tests/standins/modal)
    os.environ["MODAL_STANDIN_APPS"] = json.dumps({"joeli-lcb": str(code / "lcb_modal_endpoint.py")})
    return root


@pytest.fixture(scope="module")
def tokenizer(root: Path) -> Path:
    from atropos_cli.resources import resolve_model_path
    from atropos_conformance import portable_tokenizer

    return portable_tokenizer(resolve_model_path("atropos-tiny-arith"), CACHE / "tokenizer")


def start_servers(tokenizer: Path, count: int) -> list[FakeInferenceServer]:
    return [FakeInferenceServer(CorpusRule(), tokenizer=str(tokenizer)).start() for _ in range(count)]


def stop_servers(servers: list[FakeInferenceServer]) -> None:
    for server in servers:
        server.request_stop()
    for server in servers:
        server.stop()


@pytest.fixture(scope="module", autouse=True)
def replay_reasoning_gym(root: Path, tokenizer: Path) -> None:
    """Fill REASONING_GYM_ANSWERS: the env built under our layer, its setup() and the first get_next_item()s."""
    import asyncio

    from atropos_cli.env.loading import load_env

    argv = ["--env.tokenizer_name", str(tokenizer), "--env.use_wandb", "false", "--openai.base_url"]
    argv += ["http://127.0.0.1:9/v1", "--openai.model_name", "fake-model", "--openai.api_key", "x"]
    env = load_env(str(root / "environments" / REASONING_GYM), argv, None).env

    async def items() -> list[Any]:
        await env.setup()
        return [await env.get_next_item() for _ in range(4 * ITEMS)]

    for item in asyncio.run(items()):
        if item is not None:  # None: a task the env could not generate (it skips those too)
            REASONING_GYM_ANSWERS[item[1]["question"]] = str(item[1]["answer"])


@pytest.fixture(scope="module")
def reference_groups(root: Path, tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every file in RUNS under atroposlib 0.4.0: its driver result and output folder, by file.

    atroposlib 0.4.0 ignores the `base_url` of a lone APIServerConfig (what these files' config_init return)
    and discovers servers at localhost:9004-9007, so each file runs against a fresh fake server on port 9004.
    """
    return reference_runs(root, tokenizer, tmp_path_factory.mktemp("reference"), "process", sorted(RUNS), flags)


def reference_runs(
    root: Path, tokenizer: Path, out: Path, command: str, files: list[str], make_flags: Any
) -> dict[str, tuple[dict[str, Any] | None, Path]]:
    """`python FILE COMMAND FLAGS` under atroposlib for each file, one after another in one interpreter (it imports
    atroposlib once, 2 s of each file's 3.5), each against a fresh fake server on DISCOVERED_PORT: its driver
    result (None: it crashed the driver or ran past 300 s) and output folder (out/i), by file."""
    venv_python("ATROPOSLIB_PYTHON", "atroposlib 0.4.0")
    if not reference_usable():
        missing(f"{PYTHON} cannot import atroposlib: rebuild atroposlib 0.4.0's venv (.ci/run builds it)")
    found: dict[str, tuple[dict[str, Any] | None, Path]] = {}
    out.mkdir(parents=True, exist_ok=True)
    driver = None
    try:
        for i, file in enumerate(files):
            driver = driver or _ReferenceDriver(out / f"driver{i}.stderr")
            try:
                server = FakeInferenceServer(CorpusRule(), tokenizer=str(tokenizer), port=DISCOVERED_PORT).start()
            except Exception as exc:  # the port is taken on this machine
                pytest.skip(f"atroposlib's discovered server port {DISCOVERED_PORT} is not free here: {exc}")
            try:
                job = {"env_file": str(root / "environments" / file), "out": str(out / str(i)), "command": command}
                job["argv"] = make_flags(file, server.base_url, tokenizer, out / str(i))
                result = driver.run(job, timeout_s=300)
                found[file] = (result, out / str(i))
            finally:
                stop_servers([server])
            if result is None:  # a hung or dead driver: the next file gets a fresh one
                driver.close(wait_s=0)
                driver = None
    finally:
        if driver is not None:
            driver.close()
    return found


class _ReferenceDriver:
    """tests/atropos_reference_driver.py in atroposlib's venv, fed one job at a time on stdin; its stdout read by a
    thread (env files print there too), its stderr to a file."""

    def __init__(self, stderr: Path) -> None:
        env = {**os.environ, "ATROPOS_CORPUS_STANDINS": "1", "WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
        env.update(TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1", ATROPOS_ALLOW_DUMMY_MANAGED_SERVER="1")
        env["ATROPOS_CORPUS_SEED"] = str(SEED)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [STANDINS_PATH, os.environ.get("PYTHONPATH")]))
        driver = Path(__file__).parent / "atropos_reference_driver.py"
        self.stderr = stderr.open("w")
        self.proc = subprocess.Popen(
            [PYTHON, str(driver), "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr,
            text=True, env=env,
        )  # fmt: skip
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)  # the driver exited

    def run(self, job: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """The job's result line, or None when the driver exits or `timeout_s` passes first."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(job) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                return None
            result = _result_line(line)
            if result is not None:
                return result
        return None

    def close(self, wait_s: float = 30) -> None:
        """End of input: the driver exits as `python FILE` would (its envs' worker pools shut down); killed if it
        does not within `wait_s` (a hung job)."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=wait_s)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        self.stderr.close()


def _result_line(line: str) -> dict[str, Any] | None:
    """A driver's result line, else None (env files print to stdout too, some of it JSON)."""
    try:
        value = json.loads(line) if line.startswith('{"env_file"') else None
    except ValueError:
        return None
    return value if isinstance(value, dict) and "ok" in value else None


def run_ours(root: Path, file: str, tokenizer: Path, out: Path) -> tuple[int, str, list[dict]]:
    """`atropos process FILE ...` through our Typer app in this process, against a fresh fake server (our CLI
    honours the file's own server URL flag), datasets replaced by the stand-ins."""
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    out.mkdir(parents=True, exist_ok=True)
    (server,) = start_servers(tokenizer, 1)
    try:
        import random

        import rich.console  # noqa: F401 - rich draws from `random` when first imported: before the seed
        import rich.progress  # noqa: F401

        random.seed(SEED)
        args = ["process", str(root / "environments" / file), "--concurrency", "1"]
        result = CliRunner().invoke(app, [*args, *flags(file, server.base_url, tokenizer, out)])
    finally:
        stop_servers([server])
    groups = read_groups(out / "groups.jsonl") if (out / "groups.jsonl").is_file() else []
    return result.exit_code, result.output, groups


@pytest.fixture
def standins(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    monkeypatch.setenv("ATROPOS_ALLOW_DUMMY_MANAGED_SERVER", "1")
    monkeypatch.setattr(datasets, "load_dataset", datasets.load_dataset)  # restored after the test
    monkeypatch.syspath_prepend(STANDINS_PATH)  # the stand-in `modal` (coding_server.py)
    install()


def test_the_runs_are_corpus_files(root: Path) -> None:
    assert set(RUNS) | set(NOT_RUN) <= set(corpus_files(root))
    assert not set(RUNS) & set(NOT_RUN)


@pytest.mark.parametrize("file", sorted(RUNS))
def test_env_file_groups_match_atroposlib(
    file: str, root: Path, tokenizer: Path, reference_groups: dict, standins: None, tmp_path: Path
) -> None:
    reference, ref_out = reference_groups[file]
    assert reference is not None and reference["ok"], f"{file} under atroposlib: {reference}"
    expected = read_groups(ref_out / "groups.jsonl")
    assert len(expected) == RUNS[file][1]
    code, output, groups = run_ours(root, file, tokenizer, tmp_path)
    assert code == 0, output
    assert sorted(map(comparable, groups)) == sorted(map(comparable, expected)), _difference(groups, expected)
    scores = {s for g in groups for s in g["scores"]}
    if not expected:  # the env filters every group (postprocess_histories gives None): ours says so, exit 0
        assert "filtered" in output, output
        return
    assert len(scores) > 1, f"{file}: the fake answered right and wrong, yet every score is {scores}"


def _difference(ours: list[dict], theirs: list[dict]) -> str:
    """Which compared fields differ between the two runs' groups (all rollouts of a field, sorted)."""
    differ = []
    for key in (*COMPARED, "group_overrides"):
        mine = sorted(json.dumps(v) for g in ours for v in (g.get(key) or [None]))
        other = sorted(json.dumps(v) for g in theirs for v in (g.get(key) or [None]))
        if mine != other:
            differ.append(f"{key}: ours {str(mine)[:300]} atroposlib {str(other)[:300]}")
    return "\n".join(differ) or "the same fields, grouped differently"


@pytest.mark.parametrize("file", sorted(RUNS))
def test_env_file_runs_under_atropos(file: str, root: Path, tokenizer: Path, standins: None, tmp_path: Path) -> None:
    if reference_usable():
        pytest.skip("the differential test runs each file under ours too")
    code, output, groups = run_ours(root, file, tokenizer, tmp_path)
    assert code == 0, output
    assert len(groups) == RUNS[file][1] and all(re.search(r"\d", json.dumps(g["scores"])) for g in groups)


# --- envs run through their own `evaluate` (`python FILE evaluate` / `atropos evaluate FILE`) ----------
# file -> (extra flags, the files both write under --env.data_dir_to_save_evals, the accuracy metric's key)
EVALS: dict[str, tuple[list[str], tuple[str, ...], str]] = {
    # its own save_eval_results: metrics.json, results.jsonl
    "eval_environments/gsm8k_eval.py": (
        ["--env.dataset_name", "atropos-corpus/gsm8k-eval"],
        ("metrics.json", "results.jsonl"),
        "accuracy",
    ),
    # BaseEnv.evaluate_log: metrics.json in lighteval's layout (timings left out of the comparison), samples.jsonl
    # (its setup fails on the default thinking prompt, None, under atroposlib and ours alike: it is given one)
    "eval_environments/obqa_eval.py": (
        ["--env.custom_thinking_prompt", "Think first, inside <think> </think> tags."],
        ("metrics.json", "samples.jsonl"),
        "eval/accuracy",
    ),
}


def eval_flags(file: str, base_url: str, tokenizer: Path, out: Path) -> list[str]:
    common = ["--env.data_dir_to_save_evals", str(out / "evals"), "--env.use_wandb", "false"]
    common += ["--env.tokenizer_name", str(tokenizer), "--openai.base_url", base_url, "--openai.api_key", "x"]
    return [*common, "--openai.model_name", "fake-model", *EVALS[file][0]]


@pytest.fixture(scope="module")
def reference_evals(root: Path, tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Every file in EVALS as `python FILE evaluate` under atroposlib 0.4.0: its driver result and evals folder."""
    found = reference_runs(root, tokenizer, tmp_path_factory.mktemp("evals"), "evaluate", sorted(EVALS), eval_flags)
    return {file: (result, folder / "evals") for file, (result, folder) in found.items()}


def evaluate_ours(root: Path, file: str, tokenizer: Path, out: Path) -> tuple[int, str]:
    """`atropos evaluate FILE ...` through our Typer app in this process, against a fresh fake server."""
    from typer.testing import CliRunner

    from atropos_cli.cli.app import app

    (server,) = start_servers(tokenizer, 1)
    try:
        random.seed(SEED)
        args = ["evaluate", str(root / "environments" / file), "--out", str(out / "run")]
        result = CliRunner().invoke(app, [*args, *eval_flags(file, server.base_url, tokenizer, out)])
    finally:
        stop_servers([server])
    return result.exit_code, result.output


@pytest.mark.parametrize("file", sorted(EVALS))
def test_env_file_evaluate_matches_atroposlib(
    file: str, root: Path, tokenizer: Path, reference_evals: dict, standins: None, tmp_path: Path
) -> None:
    code, output = evaluate_ours(root, file, tokenizer, tmp_path)
    reference, ref_evals = reference_evals[file]
    assert reference is not None and reference["ok"] and code == 0, f"atroposlib: {reference}\nours: {output}"
    _, files, accuracy_key = EVALS[file]
    for name in files:
        ours, theirs = _untimed((tmp_path / "evals" / name).read_text()), _untimed((ref_evals / name).read_text())
        assert ours == theirs, f"{name} differs:\nours {ours[:1500]}\natroposlib {theirs[:1500]}"
    metrics = json.loads((tmp_path / "evals" / "metrics.json").read_text())
    accuracy = metrics.get("results", {}).get("all", metrics)[accuracy_key]
    assert 0 < accuracy < 1, f"the fake answered right and wrong, yet the accuracy is {accuracy}"
    assert "own evaluate()" in output, output


def _untimed(text: str) -> Any:
    """A metrics/results file without what differs from run to run: timings (`*time*` keys, at any depth)."""

    def drop(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: drop(v) for k, v in value.items() if "time" not in k}
        return [drop(v) for v in value] if isinstance(value, list) else value

    if text.lstrip().startswith("{") and "\n{" not in text.strip():
        return drop(json.loads(text))
    return [drop(json.loads(line)) for line in text.splitlines() if line.strip()]
