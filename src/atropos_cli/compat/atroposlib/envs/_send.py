"""atroposlib's `handle_send_to_api` internals: the per-group checks and the POST to the trajectory API
(`/scored_data` or `/scored_data_list`, `env_id` added, gzip above 1 KiB, 3 attempts on 5xx)."""

from __future__ import annotations

import gzip
import json
import logging
from typing import Any

from atropos_cli.errors import InferenceError

logger = logging.getLogger("atropos_cli.compat.atroposlib")

__all__ = ["check_group", "post_groups"]

DEFAULTED = ("ref_logprobs", "overrides", "group_overrides", "distill_token_ids", "distill_logprobs")


def check_group(env: Any, group: dict, abort_on_any_max_length_exceeded: bool) -> str | None:
    """atroposlib's checks, in its order: why the group is skipped, or None when it passes (its defaults and,
    with include_messages, its messages are then filled in)."""
    expected = (group.get("group_overrides") or {}).get("group_size", env.config.group_size)
    if None in group or len(group.get("tokens", [])) != expected:
        logger.warning("group skipped: %d sequences, expected %d", len(group.get("tokens", [])), expected)
        return f"group has {len(group.get('tokens', []))} rollouts, expected {expected}"
    if env.config.ensure_scores_are_not_same and len(set(group["scores"])) == 1:
        logger.warning("group skipped: every score is the same")
        return "identical scores"
    for key in DEFAULTED:
        group.setdefault(key, None)
    for mask in group["masks"]:
        env.completion_lengths.append(sum(m != -100 for m in mask))
    too_long = env.max_token_len > 0 and any(len(t) >= env.max_token_len for t in group["tokens"])
    if too_long and abort_on_any_max_length_exceeded:
        logger.warning("group skipped: a sequence reaches max_token_len %d", env.max_token_len)
        return "too long"
    if env.config.include_messages and group.get("messages") is None and env.tokenizer is not None:
        group["messages"] = [[{"role": "user", "content": env.tokenizer.decode(t)}] for t in group["tokens"]]
    return None


async def post_groups(env: Any, payload: Any) -> None:
    import httpx

    groups = payload if isinstance(payload, list) else [payload]
    for group in groups:
        group["env_id"] = getattr(env, "env_id", None)
    path = "/scored_data_list" if isinstance(payload, list) else "/scored_data"
    url = env.config.rollout_server_url.rstrip("/") + path
    body = json.dumps(payload).encode()
    headers = {"Content-Type": "application/json"}
    if len(body) >= 1024 and len(packed := gzip.compress(body)) < len(body):
        body, headers["Content-Encoding"] = packed, "gzip"
    async with httpx.AsyncClient(timeout=60) as client:
        for _ in range(3):
            try:
                response = await client.post(url, content=body, headers=headers)
            except httpx.TransportError as exc:
                logger.warning("posting to %s failed: %s", url, exc)
                continue
            if response.status_code < 500:
                if response.status_code >= 400:
                    logger.error("%s answered HTTP %d; not retrying", url, response.status_code)
                return
    raise InferenceError(f"could not post scored data to {url} after 3 attempts", hint="is the trajectory API up?")
