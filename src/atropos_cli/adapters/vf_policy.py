"""The policy behind verifiers' interception server: every model call of a harness program (the assistant's turns,
a modeled user's) is sampled by our inference router, from token ids we build, so the trained tokens are
exactly the sampled ones across turns.

verifiers records a rollout as a message graph whose nodes carry token ids (`MessageNode.token_ids`, `mask`,
`logprobs`); a client returns each turn's `TurnTokens` (prompt ids, completion ids, logprobs) and the graph
stores them. `AtroposPolicy` is that client:
- the first turn (or one that does not continue a sampled turn) is the chat template's rendering of the prompt
  and the tools' schemas;
- a later turn is the previous turn's ids, its sampled completion ids exactly as the backend returned them, and
  only the *bridge* for the messages the harness added (tool results, the user's next message), rendered by the
  template and cut after the reply (`env.multiturn.bridge_ids`). Such a turn is marked bridged, so verifiers
  checks that its prompt extends the stored prefix token for token (a rewritten history is refused there, never
  re-tokenised);
- the reply text is split into content and tool calls by one of our tool-call parsers (`--env.tool_parser`).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from atropos_cli.compat.tool_parsers import get_parser
from atropos_cli.env.multiturn import bridge_ids
from atropos_cli.inference.base import Choice
from atropos_cli.tokens import chat_prompt_ids

__all__ = ["policy_client", "seat_policy"]

Sample = Callable[[list[int]], Awaitable[Choice]]


def policy_client(tokenizer: Any, sample: Sample, tool_parser: str) -> Any:
    """A verifiers `Client` whose turns are sampled by `sample(prompt_ids)` (one choice with token ids)."""
    from verifiers.v1.clients import Client

    parser = get_parser(tool_parser)

    class AtroposPolicy(Client):
        async def get_response(
            self,
            dialect: Any,
            body: dict,
            sampling: Any,
            session_id: str | None = None,
            turn: Any = None,
            headers: Mapping[str, str] | None = None,
        ) -> Any:
            from verifiers.v1.clients.train import serialize_completion, tool_to_wire
            from verifiers.v1.dialects import ChatDialect
            from verifiers.v1.dialects.chat import message_to_wire
            from verifiers.v1.errors import ProviderError
            from verifiers.v1.types import AssistantMessage, Response, ToolCall, TurnTokens, Usage

            if not isinstance(dialect, ChatDialect):
                raise ProviderError(
                    f"the vf: adapter samples chat-completions turns only, not {type(dialect).__name__}",
                    status_code=400,
                )
            if turn is not None:
                prompt, tools = turn.prompt, turn.tools
            else:
                request = dialect.parse_request(body)
                prompt, tools = request.messages, request.tools
            wire = [message_to_wire(m) for m in prompt]
            wire_tools = [tool_to_wire(t) for t in tools] if tools else None
            try:
                prompt_ids, bridged = turn_prompt_ids(tokenizer, turn, wire, wire_tools)
            except ValueError as exc:
                raise ProviderError(f"cannot build the turn's prompt ids: {exc}", status_code=400) from None
            choice = await sample(prompt_ids)
            if choice.token_ids is None:
                raise ProviderError(
                    "the inference backend returned no token ids; the vf: adapter trains on the sampled ids",
                    status_code=400,
                )
            content, calls = parser.parse(choice.text, wire_tools)
            tool_calls = [
                ToolCall(id=c["id"], name=c["function"]["name"], arguments=c["function"]["arguments"])
                for c in calls or []
            ]
            logprobs = choice.logprobs if choice.logprobs is not None else []
            finish = "tool_calls" if tool_calls else choice.finish_reason
            response = Response(
                id=f"atropos-{session_id or 'call'}",
                created=0,
                model=body.get("model", ""),
                message=AssistantMessage(content=content, tool_calls=tool_calls or None),
                finish_reason=finish if finish in ("stop", "length", "tool_calls") else None,
                usage=Usage(prompt_tokens=len(prompt_ids), completion_tokens=len(choice.token_ids)),
                tokens=TurnTokens(
                    prompt_ids=prompt_ids,
                    completion_ids=list(choice.token_ids),
                    completion_logprobs=[float(x) for x in logprobs],
                    bridged=bridged,
                ),
            )
            response.raw = serialize_completion(response, response.model)
            return response

    return AtroposPolicy()


def turn_prompt_ids(
    tokenizer: Any, turn: Any, wire: list[dict[str, Any]], tools: list[dict[str, Any]] | None
) -> tuple[list[int], bool]:
    """(prompt ids, bridged): the stored ids + sampled completion + bridge when the turn continues a sampled
    reply on its graph path, else the template's rendering of the whole prompt."""
    previous = turn.previous_renderer_token_ids() if turn is not None and turn.tail else None
    if previous is None:
        if tools:
            check_tools_rendered(tokenizer, tools)
        return chat_prompt_ids(tokenizer, wire, tools), False
    before_ids, reply_ids = previous
    reply_at = turn.tail_start - 1  # the sampled assistant message the tail answers
    eos = getattr(tokenizer, "eos_token_id", None)
    bridge = bridge_ids(
        tokenizer, wire[:reply_at], wire[turn.tail_start :], reply_had_eos=reply_ids[-1] == eos, tools=tools
    )
    return [*before_ids, *reply_ids, *bridge], True


def check_tools_rendered(tokenizer: Any, tools: list[dict[str, Any]]) -> None:
    """Refuse a chat template that ignores `tools` (the model would be asked to call tools it never sees)."""
    chat = [{"role": "user", "content": "x"}]
    with_tools = tokenizer.apply_chat_template(chat, tools=tools, add_generation_prompt=True, tokenize=False)
    without = tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    if with_tools == without:
        names = ", ".join(t["function"]["name"] for t in tools)
        raise ValueError(f"the tokenizer's chat template does not render tools ({names})")


def seat_policy(interception: Any, client_config: Any, client: Any) -> None:
    """Make `client` the model client of every rollout whose `ctx.client` is `client_config`, on a running
    verifiers `InterceptionServer` (it keys its clients by the config's JSON and builds one only when absent)."""
    interception.clients[client_config.model_dump_json()] = client
