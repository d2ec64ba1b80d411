"""Procedural tool schemas and requests for the tool-calling env, plus parsing a model's function calls.

Each tool is a JSON-schema function (OpenAI `tools` shape) with a sentence template; an item picks one tool,
fills its arguments from small value pools with a seeded RNG, and offers it among distractor tools.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["TOOLS", "ToolSpec", "make_request", "parse_call", "parse_calls"]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    params: dict[str, tuple[str, tuple[Any, ...]]]  # argument -> (json type, pool of values)
    template: str

    def schema(self) -> dict[str, Any]:
        props = {arg: {"type": kind} for arg, (kind, _) in self.params.items()}
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "properties": props, "required": list(self.params)},
            },
        }


_CITIES = ("Paris", "Tokyo", "Lagos", "Lima", "Oslo", "Denver", "Hanoi", "Cairo")
TOOLS = (
    ToolSpec(
        "get_weather",
        "Current weather for a city.",
        {"city": ("string", _CITIES), "unit": ("string", ("celsius", "fahrenheit"))},
        "What's the weather in {city} right now? Give it in {unit}.",
    ),
    ToolSpec(
        "convert_currency",
        "Convert an amount between currencies.",
        {
            "amount": ("number", (5, 20, 99.5, 250, 1200)),
            "from_currency": ("string", ("USD", "EUR", "JPY")),
            "to_currency": ("string", ("GBP", "INR", "CHF")),
        },
        "How much is {amount} {from_currency} in {to_currency}?",
    ),
    ToolSpec(
        "set_timer",
        "Start a countdown timer.",
        {"minutes": ("integer", (1, 3, 10, 25, 45)), "label": ("string", ("tea", "pasta", "focus", "laundry"))},
        "Set a {minutes} minute timer called {label}.",
    ),
    ToolSpec(
        "search_flights",
        "Find flights between two cities on a date.",
        {
            "origin": ("string", _CITIES),
            "destination": ("string", _CITIES),
            "date": ("string", ("2025-03-01", "2025-07-14", "2025-12-24")),
        },
        "Find me flights from {origin} to {destination} on {date}.",
    ),
    ToolSpec(
        "send_email",
        "Send a short email.",
        {
            "to": ("string", ("ana@example.com", "bo@example.com", "cy@example.com")),
            "subject": ("string", ("Lunch", "Invoice", "Meeting notes")),
        },
        "Email {to} with the subject {subject}.",
    ),
)


def make_request(rng: random.Random, num_tools: int) -> dict[str, Any]:
    """One request: the target tool + distractors (shuffled schemas), the user's sentence, the expected call."""
    target = rng.choice(TOOLS)
    args = {arg: rng.choice(pool) for arg, (_, pool) in target.params.items()}
    others = [t for t in TOOLS if t is not target]
    offered = [target, *rng.sample(others, k=min(len(others), max(0, num_tools - 1)))]
    rng.shuffle(offered)
    return {
        "tools": [t.schema() for t in offered],
        "request": target.template.format(**args),
        "expected": {"name": target.name, "arguments": args},
    }


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


def parse_call(text: str) -> dict[str, Any] | None:
    """The first function call in `text`: `<tool_call>{...}</tool_call>`, a ```json fence, or a bare JSON object.

    Returns {"name": str, "arguments": dict} or None. `arguments` given as a JSON string is decoded.
    """
    candidates = _TOOL_CALL.findall(text) + _FENCE.findall(text)
    start = text.find("{")
    if start >= 0:
        candidates.append(text[start : text.rfind("}") + 1])
    for raw in candidates:
        try:
            call = json.loads(raw)
        except json.JSONDecodeError:
            continue
        if isinstance(call, dict) and "function" in call and isinstance(call["function"], dict):
            call = call["function"]
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", call.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                arguments = None
        if isinstance(arguments, dict):
            return {"name": call["name"], "arguments": arguments}
    return None


def parse_calls(text: str) -> tuple[list[dict[str, Any]], int]:
    """Every function call in `text`, and how many were malformed: each `<tool_call>` block on its own (a block
    that is not a call counts as malformed); without blocks, `parse_call`'s fence or bare JSON object (an opened
    `<tool_call>` that never parses, e.g. a reply cut by its token limit, is one malformed call)."""
    blocks = _TOOL_CALL.findall(text)
    if blocks:
        found = [parse_call(block) for block in blocks]
        calls = [call for call in found if call is not None]
        return calls, len(found) - len(calls)
    call = parse_call(text)
    if call is not None:
        return [call], 0
    return [], int("<tool_call>" in text)
