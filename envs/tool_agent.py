"""Tool agent: answer a question over several turns with a `lookup` tool (facts only it knows) and a calculator.

Procedural and offline. Each item is a seeded question about 2 to 4 invented towns (`--env.facts`), e.g. "What is
the combined population of Brakel and Ostvim?"; each town's record (population, area, founding year) is drawn
from the item's seed, so only the `lookup` tool knows it. The model has two tools:
- `lookup(town)`: the town's record as JSON (`{"error": ...}` for a town the question does not name);
- `calculator(expression)`: `+ - * /` and parentheses over numbers (thousands separators allowed), nothing else.

Turn loop: the model replies with calls (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, the format
of the `tool_calling` env, read by the same parser; several in one reply run in order, at most 4); each result
comes back as its own message of role `--env.result_role` (`tool`, or `user` for chat templates without a tool
role), and the model replies again. A reply with `<answer>...</answer>` and no call is the final answer and
ends the rollout. A reply with neither gets a one-line reminder of the format, malformed calls a note saying how
many, as a user turn. The rollout also ends after `--env.max_turns` replies, or when the next reply would not fit
the model's context (`--env.max_context`, default the tokenizer's `model_max_length`; part `context_full`). The
built-in system prompt is terse (the shipped tiny model's 256 positions hold it, a reply and a reminder);
`--env.system_prompt` replaces it for models that do better with more words.

Reward: `(1 if the answer is right else 0.2 * found) - 0.1 * wasted`, where `found` is the fraction of the
question's towns whose record the model looked up, and `wasted` counts replies that ran no call and gave no
answer (malformed calls, unknown tools or towns, bad arguments, plain text). So a right answer with no wasted
turn is 1.0, looking the facts up but answering wrong is at most 0.2, answering blind and wrong is 0, and
replies that never call or answer go below 0. Parts: `correct` (1 for the right number: what evaluate's pass@k
counts), `found`, `calls` (calls that ran), `bad_calls`, `wasted`, `turns`, `answered`, `context_full`.

Tokens exactly as in the blackjack env: `atropos_cli.env.multiturn.TokenTrace` builds them turn by turn and the
next prompt is sent as token ids when a tokenizer is known, so the trained tokens are the sampled ones; masks
cover only the model's replies (tool results and reminders are masked), logprobs come from the backend.
Without a tokenizer the rollout runs over chat and the group has messages and scores only.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from pydantic import Field

from atropos_cli.config import EnvConfig
from atropos_cli.env.multiturn import MultiTurnEnv, ScoredPlay, TokenTrace
from atropos_cli.types import Message

from ._shared.answers import answer_tag, last_number, strip_think
from ._shared.items import procedural_items
from ._shared.tools import parse_calls

SYSTEM = (
    'Tools: lookup {"town"}, calculator {"expression"}. '
    'Reply <tool_call>{"name": ..., "arguments": {...}}</tool_call> or <answer>N</answer>.'
)
REMINDER = "Call a tool or answer <answer>N</answer>."
MAX_CALLS = 4  # calls run from one reply; the rest are reported back, not run
WASTED_COST = 0.1
FOUND_CREDIT = 0.2
SYLLABLES = ("bra", "ost", "kel", "vim", "dar", "lun", "tor", "mes", "quin", "zal", "fen", "rho", "pel", "gav", "sor")
FIELDS = {"population": (1_000, 99_999), "area_km2": (5, 900), "founded": (1100, 1990)}
# (operation, field) -> the question; sums take any number of towns, differences two (the larger value first)
QUESTIONS = {
    ("sum", "population"): "What is the combined population of {towns}?",
    ("sum", "area_km2"): "What is the combined area of {towns}, in km2?",
    ("difference", "population"): "How many more people live in {0} than in {1}?",
    ("difference", "founded"): "How many years after {1} was {0} founded?",
}


class ToolAgentConfig(EnvConfig):
    max_turns: int = Field(6, ge=1, description="Model replies per rollout; one without an answer by then scores 0.")
    facts: int = Field(2, ge=2, le=4, description="Towns a question is about (one lookup each).")
    result_role: Literal["tool", "user"] = Field(
        "tool", description="Role of tool-result messages (`user` for chat templates without a tool role)."
    )
    max_context: int | None = Field(
        None, ge=32, description="The model's context in tokens (default: the tokenizer's model_max_length)."
    )
    system_prompt: str | None = Field(None, description="Replaces the built-in (terse) system prompt.")
    eval_size: int = Field(100, ge=1, description="Items of the eval split (atropos evaluate).")


def make_question(rng: random.Random, facts: int) -> dict[str, Any]:
    """A question about `facts` invented towns: their records, the question text and the answer."""
    names: list[str] = []
    while len(names) < facts:
        name = (rng.choice(SYLLABLES) + rng.choice(SYLLABLES)).capitalize()
        if name not in names:
            names.append(name)
    records: dict[str, dict[str, Any]] = {
        n: {"town": n, **{f: rng.randint(lo, hi) for f, (lo, hi) in FIELDS.items()}} for n in names
    }
    op, key = rng.choice([q for q in QUESTIONS if q[0] == "sum" or facts == 2])
    if op == "sum":
        listed = " and ".join(names) if facts == 2 else ", ".join(names[:-1]) + " and " + names[-1]
        question, answer = QUESTIONS[op, key].format(towns=listed), sum(records[n][key] for n in names)
    else:
        names.sort(key=lambda n: records[n][key], reverse=True)
        question, answer = QUESTIONS[op, key].format(*names), records[names[0]][key] - records[names[1]][key]
    return {"question": question, "towns": names, "records": records, "op": op, "field": key, "answer": answer}


_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
}
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
LIMIT = 10**15


def calculate(expression: str) -> int | float:
    """`+ - * /`, unary minus and parentheses over numbers; ValueError for anything else (names, calls, powers,
    results beyond 1e15, expressions over 200 characters)."""
    if len(expression) > 200:
        raise ValueError("the expression is longer than 200 characters")
    try:
        tree = ast.parse(_THOUSANDS.sub("", expression).strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None
    value = _evaluate(tree.body)
    return int(value) if float(value).is_integer() else round(value, 6)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        value = _evaluate(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ValueError("division by zero")
        value = _OPS[type(node.op)](left, right)
        if abs(value) > LIMIT:
            raise ValueError("the result is beyond 1e15")
        return value
    raise ValueError("only numbers, + - * / and parentheses are allowed")


def run_tool(call: dict[str, Any], records: dict[str, dict[str, Any]]) -> tuple[dict[str, Any], str | None]:
    """(the call's result, the town it looked up); a result with an `error` key is a call that did not run."""
    name, args = call["name"], call["arguments"]
    if name == "lookup":
        town = args.get("town")
        if not isinstance(town, str) or set(args) != {"town"}:
            return {"error": 'lookup takes one argument: {"town": NAME}'}, None
        found = next((n for n in records if n.lower() == town.strip().lower()), None)
        return (records[found], found) if found else ({"error": f"no town named {town!r}"}, None)
    if name == "calculator":
        expression = args.get("expression")
        if not isinstance(expression, str) or set(args) != {"expression"}:
            return {"error": 'calculator takes one argument: {"expression": TEXT}'}, None
        try:
            return {"result": calculate(expression)}, None
        except ValueError as exc:
            return {"error": str(exc)}, None
    return {"error": f"unknown tool {name!r}: the tools are lookup and calculator"}, None


def is_right(answer: str, expected: int) -> bool:
    number = last_number(answer)
    try:
        return number is not None and float(number) == expected
    except ValueError:
        return False


@dataclass
class Tally:
    """One rollout's bookkeeping for its reward."""

    calls: int = 0
    bad_calls: int = 0
    wasted: int = 0
    found: set[str] = field(default_factory=set)
    answer: str | None = None
    context_full: bool = False

    def respond(self, text: str, records: dict[str, dict[str, Any]], role: str) -> list[Message] | None:
        """The env's messages after a reply (tool results, a format note), or None when it is the final answer."""
        text = strip_think(text)
        calls, malformed = parse_calls(text)
        if not calls and not malformed:
            self.answer = answer_tag(text)
            if self.answer is not None:
                return None
            self.wasted += 1
            return [{"role": "user", "content": REMINDER}]
        replies: list[Message] = []
        ran = 0
        for call in calls[:MAX_CALLS]:
            result, town = run_tool(call, records)
            ran += "error" not in result
            self.found.update([town] if town else [])
            replies.append({"role": role, "content": json.dumps(result)})
        skipped = max(0, len(calls) - MAX_CALLS)
        notes = [f"{malformed} malformed call(s): write <tool_call>{{JSON}}</tool_call>"] if malformed else []
        notes += [f"{skipped} call(s) past the first {MAX_CALLS} were not run"] if skipped else []
        if notes:
            replies.append({"role": "user", "content": "error: " + "; ".join(notes)})
        self.calls += ran
        self.bad_calls += malformed + skipped + min(len(calls), MAX_CALLS) - ran
        self.wasted += ran == 0
        return replies

    def score(self, item: dict[str, Any]) -> tuple[float, dict[str, float]]:
        correct = self.answer is not None and is_right(self.answer, item["answer"])
        found = len(self.found) / len(item["towns"])
        score = (1.0 if correct else FOUND_CREDIT * found) - WASTED_COST * self.wasted
        parts = {
            "correct": float(correct),
            "found": round(found, 4),
            "calls": float(self.calls),
            "bad_calls": float(self.bad_calls),
            "wasted": float(self.wasted),
            "answered": float(self.answer is not None),
            "context_full": float(self.context_full),
        }
        return round(score, 6), parts


class ToolAgentEnv(MultiTurnEnv):
    name: ClassVar[str] = "tool_agent"
    version: ClassVar[str] = "1"
    description: ClassVar[str] = (
        "multi-turn tool use: lookup + calculator over several turns (procedural, offline); 1 for the right answer"
    )
    env_config_cls = ToolAgentConfig

    @classmethod
    def config_init(cls) -> tuple[EnvConfig, list[Any]]:
        return ToolAgentConfig(group_size=8, max_token_length=128), []

    def items(self, split: str) -> Iterator[dict[str, Any]]:
        config: ToolAgentConfig = self.config  # type: ignore[assignment]
        for item_id, key in procedural_items(config.seed, split, config.eval_size):
            yield {"id": item_id, **make_question(random.Random(key), config.facts)}

    async def play(self, item: dict[str, Any]) -> ScoredPlay:
        """One rollout: model replies and tool results in turn until an answer, `max_turns` or a full context."""
        config: ToolAgentConfig = self.config  # type: ignore[assignment]
        messages: list[Message] = [
            {"role": "system", "content": config.system_prompt or SYSTEM},
            {"role": "user", "content": item["question"]},
        ]
        trace = TokenTrace(self.tokenizer) if self.tokenizer is not None else None
        prompt_ids = trace.start(messages) if trace else None
        context = config.max_context or self.context_length()
        budget = self.turn_budget(len(prompt_ids) if prompt_ids is not None else None, context)
        if budget is None:
            raise ValueError(
                f"the first prompt is {len(prompt_ids or [])} tokens: a context of {context} leaves no room for a reply"
            )
        tally, turns = Tally(), 0
        while True:
            choice = await self.reply(messages, prompt_ids, max_tokens=budget)
            turns += 1
            if trace:
                trace.add_reply(choice.text, choice.token_ids, choice.logprobs, choice.finish_reason)
            messages.append({"role": "assistant", "content": choice.text})
            feedback = tally.respond(choice.text, item["records"], config.result_role)
            if feedback is None:
                break
            messages.extend(feedback)  # the last turn's results stay in the record, not in the tokens
            if turns >= config.max_turns:
                break
            if trace:
                budget = self.turn_budget(len(trace.tokens) + len(trace.bridge(feedback)), context)
                if budget is None:
                    tally.context_full = True
                    break
                prompt_ids = trace.add_messages(feedback)
        score, parts = tally.score(item)
        return ScoredPlay(messages, score, {**parts, "turns": float(turns)}, trace, choice.finish_reason)
