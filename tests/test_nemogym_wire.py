"""NeMo Gym's wire format as the `nemogym:` adapter reads and writes it (no nemo-gym needed: the rows and items
are plain JSON; tests/test_nemogym.py runs them against real NeMo Gym servers)."""

from __future__ import annotations

import asyncio
import json

import pytest

from atropos_cli.adapters.nemogym import wire
from atropos_cli.testing import free_port

TOOL = {"type": "function", "name": "add", "description": "Add.", "strict": True,
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}  # fmt: skip


def test_a_rows_input_becomes_the_chat():
    params = {
        "instructions": "Be brief.",
        "input": [
            {"role": "developer", "content": "Use tools."},
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "What is "}, {"type": "input_text", "text": "2?"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "add", "arguments": '{"a": 1}'},
            {"type": "function_call_output", "call_id": "c1", "output": '{"sum": 1}'},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "1"}]},
        ],
    }
    assert wire.row_messages(params) == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "What is 2?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}]},
        {"role": "tool", "tool_call_id": "c1", "content": '{"sum": 1}'},
        {"role": "assistant", "content": "1"},
    ]  # fmt: skip
    assert wire.row_messages({"input": "hi"}) == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "'input_image'"),
        ({"input": [{"type": "reasoning", "summary": []}]}, "'reasoning' item"),
        ({"input": []}, "has no input"),
    ],
)
def test_what_the_chat_cannot_show_is_named(params, message):
    with pytest.raises(ValueError, match=message):
        wire.row_messages(params)


def test_tools_become_chat_template_tools_and_only_functions_pass():
    (tool,) = wire.chat_tools({"tools": [TOOL]}) or []
    assert tool == {
        "type": "function",
        "function": {k: TOOL[k] for k in ("name", "description", "parameters", "strict")},
    }
    assert wire.chat_tools({}) is None
    with pytest.raises(ValueError, match="'web_search' tool"):
        wire.chat_tools({"tools": [{"type": "web_search"}]})


def test_the_response_verify_reads_lists_the_items_in_order():
    call = {"id": "call_0", "type": "function", "function": {"name": "add", "arguments": '{"a": 1}'}}
    output = [wire.call_item(call), wire.call_output_item("call_0", '{"sum": 1}'), wire.message_item("1", 2)]
    body = wire.response_body({"tools": [TOOL]}, output, "m", complete=False)
    assert [item["type"] for item in body["output"]] == ["function_call", "function_call_output", "message"]
    assert body["output"][0]["call_id"] == body["output"][1]["call_id"] == "call_0"
    assert body["output"][2]["content"] == [{"type": "output_text", "text": "1", "annotations": []}]
    assert body["status"] == "incomplete" and body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["tools"] == [TOOL] and body["object"] == "response"


def test_a_tool_the_row_does_not_offer_or_bad_arguments_never_reach_the_server():
    async def calls() -> list[str]:
        # nothing listens on this port: a request would fail with NemoGymError, these answer without one
        async with wire.ResourcesSession(f"http://127.0.0.1:{free_port()}", 5.0, {"add"}) as session:
            return [
                await session.call_tool("verify", "{}"),
                await session.call_tool("add", "{not json"),
                await session.call_tool("add", "[1, 2]"),
            ]

    answers = [json.loads(a)["error"] for a in asyncio.run(calls())]
    assert "no tool named 'verify'" in answers[0]
    assert answers[1].startswith("Invalid tool call arguments") and "not a JSON object" in answers[2]


def test_a_server_that_is_not_there_fails_the_session_with_one_line():
    async def seed() -> None:
        async with wire.ResourcesSession(f"http://127.0.0.1:{free_port()}", 5.0, set()) as session:
            await session.seed({"responses_create_params": {"input": "hi"}})

    with pytest.raises(wire.NemoGymError, match="POST /seed_session on the resources server failed"):
        asyncio.run(seed())
