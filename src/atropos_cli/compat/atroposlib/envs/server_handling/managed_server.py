"""atroposlib.envs.server_handling.managed_server: token-exact tracking of what the model saw and sampled.

`ManagedServer.chat_completion(messages=..., n=...)` renders the chat with the tokenizer's template, asks the
server for token ids + logprobs (`tokens_and_logprobs_completion`), and records one `SequenceNode` per
choice: `tokens` (prompt + completion), `masked_tokens` (-100 on prompt positions), `logprobs` (1.0 on prompt
positions). A later call whose rendered prompt extends a node's `full_text` (the next turn of the same
conversation) reuses that node's tokens and replaces it, so a multi-turn rollout ends as one node whose
earlier completions stay unmasked. `track_tree=True` keeps every node instead. With tools and a tool parser
(`tool_parser=`: hermes, qwen, llama3_json, llama4_json, mistral, deepseek_v3, deepseek_v3_1, qwen3_coder;
see tool_call_translator), the calls in a completion come back as `message.tool_calls` (finish_reason
"tool_calls") and an assistant message with `tool_calls` in a later prompt renders as the raw text it came
from; nodes keep the raw text. `ManagedServerAdapter` makes a ManagedServer look like an `AsyncOpenAI` client
(`.chat.completions.create`, `.completions.create`, `.base_url`) for libraries such as verifiers.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from pydantic import BaseModel

__all__ = ["SequenceNode", "ManagedServer", "DummyManagedServer", "ManagedServerAdapter"]


class SequenceNode(BaseModel):
    full_text: str
    tokens: list[int]
    masked_tokens: list[int]
    logprobs: list[float]
    metadata: dict[str, Any] | None = None


def _chat_completion(model: str, choices: list[dict[str, Any]]) -> Any:
    from openai.types.chat import ChatCompletion

    return ChatCompletion.model_validate(
        {
            "id": str(uuid.uuid4()),
            "created": int(time.time()),
            "model": model,
            "object": "chat.completion",
            "choices": choices,
        }
    )


class ManagedServer:
    def __init__(
        self,
        server: Any,
        tokenizer: Any = None,
        track_tree: bool = False,
        tool_parser: str | None = None,
        preserve_think_blocks: bool = False,
    ) -> None:
        self.server = server
        self.tokenizer = tokenizer if tokenizer is not None else getattr(server, "tokenizer", None)
        self.track_tree = track_tree
        self.tool_parser = tool_parser
        self.preserve_think_blocks = preserve_think_blocks
        self.current_nodes: list[SequenceNode] = []
        self.sequences: dict[str, SequenceNode] = {}
        self._translator: Any = None

    @property
    def _tool_parser_name(self) -> str | None:  # atroposlib's attribute name (t1_core reads it)
        return self.tool_parser

    def _get_translator(self) -> Any:
        if self._translator is None and self.tool_parser:
            from atropos_cli.compat.atroposlib.envs.server_handling.tool_call_translator import ToolCallTranslator

            self._translator = ToolCallTranslator(self.tokenizer, parser_name=self.tool_parser)
        return self._translator

    def _render(self, messages: list[dict[str, Any]], tools: list[dict] | None) -> str:
        if tools and self._get_translator() is not None:
            messages = self._get_translator().convert_messages_for_template(messages)
        if self.tokenizer is None or not hasattr(self.tokenizer, "apply_chat_template"):
            return "\n".join(f"{m['role']}: {m.get('content', '')}" for m in messages)
        kwargs: dict[str, Any] = {"tokenize": False}
        kwargs["add_generation_prompt"] = not messages or messages[-1].get("role") != "assistant"
        if tools:
            kwargs["tools"] = tools
        return self.tokenizer.apply_chat_template([dict(m) for m in messages], **kwargs)

    def _extending(self, prompt: str) -> SequenceNode | None:
        return next((node for node in self.current_nodes if prompt.startswith(node.full_text)), None)

    def _input_ids(self, prompt: str, node: SequenceNode | None) -> list[int]:
        tokenizer: Any = self.tokenizer  # set: _sample only asks when there is one
        if node is None:
            return list(tokenizer.encode(prompt, add_special_tokens=True))
        suffix = prompt[len(node.full_text) :]
        return node.tokens + (list(tokenizer.encode(suffix, add_special_tokens=False)) if suffix else [])

    def _node(
        self,
        prompt: str,
        prompt_ids: list[int],
        out: list[int],
        lps: list[float],
        text: str,
        finish: str,
        base: SequenceNode | None,
    ) -> SequenceNode:
        lps = (list(lps) + [1.0] * len(out))[: len(out)]
        if base is not None:
            suffix = len(prompt_ids) - len(base.tokens)
            masked = base.masked_tokens + [-100] * suffix + list(out)
            logprobs = base.logprobs + [1.0] * suffix + lps
        else:
            masked = [-100] * len(prompt_ids) + list(out)
            logprobs = [1.0] * len(prompt_ids) + lps
        return SequenceNode(
            full_text=prompt + text,
            tokens=list(prompt_ids) + list(out),
            masked_tokens=masked,
            logprobs=logprobs,
            metadata={"finish_reason": finish},
        )

    def _record(self, node: SequenceNode, base: SequenceNode | None) -> None:
        if self.track_tree:
            self.sequences[node.full_text] = node
        elif base is not None and base in self.current_nodes:
            self.current_nodes[self.current_nodes.index(base)] = node
        else:
            self.current_nodes.append(node)

    async def _sample(self, prompt: str, kwargs: dict[str, Any]) -> tuple[Any, list[int], list, list, list]:
        base = None if self.track_tree else self._extending(prompt)
        if self.track_tree and prompt in self.sequences:
            base = self.sequences[prompt]
        request = {k: v for k, v in kwargs.items() if k not in ("messages", "prompt")}
        request["prompt"] = prompt
        if self.tokenizer is not None:
            request["input_ids"] = self._input_ids(prompt, base)
        prompt_ids, outs, lps, finishes = await self.server.tokens_and_logprobs_completion(**request)
        return base, list(prompt_ids), outs, lps, finishes

    def _decode(self, ids: list[int], keep_special: bool) -> str:
        if self.tokenizer is None:
            return "".join(chr(t) for t in ids if t > 31)
        return self.tokenizer.decode(ids, skip_special_tokens=not keep_special)

    async def chat_completion(self, **kwargs: Any) -> Any:
        tools = kwargs.pop("tools", None)
        tool_choice = kwargs.pop("tool_choice", None)
        use_tools = bool(tools) and self.tool_parser is not None and tool_choice != "none"
        prompt = self._render(kwargs.get("messages", []), tools if use_tools else None)
        base, prompt_ids, outs, lps, finishes = await self._sample(prompt, kwargs)
        choices = []
        for i, out in enumerate(outs):
            finish = finishes[i] if i < len(finishes) else "stop"
            finish = finish.get("type", "stop") if isinstance(finish, dict) else finish
            text = self._decode(out, use_tools)
            self._record(self._node(prompt, prompt_ids, out, lps[i], text, finish, base), base)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if use_tools:
                content, calls, parsed_finish = self._get_translator().parse_model_output(text, tool_choice, tools)
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    finish = parsed_finish
            choices.append({"index": i, "finish_reason": finish, "message": message})
        return _chat_completion(self.server.config.model_name, choices)

    async def completion(self, **kwargs: Any) -> Any:
        from openai.types.completion import Completion

        prompt = kwargs.get("prompt", "")
        base, prompt_ids, outs, lps, finishes = await self._sample(prompt, kwargs)
        choices = []
        for i, out in enumerate(outs):
            finish = finishes[i] if i < len(finishes) else "stop"
            text = self._decode(out, False)
            self._record(self._node(prompt, prompt_ids, out, lps[i], text, finish, base), base)
            choices.append({"index": i, "finish_reason": finish, "text": text, "logprobs": None})
        body = {"id": str(uuid.uuid4()), "created": int(time.time()), "model": self.server.config.model_name}
        return Completion.model_validate({**body, "object": "text_completion", "choices": choices})

    def get_state(self) -> dict[str, Any]:
        if self.track_tree:
            return {"sequences": dict(self.sequences), "tree": dict(self.sequences)}
        return {"nodes": list(self.current_nodes)}

    def reset(self) -> None:
        self.current_nodes = []
        self.sequences = {}

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        if "messages" in kwargs and "input_ids" not in kwargs:
            kwargs["prompt"] = self._render(kwargs.pop("messages"), None)
        if "prompt" in kwargs and "input_ids" not in kwargs and self.tokenizer is not None:
            kwargs["input_ids"] = list(self.tokenizer.encode(kwargs["prompt"], add_special_tokens=True))
        return await self.server.get_logprobs(**kwargs)


class DummyManagedServer(ManagedServer):
    """For OpenAI endpoints (no token ids) when ATROPOS_ALLOW_DUMMY_MANAGED_SERVER=1, as in atroposlib 0.4.0:
    the server's own response, and per choice a node with fixed placeholders that are not fit for training
    (tokens 0..127, the first masked -100, logprobs -0.5) and `full_text` as `role:content` turns joined by
    blank lines."""

    DUMMY_TOKENS = list(range(128))
    DUMMY_MASKED_TOKENS = [-100, *DUMMY_TOKENS[1:]]
    DUMMY_LOGPROBS = [-0.5] * 128

    def _dummy_node(self, full_text: str, finish_reason: str | None) -> None:
        node = SequenceNode(
            full_text=full_text,
            tokens=list(self.DUMMY_TOKENS),
            masked_tokens=list(self.DUMMY_MASKED_TOKENS),
            logprobs=list(self.DUMMY_LOGPROBS),
            metadata={"finish_reason": finish_reason or "stop", "dummy_tokens": True},
        )
        if self.track_tree:
            self.sequences[node.full_text] = node
        else:
            self.current_nodes.append(node)

    async def chat_completion(self, **kwargs: Any) -> Any:
        messages = list(kwargs.get("messages", []))
        response = await self.server.chat_completion(**kwargs)
        for choice in response.choices:
            turns = [*messages, {"role": "assistant", "content": choice.message.content or ""}]
            self._dummy_node("\n\n".join(f"{m['role']}:{m['content']}" for m in turns), choice.finish_reason)
        return response

    async def completion(self, **kwargs: Any) -> Any:
        prompt = kwargs.get("prompt", "")
        response = await self.server.completion(**kwargs)
        for choice in response.choices:
            self._dummy_node(f"{prompt}{choice.text or ''}", choice.finish_reason)
        return response

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        raise NotImplementedError(
            "DummyManagedServer does not support get_logprobs in strict mode. "
            "Use a backend with real prompt logprob support."
        )


class ManagedServerAdapter:
    """A ManagedServer behind the `AsyncOpenAI` surface that libraries call (verifiers): every request goes
    through the ManagedServer, so its tokens and logprobs are tracked. As in atroposlib, `post()` (vLLM
    interleaved rollouts) and `copy()` (tokenization endpoints) are not supported and raise."""

    def __init__(self, managed_server: ManagedServer, base_url: str) -> None:
        self._managed = managed_server
        self.base_url = base_url
        self.chat = _ChatNamespace(managed_server)
        self.completions = _CreateNamespace(managed_server.completion)

    async def post(self, path: str, body: dict, cast_to: type) -> Any:
        raise NotImplementedError(
            f"ManagedServerAdapter does not support post() for path {path!r} (vLLM interleaved rollouts); "
            "use chat.completions.create"
        )

    def copy(self, **kwargs: Any) -> Any:
        raise NotImplementedError("ManagedServerAdapter does not support copy() (vLLM tokenization endpoints)")


class _CreateNamespace:
    def __init__(self, create: Any) -> None:
        self._create = create

    async def create(self, **kwargs: Any) -> Any:
        return await self._create(**kwargs)


class _ChatNamespace:
    def __init__(self, managed: ManagedServer) -> None:
        self.completions = _CreateNamespace(managed.chat_completion)
