"""How the clients we ship read a reply from a server they do not control: a total deadline for the whole
call (httpx's timeouts are per read: a server that sends one byte every few seconds never trips them; the call
ends within the deadline plus one read's timeout, at most 30 s), a cap on the reply's size (checked as it
streams, never after it is all in memory), and no redirects followed.

`bounded_get(url, deadline_s, max_bytes, headers)` returns the response (its status and headers) and its body;
it raises `httpx.HTTPError` for transport errors, `httpx.ReadTimeout` past the deadline, and `ReplyTooLarge`
past the cap. `bounded_send(client, method, url, deadline_s, max_bytes, ...)` is the same for an
`httpx.AsyncClient` (the trajectory API's client), and `read_capped(stream, max_bytes)` the capped read of an
aiohttp body (the model client, whose whole call runs under `asyncio.timeout`). httpx is imported inside:
`atropos --help` never loads it.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ReplyTooLarge", "bounded_get", "bounded_send", "read_capped"]


class ReplyTooLarge(Exception):
    """A reply over the client's size cap (read no further)."""


def bounded_get(
    url: str, deadline_s: float, max_bytes: int, headers: dict[str, str] | None = None
) -> tuple[Any, bytes]:
    import httpx

    deadline = time.monotonic() + deadline_s
    chunks: list[bytes] = []
    size = 0
    timeout = httpx.Timeout(min(deadline_s, 30.0))
    with (
        httpx.Client(timeout=timeout, follow_redirects=False) as client,
        client.stream("GET", url, headers=headers or {}) as response,
    ):
        length = response.headers.get("content-length", "")
        if length.isdigit() and int(length) > max_bytes:
            raise ReplyTooLarge(f"the reply is {int(length)} bytes, more than the {max_bytes} this client reads")
        for chunk in response.iter_bytes():  # decoded: a gzip bomb counts at its inflated size
            size += len(chunk)
            if size > max_bytes:
                raise ReplyTooLarge(f"the reply is over the {max_bytes} bytes this client reads")
            if time.monotonic() > deadline:
                raise httpx.ReadTimeout(f"the reply took longer than {deadline_s:g}s in all")
            chunks.append(chunk)
    return response, b"".join(chunks)


async def bounded_send(client: Any, method: str, url: str, deadline_s: float, max_bytes: int, **kwargs: Any) -> Any:
    """`client.request(method, url, **kwargs)` on an `httpx.AsyncClient`, the whole call (connect, headers,
    every byte of the body) within `deadline_s` and the body within `max_bytes` (decoded); the answer is an
    `httpx.Response` with its body read. Raises `httpx.ReadTimeout` past the deadline, `ReplyTooLarge` past the
    cap. Redirects are followed only if the client was built to (ours never are)."""
    import asyncio

    import httpx

    async def read() -> Any:
        async with client.stream(method, url, **kwargs) as response:
            length = response.headers.get("content-length", "")
            if length.isdigit() and int(length) > max_bytes and response.headers.get("content-encoding") is None:
                raise ReplyTooLarge(f"the reply is {int(length)} bytes, more than the {max_bytes} this client reads")
            chunks, size = [], 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > max_bytes:
                    raise ReplyTooLarge(f"the reply is over the {max_bytes} bytes this client reads")
                chunks.append(chunk)
        headers = [(k, v) for k, v in response.headers.multi_items() if k.lower() != "content-encoding"]
        return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks), request=response.request)

    try:
        return await asyncio.wait_for(read(), deadline_s)
    except TimeoutError:
        raise httpx.ReadTimeout(f"the reply took longer than {deadline_s:g}s in all") from None


async def read_capped(stream: Any, max_bytes: int) -> bytes:
    """The rest of an aiohttp response body (`response.content`), refused past `max_bytes` as it streams (the
    OpenAI-compatible model client; its caller holds the total deadline)."""
    chunks, size = [], 0
    async for chunk in stream.iter_chunked(1 << 16):
        size += len(chunk)
        if size > max_bytes:
            raise ReplyTooLarge(f"the reply is over the {max_bytes} bytes this client reads")
        chunks.append(chunk)
    return b"".join(chunks)
