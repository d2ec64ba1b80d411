"""A real OpenAI-compatible inference server with scripted answers, for tests and benchmarks (no model, no GPU).

It sits where vLLM would: the router and `OpenAICompatBackend` talk to it over real HTTP on 127.0.0.1. It is
one more backend (a `Served`) behind `atropos inference`'s app (`inference.server.create_app`): the same
request schema, limits and cross-site guard, with vLLM's leniency (unknown sampling parameters are accepted
and logged). It answers vLLM-style (`prompt_token_ids`, per-choice `token_ids`, `logprobs`) with a deterministic
tokenisation: one token per UTF-8 byte, token id = byte value. Given `tokenizer=DIR` it also speaks vLLM's
native `POST /generate` with that tokenizer's ids (fake_generate.py; Atropos' VLLMServer and ManagedServer).

Knobs reproduce what real servers do to clients: latency (an `asyncio.sleep`, so concurrent requests overlap),
an error rate with a chosen status, non-JSON answers, providers that ignore `n`, servers that reject
`logprobs`. The server counts requests and the peak number in flight so tests can check concurrency bounds.

Run it standalone (benchmarks, the wheel test)::

    python -m atropos_cli.testing.fake_server --port 9001 --rule arithmetic --latency 0.2 --accuracy 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from atropos_cli.errors import AtroposError
from atropos_cli.inference.openai_schema import ChatRequest, CompletionRequest, HTTPError, prompt_list

__all__ = ["FakeInferenceServer", "Rule", "main"]

Rule = str | list[str] | Callable[[str, int], str]
_QUESTION = re.compile(r"What is (-?\d+) ([+\-*]) (-?\d+)\?")


def encode(text: str) -> list[int]:
    """The fake tokenizer: one token per UTF-8 byte."""
    return list(text.encode("utf-8"))


def token_logprob(token_id: int) -> float:
    """A deterministic, negative 'logprob' per token, so tests can check the exact values parsed."""
    return -round(0.05 + (token_id % 13) / 10, 4)


def render_chat(messages: list[dict[str, Any]]) -> str:
    """A fixed chat template, so `prompt_token_ids` are deterministic."""
    parts = [f"<|{m.get('role', 'user')}|>{m.get('content') or ''}\n" for m in messages]
    return "".join(parts) + "<|assistant|>"


class _Answerer:
    """Turns (prompt text, choice counter) into completion text according to the rule."""

    def __init__(self, rule: Rule, accuracy: float, seed: int) -> None:
        if isinstance(rule, str) and rule not in ("arithmetic", "echo"):
            raise ValueError(f"unknown fake-server rule {rule!r}; use 'arithmetic', 'echo', a list or a callable")
        if isinstance(rule, list) and not rule:
            raise ValueError("a scripted rule needs at least one answer")
        self.rule = rule
        self.accuracy = accuracy
        self.rng = random.Random(seed)
        self.counter = 0

    def __call__(self, prompt: str) -> str:
        index = self.counter
        self.counter += 1
        if callable(self.rule):
            return self.rule(prompt, index)
        if isinstance(self.rule, list):
            return self.rule[index % len(self.rule)]
        if self.rule == "echo":
            return prompt
        return self._arithmetic(prompt)

    def _arithmetic(self, prompt: str) -> str:
        found = _QUESTION.search(prompt)
        if not found:
            return "I do not know."
        a, op, b = int(found[1]), found[2], int(found[3])
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        if self.rng.random() >= self.accuracy:
            answer += self.rng.choice((-3, -2, -1, 1, 2, 3))
        return str(answer)


def _cut(text: str, max_tokens: int | None, stop: str | list[str | int] | None) -> tuple[str, str]:
    """Apply stop strings (a token id is its byte here), then the token budget; return (text, finish_reason)."""
    for s in [stop] if isinstance(stop, str) else [chr(t) if isinstance(t, int) else t for t in stop or []]:
        if s and s in text:
            return text[: text.index(s)], "stop"
    data = text.encode("utf-8")
    if max_tokens is not None and len(data) > max_tokens:
        return data[:max_tokens].decode("utf-8", errors="ignore"), "length"
    return text, "stop"


class FakeInferenceServer:
    """An OpenAI-compatible HTTP server on 127.0.0.1, run by uvicorn in a background thread.

    `with FakeInferenceServer(rule="arithmetic", latency_s=0.2) as srv: ... srv.base_url ...`
    """

    def __init__(
        self,
        rule: Rule = "arithmetic",
        *,
        latency_s: float = 0.0,
        error_rate: float = 0.0,
        error_status: int = 500,
        retry_after: float | None = None,
        ignore_n: bool = False,
        return_tokens: bool = True,
        reject_logprobs: bool = False,
        garbage: bool = False,
        accuracy: float = 0.5,
        seed: int = 0,
        model_name: str = "fake-model",
        api_key: str | None = None,
        max_body_mb: float = 64.0,
        tokenizer: str | None = None,
        tokenizer_ids: bool = False,
        whole_chat: bool = False,
        host: str = "127.0.0.1",
        port: int = 0,
        allowed_hosts: list[str] | None = None,
    ) -> None:
        self.answer = _Answerer(rule, accuracy, seed)
        self.latency_s = latency_s
        self.error_rate = error_rate
        self.error_status = error_status
        self.retry_after = retry_after
        self.ignore_n = ignore_n
        self.return_tokens = return_tokens
        self.reject_logprobs = reject_logprobs
        self.garbage = garbage
        self.model_name = model_name
        self.api_key = api_key
        self.max_body_mb = max_body_mb
        self.tokenizer = tokenizer  # a tokenizer dir: adds vLLM's native POST /generate (fake_generate.py)
        # with the tokenizer: /v1/completions reads token-id prompts and answers in its ids, as vLLM does
        self.tokenizer_ids = tokenizer_ids and tokenizer is not None
        self.whole_chat = whole_chat  # the rule reads a chat request's whole chat (render_chat), not its last user turn
        self.version = 0
        self.host = host
        self.port = port
        self.allowed_hosts = allowed_hosts or []  # `Host` names answered besides loopback (httpguard.HostPolicy)
        self._error_rng = random.Random(seed + 1)
        self._server: Any = None
        self.reset_stats()

    # -- lifecycle ---------------------------------------------------------------------------------------

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def start(self, timeout_s: float = 10.0) -> FakeInferenceServer:
        from atropos_cli.testing.threaded import ThreadedServer

        self._server = ThreadedServer(build_app(self), self.host, self.port, lifespan="off").start(timeout_s)
        self.port = self._server.port
        return self

    def request_stop(self) -> None:
        """Ask the server to shut down without waiting (stop several at once, then `stop()` each)."""
        if self._server is not None:
            self._server.request_stop()

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
        self._server = None

    def __enter__(self) -> FakeInferenceServer:
        return self if self._server is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- statistics (read by tests; mutated only on the server's event loop) -----------------------------

    def reset_stats(self) -> None:
        self.requests = 0
        self.errors_sent = 0
        self.choices_sent = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.request_log: list[dict[str, Any]] = []

    def stats(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors_sent": self.errors_sent,
            "choices_sent": self.choices_sent,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
        }

    # -- answering ---------------------------------------------------------------------------------------

    def _fault(self, body: dict[str, Any]) -> tuple[int, str] | None:
        """The injected failure for this request, if any: (status, message)."""
        if self.reject_logprobs and (body.get("logprobs") or body.get("return_token_ids")):
            return 400, "logprobs is not supported by this server"
        if self.error_rate > 0 and self._error_rng.random() < self.error_rate:
            return self.error_status, f"injected error (HTTP {self.error_status})"
        return None

    def _choices(self, prompt: str, n: int, max_tokens: int | None, stop: Any) -> list[tuple[str, str]]:
        count = 1 if self.ignore_n else max(1, n)
        return [_cut(self.answer(prompt), max_tokens, stop) for _ in range(count)]

    # -- the Served interface (what inference.server.create_app calls) ------------------------------------

    strict = False  # like vLLM: unknown sampling parameters (top_k, min_p, ...) are accepted

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "model": self.model_name, "version": self.version}

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model_name, "object": "model", "created": 0, "owned_by": "atropos-fake"}

    def max_prompt_chars(self) -> int | None:
        return None

    @contextlib.contextmanager
    def arriving(self) -> Iterator[None]:
        yield

    async def chat(self, req: ChatRequest) -> dict[str, Any] | Any:
        return await self._answer(req, lambda: self.chat_body(req))

    async def complete(self, req: CompletionRequest) -> dict[str, Any] | Any:
        return await self._answer(req, lambda: self.completion_body(req))

    async def reload(self, path: str) -> dict[str, Any]:
        """Pretend to load weights: the directory must exist; bumps `version` (trainer-sync tests)."""
        if not os.path.isdir(path):
            raise HTTPError(400, f"checkpoint directory {path!r} does not exist", param="path")
        self.version += 1
        return {"status": "ok", "model": self.model_name, "version": self.version, "path": path}

    async def aclose(self) -> None:
        return None

    async def _answer(self, req: ChatRequest | CompletionRequest, build: Callable[[], dict[str, Any]]) -> Any:
        from fastapi.responses import JSONResponse, PlainTextResponse

        self.requests += 1
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            body = req.model_dump(exclude_unset=True)
            self.request_log = [*self.request_log[-999:], body]
            if self.latency_s > 0:
                await asyncio.sleep(self.latency_s)
            fault = self._fault(body)
            if fault is not None:
                self.errors_sent += 1
                status, message = fault
                headers = {"Retry-After": str(self.retry_after)} if self.retry_after is not None else None
                error = {"message": message, "type": "fake_error", "param": None, "code": status}
                return JSONResponse({"error": error}, status_code=status, headers=headers)
            if self.garbage:
                return PlainTextResponse("<html>upstream proxy error</html>", status_code=200)
            return build()
        finally:
            self.in_flight -= 1

    def chat_body(self, req: ChatRequest) -> dict[str, Any]:
        users = [m for m in req.messages if m.role == "user"]
        prompt = users[-1].text() if users else ""
        if self.whole_chat:
            prompt = render_chat([m.for_template() for m in req.messages])
        want_ids = self.return_tokens and req.return_token_ids
        choices = []
        for index, (text, finish) in enumerate(self._choices(prompt, req.n, req.budget, req.stop)):
            ids = encode(text)
            choice: dict[str, Any] = {
                "index": index,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
            if self.return_tokens and req.logprobs:
                content = [
                    {"token": chr(t), "logprob": token_logprob(t), "bytes": [t], "top_logprobs": []} for t in ids
                ]
                choice["logprobs"] = {"content": content}
            if want_ids:
                choice["token_ids"] = ids
            choices.append(choice)
        prompt_ids = encode(render_chat([m.for_template() for m in req.messages]))
        body = self._envelope("chat.completion", choices, len(prompt_ids))
        if want_ids:
            body["prompt_token_ids"] = prompt_ids
        return body

    def completion_body(self, req: CompletionRequest) -> dict[str, Any]:
        if self.tokenizer_ids:
            from atropos_cli.testing.fake_generate import tokenized_completion_body

            return tokenized_completion_body(self, req, _cut, token_logprob)
        want_ids = self.return_tokens and req.return_token_ids
        choices, prompt_tokens = [], 0
        for p, one in enumerate(prompt_list(req.prompt)):
            if isinstance(one, list):
                prompt = bytes(t % 256 for t in one).decode("utf-8", errors="replace")
                prompt_ids = list(one)
            else:
                prompt, prompt_ids = one, encode(one)
            prompt_tokens += len(prompt_ids)
            for index, (text, finish) in enumerate(self._choices(prompt, req.n, req.max_tokens, req.stop)):
                ids = encode(text)
                choice: dict[str, Any] = {"index": p * req.n + index, "text": text, "finish_reason": finish}
                choice["logprobs"] = None
                if self.return_tokens and req.logprobs is not None:
                    choice["logprobs"] = {
                        "tokens": [chr(t) for t in ids],
                        "token_logprobs": [token_logprob(t) for t in ids],
                        "top_logprobs": None,
                        "text_offset": list(range(len(ids))),
                    }
                if want_ids:
                    choice["token_ids"] = ids
                    choice["prompt_token_ids"] = prompt_ids  # vLLM puts them per choice on /v1/completions
                choices.append(choice)
        return self._envelope("text_completion", choices, prompt_tokens)

    def _envelope(self, obj: str, choices: list[dict[str, Any]], prompt_tokens: int) -> dict[str, Any]:
        self.choices_sent += len(choices)
        completion_tokens = sum(
            len(encode(c.get("text") or (c.get("message") or {}).get("content") or "")) for c in choices
        )
        return {
            "id": f"fake-{self.requests}",
            "object": obj,
            "created": int(time.time()),
            "model": self.model_name,
            "choices": choices,
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }


def build_app(server: FakeInferenceServer) -> Any:
    """The app behind a FakeInferenceServer: `atropos inference`'s own app with the fake as its backend."""
    from atropos_cli.inference.server import ServerSettings, create_app

    settings = ServerSettings(
        max_body_mb=server.max_body_mb, api_key=server.api_key, host=server.host, allowed_hosts=server.allowed_hosts
    )
    app = create_app(server, settings)
    if server.tokenizer is not None:
        from atropos_cli.testing.fake_generate import add_generate_route

        add_generate_route(app, server, _cut, token_logprob)
    return app


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m atropos_cli.testing.fake_server",
        description="A scripted OpenAI-compatible inference server for tests and benchmarks.",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9001, help="0 picks a free port")
    parser.add_argument("--rule", choices=("arithmetic", "echo"), default="arithmetic")
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--error-rate", type=float, default=0.0, help="fraction of requests that fail")
    parser.add_argument("--error-status", type=int, default=500)
    parser.add_argument("--accuracy", type=float, default=0.5, help="arithmetic: P(right answer)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--model-name", default="fake-model")
    parser.add_argument("--ignore-n", action="store_true", help="always answer one choice")
    parser.add_argument("--no-tokens", action="store_true", help="never return token ids or logprobs")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Serve until SIGTERM or Ctrl-C; print the base URL once it accepts connections."""
    args = _parse_args(argv)
    server = FakeInferenceServer(
        args.rule,
        latency_s=args.latency,
        error_rate=args.error_rate,
        error_status=args.error_status,
        ignore_n=args.ignore_n,
        return_tokens=not args.no_tokens,
        accuracy=args.accuracy,
        seed=args.seed,
        model_name=args.model_name,
        host=args.host,
        port=args.port,
    )
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    try:
        server.start()
    except AtroposError as exc:  # a taken port: the lines and exit code of every server's
        print(f"error: {exc.text}", file=sys.stderr)
        print(f"hint: {exc.hint}", file=sys.stderr)
        sys.exit(exc.exit_code)
    print(server.base_url, flush=True)
    try:
        while not stopping.wait(0.5):
            pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
