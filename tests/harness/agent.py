"""A small tool-calling agent (a harness) for the recording proxy's tests, written as such programs are: the
official `openai` client on OPENAI_BASE_URL / OPENAI_API_KEY, the task from ATROPOS_TASK, an `add` tool it runs
itself, its final answer written to answer.txt in its working directory.

Loop: ask; run every tool call and send the results; a reply without tool calls is the answer, or, while
`--turns` allows, the agent asks "Are you sure?" and goes on. `--stream` reads replies as server-sent events;
`--rewrite` (or `"rewrite": true` in the task) edits its own copy of the first reply before going on (as
harnesses that compact their history do).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

from openai import OpenAI

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                "required": ["a", "b"],
            },
        },
    }
]


def ask(client: OpenAI, model: str, messages: list[dict[str, Any]], stream: bool) -> dict[str, Any]:
    """One reply as a message dict (content, tool_calls), read whole or from the stream's deltas."""
    if not stream:
        reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS)
        return reply.choices[0].message.model_dump(exclude_none=True)
    content, calls = "", {}
    for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for call in delta.tool_calls or []:
            entry = calls.setdefault(
                call.index, {"id": call.id, "type": "function", "function": {"name": "", "arguments": ""}}
            )
            entry["function"]["name"] += call.function.name or ""
            entry["function"]["arguments"] += call.function.arguments or ""
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--stream", action="store_true")
    parser.add_argument("--rewrite", action="store_true")
    args = parser.parse_args()
    task = json.loads(os.environ["ATROPOS_TASK"])
    client = OpenAI(max_retries=0)
    model = os.environ.get("ATROPOS_MODEL", "policy")
    messages: list[dict[str, Any]] = [{"role": "user", "content": task["question"]}]
    for turn in range(args.turns):
        reply = ask(client, model, messages, args.stream)
        messages.append(reply)
        for call in reply.get("tool_calls") or []:
            arguments = json.loads(call["function"]["arguments"])
            result = int(arguments["a"]) + int(arguments["b"])
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": str(result)})
        if reply.get("tool_calls"):
            continue
        if turn + 1 == args.turns:
            break
        if args.rewrite or task.get("rewrite"):
            messages[1] = {**messages[1], "content": (messages[1].get("content") or "") + " (edited)"}
        messages.append({"role": "user", "content": "Are you sure?"})
    Path("answer.txt").write_text(messages[-1].get("content") or "")
    print(json.dumps({"turns": len([m for m in messages if m["role"] == "assistant"])}))


if __name__ == "__main__":
    main()
