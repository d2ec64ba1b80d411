"""atroposlib.utils.io: read an aiohttp/httpx response as JSON, with the body in the error when it is not."""

from __future__ import annotations

import json
from typing import Any

__all__ = ["parse_http_response"]


async def parse_http_response(resp: Any, logger: Any = None) -> Any:
    text = await resp.text() if callable(getattr(resp, "text", None)) else resp.text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"expected JSON from {getattr(resp, 'url', 'server')}, got: {text[:200]!r}") from exc
