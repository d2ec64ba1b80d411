"""How the clients we ship read a reply from a server they do not control: a total deadline for the whole
call (httpx's timeouts are per read: a server that sends one byte every few seconds never trips them; the call
ends within the deadline plus one read's timeout, at most 30 s), a cap
on the reply's size (checked as it streams, never after it is all in memory), and no redirects followed.

`bounded_get(url, deadline_s, max_bytes, headers)` returns the response (its status and headers) and its body;
it raises `httpx.HTTPError` for transport errors, `httpx.ReadTimeout` past the deadline, and `ReplyTooLarge`
past the cap. httpx is imported inside: `atropos --help` never loads it.
"""

from __future__ import annotations

import time
from typing import Any

__all__ = ["ReplyTooLarge", "bounded_get"]


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
    with httpx.Client(timeout=timeout, follow_redirects=False) as client:
        with client.stream("GET", url, headers=headers or {}) as response:
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
