"""How long to wait before retrying a request: one policy for the inference router and the trajectory-API client.

A server that sends `Retry-After` knows best, so its value is used (capped at `RETRY_AFTER_MAX_S`, with up to
10% added so many clients told the same number do not come back in lockstep). Otherwise the wait grows
exponentially from `base_s` up to `max_s`, with jitter: a random point in the upper half of the step.
Callers own their loops (the router also picks another server; the API client also keeps a deadline);
they ask this module only for the numbers.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["Backoff", "RETRY_AFTER_MAX_S", "parse_retry_after"]

RETRY_AFTER_MAX_S = 60.0


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header; None when absent or an HTTP date (then the caller's backoff applies)."""
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter; `delay(attempt)` for attempt 0, 1, 2, ..."""

    base_s: float = 0.5
    max_s: float = 10.0

    def delay(self, attempt: int, retry_after: float | None = None) -> float:
        if retry_after is not None:
            return min(retry_after, RETRY_AFTER_MAX_S) * (1 + 0.1 * random.random())
        ceiling = min(self.max_s, self.base_s * 2**attempt)
        return ceiling * (0.5 + random.random() / 2)
