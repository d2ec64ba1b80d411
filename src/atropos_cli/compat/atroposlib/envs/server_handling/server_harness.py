"""atroposlib.envs.server_handling.server_harness: `ServerHarness`, the scripted server of `--testing true`
(`ServerManager(testing=True)`), and `create_chat_completion` / `create_completion` to build its answers.

Test code programs it: `set_desired_response(messages, completion)`, `set_desired_completion(prompt,
completion)`, `set_tokens_and_logprobs_response(prompt, prompt_tokens, outputs, logprobs, finishes)`; a
request returns what was set for exactly those messages (role + content) or that prompt. atroposlib's harness
returns None for anything not set (the env then fails on `.choices`); here ServerManager turns that into one
ConfigError naming the harness, so from the command line, where nothing programs it, `--testing true` fails
on the first request with that message.
"""

from __future__ import annotations

import asyncio
from typing import Any

__all__ = ["ServerHarness", "create_chat_completion", "create_completion"]


def _pick(value: Any, i: int) -> Any:
    return value if isinstance(value, str) else value[i]


def create_chat_completion(resp: str | list[str], n: int = 1, finish_reason: str | list[str] = "stop") -> Any:
    """A ChatCompletion with `n` assistant choices (`resp` / `finish_reason`: one for all, or one each)."""
    from openai.types.chat import ChatCompletion

    choices = [
        {
            "finish_reason": _pick(finish_reason, i),
            "index": i,
            "message": {"role": "assistant", "content": _pick(resp, i)},
        }
        for i in range(n)
    ]
    body = {"id": "test_id", "created": 0, "model": "test_model", "object": "chat.completion", "choices": choices}
    return ChatCompletion.model_validate(body)


def create_completion(resp: str | list[str], n: int = 1, finish_reason: str | list[str] = "stop") -> Any:
    from openai.types.completion import Completion

    choices = [{"finish_reason": _pick(finish_reason, i), "index": i, "text": _pick(resp, i)} for i in range(n)]
    body = {"id": "test_id", "created": 0, "model": "test_model", "object": "text_completion", "choices": choices}
    return Completion.model_validate(body)


class ServerHarness:
    server_healthy = True

    def __init__(self) -> None:
        self.response_map: dict[str, Any] = {}
        self.tokens_and_logprobs_map: dict[str, tuple[list, list, list, list]] = {}
        self.sem = asyncio.Semaphore(1)
        self.eval_sem = asyncio.Semaphore(1)

    def conv_to_dictkey(self, input_message: list[dict[str, Any]]) -> str:
        return "\n".join(f"role:{m['role']}\ncontent:{m['content']}" for m in input_message)

    async def update_weight(self, weight: float) -> None:
        return None

    def set_desired_response(self, input_message: list[dict[str, Any]], desired_response: Any) -> None:
        self.response_map[self.conv_to_dictkey(input_message)] = desired_response

    def set_desired_completion(self, input_message: str, completion: Any) -> None:
        self.response_map[input_message] = completion

    def set_tokens_and_logprobs_response(
        self,
        prompt: str,
        prompt_tokens: list,
        output_tokens_list: list,
        output_logprobs_list: list,
        finish_reasons: list,
    ) -> None:
        self.tokens_and_logprobs_map[prompt] = (prompt_tokens, output_tokens_list, output_logprobs_list, finish_reasons)

    async def chat_completion(self, *args: Any, **kwargs: Any) -> Any:
        return self.response_map.get(self.conv_to_dictkey(kwargs.get("messages") or []))

    async def completion(self, *args: Any, **kwargs: Any) -> Any:
        return self.response_map.get(str(kwargs.get("prompt")))

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> Any:
        return self.tokens_and_logprobs_map.get(str(kwargs.get("prompt")))
