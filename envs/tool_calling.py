"""Tool calling: pick the right function from a list of JSON schemas and call it with the right arguments.

Procedural and offline (Atropos' `tool_calling` env uses a hub dataset; ours generates requests from five
tool templates with a seeded RNG, so it runs anywhere). The prompt lists the offered tools as JSON schemas
(target + distractors, shuffled) and asks for `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`;
a ```json fence or a bare JSON object is read too.

Reward (partial credit, documented):
- 1.0: the right name and exactly the expected arguments;
- right name, arguments off: 0.5 + 0.5 * F1 over the (argument, value) pairs, capped below 1
  (numbers compare by value, strings case-insensitively);
- wrong name or no parseable call: 0.0.
Parts: `correct` (1 only for the exact call), `name` (right function), `args_f1`.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from typing import Any, ClassVar

from atropos_cli.config import EnvConfig
from atropos_cli.env.base import SimpleEnv

from ._shared.items import procedural_items
from ._shared.tools import make_request, parse_call


class ToolCallingConfig(EnvConfig):
    eval_size: int = 100
    num_tools: int = 3
    """Tools offered per request (the right one plus num_tools - 1 distractors)."""


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return float(a) == float(b)
    if isinstance(a, str) and isinstance(b, str):
        return a.strip().lower() == b.strip().lower()
    return a == b


def score_call(call: dict[str, Any] | None, expected: dict[str, Any]) -> dict[str, float]:
    if call is None or call["name"] != expected["name"]:
        return {"score": 0.0, "correct": 0.0, "name": 0.0, "args_f1": 0.0}
    want, got = expected["arguments"], call["arguments"]
    matched = sum(1 for k, v in want.items() if k in got and _same(got[k], v))
    precision = matched / len(got) if got else 0.0
    recall = matched / len(want) if want else 1.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    if not want and not got:
        f1 = 1.0
    exact = matched == len(want) and len(got) == len(want)
    score = 1.0 if exact else min(0.5 + 0.5 * f1, 0.9)
    return {"score": score, "correct": 1.0 if exact else 0.0, "name": 1.0, "args_f1": round(f1, 4)}


class ToolCallingEnv(SimpleEnv):
    name: ClassVar[str] = "tool_calling"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "single-turn function calling; procedural tool schemas (offline); 1 exact call, partial for right name"
    )
    env_config_cls = ToolCallingConfig

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return ToolCallingConfig(group_size=8, max_token_length=256), []

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        config: ToolCallingConfig = self.config  # type: ignore[assignment]
        for item_id, key in procedural_items(config.seed, split, config.eval_size):
            yield {"id": item_id, **make_request(random.Random(key), config.num_tools)}

    def prompt(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        tools = "\n".join(json.dumps(t) for t in item["tools"])
        system = (
            "You can call these tools (JSON schemas, one per line):\n"
            f"{tools}\n"
            'Answer with exactly one call: <tool_call>{"name": NAME, "arguments": {...}}</tool_call>'
        )
        return [{"role": "system", "content": system}, {"role": "user", "content": item["request"]}]

    def reward(self, completion: str, item: dict[str, Any]) -> dict[str, float]:
        return score_call(parse_call(completion), item["expected"])
