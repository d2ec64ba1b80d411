"""vLLM's native `POST /generate` for the fake inference server: token ids in, token ids + logprobs out.

Atropos' `VLLMServer` (and so its `ManagedServer` and `get_logprobs`) talks to this endpoint, not to the
OpenAI routes: `{"prompt": {"prompt_token_ids": [...]}, "n", "max_tokens", "logprobs": 0,
"prompt_logprobs": k}` -> `{"text": [...], "finish_reasons": [...], "logprobs": [[[{id: lp}], ...], ...],
"prompt_token_ids": [...], "token_ids": [[...]], "prompt_logprobs": [None, {id: lp, ...}, ...]}`.

Unlike the OpenAI routes (one token per byte), this one uses a real tokenizer (`FakeInferenceServer(...,
tokenizer=DIR)`): it decodes the prompt ids to text, answers by the server's rule and encodes the answer, so
an env's own tokenizer decodes the ids back to the answer. Logprobs are the server's `token_logprob(id)`; the
top-k prompt logprobs of position i are the prompt token itself and the next k-1 ids of the vocabulary, each
0.5 lower. Requests count in the server's stats and get its injected faults, like the OpenAI routes.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["GenerateRequest", "add_generate_route", "generate_body", "top_k_entry", "tokenized_completion_body"]

Cut = Callable[[str, "int | None", Any], tuple[str, str]]
Logprob = Callable[[int], float]


class _PromptIds(BaseModel):
    prompt_token_ids: list[int]


class GenerateRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    prompt: _PromptIds | str
    n: int = 1
    max_tokens: int | None = 16
    stop: str | list[str | int] | None = None  # vLLM takes token ids among the stop strings
    logprobs: int | None = None
    prompt_logprobs: int | None = None


@cache
def _tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def top_k_entry(token_id: int, k: int, vocab_size: int, logprob: Logprob) -> dict[str, float]:
    """The fake top-k logprobs of one prompt position: the token itself first, then its vocabulary successors."""
    base = logprob(token_id)
    return {str((token_id + j) % vocab_size): round(base - 0.5 * j, 4) for j in range(k)}


def _sample(
    server: Any, tokenizer: Any, prompt: str, max_tokens: int | None, stop: Any, cut: Cut
) -> tuple[list[int], str]:
    """One answer of the server's rule to `prompt`, in the tokenizer's ids: (ids, finish reason)."""
    stop_ids = [s for s in stop if isinstance(s, int)] if isinstance(stop, list) else []
    stop_text = [s for s in stop if isinstance(s, str)] if isinstance(stop, list) else stop
    text, finish = cut(server.answer(prompt), None, stop_text)
    ids = list(tokenizer.encode(text, add_special_tokens=False))
    hit = next((i for i, t in enumerate(ids) if t in stop_ids), None)
    if hit is not None:
        ids, finish = ids[:hit], "stop"
    if max_tokens is not None and len(ids) > max_tokens:
        ids, finish = ids[:max_tokens], "length"
    return ids, finish


def tokenized_completion_body(server: Any, req: Any, cut: Cut, logprob: Logprob) -> dict[str, Any]:
    """`/v1/completions` in the tokenizer's ids (`FakeInferenceServer(tokenizer=DIR, tokenizer_ids=True)`): a
    token-id prompt is decoded, the answer encoded, and a natural stop ends with EOS in `token_ids` (vLLM's)."""
    from atropos_cli.inference.openai_schema import prompt_list

    tokenizer = _tokenizer(server.tokenizer)
    choices, prompt_tokens = [], 0
    for p, one in enumerate(prompt_list(req.prompt)):
        ids_in = list(one) if isinstance(one, list) else list(tokenizer.encode(one, add_special_tokens=False))
        prompt_tokens += len(ids_in)
        prompt = tokenizer.decode(ids_in, skip_special_tokens=False)
        for index in range(1 if server.ignore_n else max(1, req.n)):
            ids, finish = _sample(server, tokenizer, prompt, req.max_tokens, req.stop, cut)
            text = tokenizer.decode(ids)
            if finish == "stop" and tokenizer.eos_token_id is not None:
                ids = [*ids, tokenizer.eos_token_id]
            choice: dict[str, Any] = {"index": p * req.n + index, "text": text, "finish_reason": finish}
            choice["logprobs"] = None
            if req.logprobs is not None:
                choice["logprobs"] = {
                    "tokens": [tokenizer.decode([t]) for t in ids],
                    "token_logprobs": [logprob(t) for t in ids],
                }
            if req.return_token_ids:
                choice.update(token_ids=ids, prompt_token_ids=ids_in)
            choices.append(choice)
    return server._envelope("text_completion", choices, prompt_tokens)


def generate_body(server: Any, req: GenerateRequest, cut: Cut, logprob: Logprob) -> dict[str, Any]:
    """Answer one `/generate` request the way vLLM's example API server does."""
    tokenizer = _tokenizer(server.tokenizer)
    ids_in = (
        list(req.prompt.prompt_token_ids)
        if isinstance(req.prompt, _PromptIds)
        else list(tokenizer.encode(req.prompt, add_special_tokens=False))
    )
    prompt = tokenizer.decode(ids_in, skip_special_tokens=False)
    texts, finishes, token_ids = [], [], []
    for _ in range(1 if server.ignore_n else max(1, req.n)):
        ids, finish = _sample(server, tokenizer, prompt, req.max_tokens, req.stop, cut)
        texts.append(tokenizer.decode(ids))
        finishes.append(finish)
        token_ids.append(ids)
    server.choices_sent += len(texts)
    body: dict[str, Any] = {
        "text": texts,
        "prompt": prompt,
        "finish_reasons": finishes,
        "prompt_token_ids": ids_in,
        "token_ids": token_ids,
    }
    if req.logprobs is not None:
        body["logprobs"] = [[[{str(t): logprob(t)}] for t in ids] for ids in token_ids]
    if req.prompt_logprobs:
        vocab = len(tokenizer)
        top = [top_k_entry(t, req.prompt_logprobs, vocab, logprob) for t in ids_in[1:]]
        body["prompt_logprobs"] = [None, *top]
    return body


def add_generate_route(app: Any, server: Any, cut: Cut, logprob: Logprob) -> None:
    """Mount `POST /generate` on the fake server's app (counted and faulted like the other routes)."""

    async def generate(req: GenerateRequest) -> Any:
        return await server._answer(req, lambda: generate_body(server, req, cut, logprob))

    app.post("/generate")(generate)
