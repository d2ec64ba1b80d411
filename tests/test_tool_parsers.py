"""The tool-call parsers (atropos_cli.compat.tool_parsers) and atroposlib's ToolCallTranslator on them: each
format as the model family writes it, round trips through render and parse, malformed calls, and a
ManagedServer env that calls tools in each format run by `atropos process` against the fake server.
atroposlib's own hermes helper (`utils.tool_call_parser.parse_tool_call`) is compared side by side with
atroposlib 0.4.0 when ATROPOSLIB_PYTHON is set (its other parsers are vLLM's, which its venv lacks)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from atropos_cli.cli.app import app
from atropos_cli.compat.atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator
from atropos_cli.compat.atroposlib.utils.tool_call_parser import parse_tool_call
from atropos_cli.compat.tool_parsers import get_parser, list_parsers
from atropos_cli.errors import ConfigError
from atropos_cli.resources import resolve_model_path
from differential import venv_python

TOKENIZER = resolve_model_path("atropos-tiny-arith")
DATA = Path(__file__).parent / "data" / "compat_names"
PYTHON = os.environ.get("ATROPOSLIB_PYTHON", "")

WEATHER = {"city": "Paris", "days": 3}
# (parser, raw text as the model family writes it, expected content, expected [(name, arguments)])
WRITTEN: list[tuple[str, str, str | None, list[tuple[str, Any]]]] = [
    (
        "hermes",
        'Checking.\n<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", "days": 3}}\n</tool_call>\n'
        '<tool_call>\n{"name": "clock", "arguments": {}}\n</tool_call>',
        "Checking.",
        [("weather", WEATHER), ("clock", {})],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "weather", "arguments": {"city": "Paris", "days": 3}}',
        None,
        [("weather", WEATHER)],
    ),
    ("qwen", '<tool_call>{"name": "clock", "arguments": {}}</tool_call>', None, [("clock", {})]),
    (
        "llama3_json",
        '<|python_tag|>{"name": "weather", "parameters": {"city": "Paris", "days": 3}}; '
        '{"name": "clock", "parameters": {}}',
        None,
        [("weather", WEATHER), ("clock", {})],
    ),
    (
        "llama4_json",
        'I will look {it} up. {"name": "weather", "arguments": {"city": "Paris", "days": 3}}',
        "I will look {it} up.",
        [("weather", WEATHER)],
    ),
    (
        "mistral",
        'Sure.[TOOL_CALLS] [{"name": "weather", "arguments": {"city": "Paris", "days": 3}}, '
        '{"name": "clock", "arguments": {}}]',
        "Sure.",
        [("weather", WEATHER), ("clock", {})],
    ),
    (
        "mistral",
        '[TOOL_CALLS]weather{"city": "Paris", "days": 3}[TOOL_CALLS]clock{}',
        None,
        [("weather", WEATHER), ("clock", {})],
    ),
    (
        "deepseek_v3",
        "Let me see.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>weather\n```json\n"
        '{"city": "Paris", "days": 3}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>clock\n'
        "```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Let me see.",
        [("weather", WEATHER), ("clock", {})],
    ),
    (
        "deepseek_v3_1",
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>weather<｜tool▁sep｜>{"city": "Paris", "days": 3}'
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        None,
        [("weather", WEATHER)],
    ),
    (
        "qwen3_coder",
        "Checking.\n<tool_call>\n<function=weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=days>\n3\n"
        "</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=clock>\n</function>\n</tool_call>",
        "Checking.",
        [("weather", WEATHER), ("clock", {})],
    ),
]


def _calls(calls: list[dict[str, Any]] | None) -> list[tuple[str, Any]]:
    assert calls is not None
    for i, call in enumerate(calls):
        assert call["type"] == "function" and call["id"] == f"call_{i}"
        assert isinstance(call["function"]["arguments"], str)
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls]


def test_every_shipped_parser_is_registered() -> None:
    expected = {"hermes", "qwen", "llama3_json", "llama4_json", "mistral", "deepseek_v3", "deepseek_v3_1"}
    assert set(list_parsers()) == expected | {"qwen3_coder"}


@pytest.mark.parametrize(("name", "text", "content", "calls"), WRITTEN)
def test_parses_the_format_as_the_model_writes_it(name: str, text: str, content: str | None, calls: list) -> None:
    parsed_content, parsed = get_parser(name).parse(text)
    assert parsed_content == content
    assert _calls(parsed) == calls


ROUND_TRIP_CALLS = [
    {"id": "a", "type": "function", "function": {"name": "weather", "arguments": json.dumps(WEATHER)}},
    {"name": "search", "arguments": {"query": "größte Stadt", "filters": {"year": [2020, 2021]}, "exact": False}},
    {"name": "noop", "arguments": {}},
]


@pytest.mark.parametrize("name", list_parsers())
@pytest.mark.parametrize("content", [None, "Let me look that up."])
def test_render_then_parse_gives_back_content_and_calls(name: str, content: str | None) -> None:
    parser = get_parser(name)
    text = parser.render(content, ROUND_TRIP_CALLS)
    parsed_content, parsed = parser.parse(text)
    assert parsed_content == content
    assert _calls(parsed) == [
        ("weather", WEATHER),
        ("search", {"query": "größte Stadt", "filters": {"year": [2020, 2021]}, "exact": False}),
        ("noop", {}),
    ]


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", "<tool_call>{'name': 'x'}</tool_call>"),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),
        ("mistral", "[TOOL_CALLS]weather{not json"),
        ("deepseek_v3_1", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>x<｜tool▁sep｜>{bad<｜tool▁call▁end｜>"),
        ("llama3_json", 'no call {"name": "x"} here'),
        ("qwen3_coder", "plain text"),
    ],
)
def test_a_call_that_does_not_parse_leaves_the_whole_text_as_content(name: str, text: str) -> None:
    assert get_parser(name).parse(text) == (text, None)


def test_qwen3_coder_reads_values_by_the_tool_schema() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "properties": {"code": {"type": "string"}, "n": {"type": "integer"}, "on": {"type": "boolean"}}
                },
            },
        }
    ]
    values = {"code": "123", "n": "7", "on": "true", "extra": "None"}
    body = "".join(f"<parameter={key}>\n{value}\n</parameter>\n" for key, value in values.items())
    text = f"<tool_call>\n<function=f>\n{body}</function>\n</tool_call>"
    assert _calls(get_parser("qwen3_coder").parse(text, tools)[1]) == [
        ("f", {"code": "123", "n": 7, "on": True, "extra": None})
    ]
    assert _calls(get_parser("qwen3_coder").parse(text)[1]) == [("f", {"code": 123, "n": 7, "on": True, "extra": None})]


def test_unknown_parser_is_a_config_error_naming_the_known_ones() -> None:
    with pytest.raises(ConfigError) as raised:
        get_parser("granite")
    assert "unknown tool-call parser 'granite'" in raised.value.message and "qwen3_coder" in (raised.value.hint or "")


def test_translator_maps_each_call_back_to_the_raw_text_it_came_from() -> None:
    translator = ToolCallTranslator(tokenizer=None, parser_name="mistral")
    tools = [{"type": "function", "function": {"name": "weather"}}]
    first = 'Hm.[TOOL_CALLS] [{"name": "weather", "arguments": {"city": "Paris"}}]'
    second = '[TOOL_CALLS] [{"name": "weather", "arguments": {"city": "Oslo"}}]'
    content, calls, finish = translator.parse_model_output(first, "auto", tools)
    assert (content, finish) == ("Hm.", "tool_calls") and calls
    _, calls2, _ = translator.parse_model_output(second, "auto", tools)
    assert calls2 and calls2[0]["id"] != calls[0]["id"]
    assert translator.parse_model_output(first, "none", tools) == (first, None, "stop")
    assert translator.parse_model_output("no calls", "auto", tools) == ("no calls", None, "stop")
    messages = [{"role": "assistant", "content": "Hm.", "tool_calls": calls}, {"role": "tool", "content": "sunny"}]
    assert translator.convert_messages_for_template(messages)[0] == {"role": "assistant", "content": first}
    unknown = [{"id": "zz", "type": "function", "function": {"name": "clock", "arguments": "{}"}}]
    rebuilt = translator.convert_messages_for_template(
        [{"role": "assistant", "content": "Now.", "tool_calls": unknown}]
    )
    assert rebuilt[0]["content"] == 'Now.[TOOL_CALLS][{"name": "clock", "arguments": {}}]'


@pytest.mark.parametrize("parser", ["hermes", "mistral", "qwen3_coder", "deepseek_v3"])
def test_managed_server_env_calls_tools_in_each_format(fake_server, tmp_path: Path, parser: str) -> None:
    """A multi-turn Atropos-style env: the model's raw tool call is parsed into message.tool_calls, the tool
    result goes back, and the final node's tokens hold the raw call text (re-rendered from the call id)."""
    server = fake_server(_tool_rule(parser), tokenizer=str(TOKENIZER))
    args = ["process", str(DATA / "managed_tools_env.py"), "--env.tool_parser", parser, "--openai.base_url"]
    args += [
        server.base_url,
        # one group at a time: the rule alternates its final-turn answers, so a group's two final turns must be
        # consecutive (two groups in flight could give one group two right answers)
        "--concurrency",
        "1",
        "--openai.server_type",
        "vllm",
        "--env.tokenizer_name",
        str(TOKENIZER),
        "--out",
        str(tmp_path / "run"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    groups = [json.loads(line) for line in (tmp_path / "run" / "groups.jsonl").read_text().splitlines()]
    assert len(groups) == 2
    from atropos_cli.inference.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(TOKENIZER)
    raw_call = get_parser(parser).render(None, [{"name": "add", "arguments": {"a": 2, "b": 3}}])
    for group in groups:
        assert sorted(group["scores"]) == [0.0, 1.0]
        for tokens, masks, score in zip(group["tokens"], group["masks"], group["scores"], strict=True):
            text = tokenizer.decode(tokens)
            assert raw_call in text and "<|tool|>5<|end|>" in text
            trained = tokenizer.decode([t for t, m in zip(tokens, masks, strict=True) if m != -100])
            assert trained.startswith(raw_call) and ("The answer is 5" in trained) == (score == 1.0)


def _tool_rule(parser: str) -> Any:
    """The tool call on a first turn; on final turns, right and wrong in turn (counted over final turns only, so a
    group's two final turns, consecutive when groups run one at a time, score 1 and 0 in whatever order the
    rollouts' first turns reached the server)."""
    call = get_parser(parser).render(None, [{"name": "add", "arguments": {"a": 2, "b": 3}}])
    finals = itertools.count()

    def rule(prompt: str, k: int) -> str:
        if prompt.rstrip().endswith("<|tool|>5<|end|><|assistant|>"):
            return "The answer is 5" if next(finals) % 2 == 0 else "No idea."
        return call

    return rule


@pytest.mark.atroposlib
def test_hermes_helper_matches_atroposlib() -> None:
    venv_python("ATROPOSLIB_PYTHON", "atroposlib")
    tools = [{"type": "function", "function": {"name": "calculator"}}, {"name": "search"}]
    texts = [
        "Sure. <tool_call>{'name': 'calculator', 'arguments': {'expression': '2*3'}}</tool_call>",
        '<tool_call>{"name": "search", "arguments": {"q": "x"}}</tool_call>'
        '<tool_call>{"name": "calculator"}</tool_call>',
        '<tool_call>{"name": "shell", "arguments": {}}</tool_call>',
        "<tool_call>not json</tool_call>",
        '<call>{"name": "search"}</call>',
        "no call",
    ]
    cases = [(t, tools, tags) for t in texts for tags in (None, ["call", "tool_call"])] + [
        (t, None, None) for t in texts
    ]
    code = (
        "import json, sys\nfrom atroposlib.utils.tool_call_parser import parse_tool_call\n"
        "print(json.dumps([list(parse_tool_call(*c)) for c in json.load(sys.stdin)]))"
    )
    done = subprocess.run([PYTHON, "-c", code], input=json.dumps(cases), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [list(parse_tool_call(*c)) for c in cases]
