"""Driver of the adapters' conformance battery, run with an adapter's own venv python (the framework is
installed there, not in the test venv): `PYTHON tests/adapter_battery.py SPEC OUT.json [--env.x V ...]`.

It loads SPEC as `atropos process` does (layered config, the shipped model on the local backend), records every
request the env sends to the inference router (prompt token ids or chat, and the backend's completion token
ids), collects one group of item 0 through the runner's own `collect_group` (seeded like `process`), and
writes {"groups", "calls", "failures"} as JSON for tests/test_adapters_conformance.py to check.
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

VOLATILE = {"created_at", "duration_s", "group_id"}  # meta fields that differ between two identical runs


async def main(spec: str, out: str, dotted: list[str]) -> None:
    from atropos_cli.env.loading import load_env
    from atropos_cli.runs.rollout import collect_group

    loaded = load_env(spec, dotted, None, mode="process")
    router = loaded.env.server
    calls: list[dict[str, Any]] = []

    def recording(method: Any, kind: str) -> Any:
        async def call(*args: Any, **kwargs: Any) -> Any:
            generation = await method(*args, **kwargs)
            prompt = kwargs.get("prompt", kwargs.get("messages", args[0] if args else None))
            for choice in generation.choices:
                calls.append(
                    {
                        "kind": kind,
                        "prompt": prompt if kind == "completion" else None,
                        "prompt_token_ids": generation.prompt_token_ids,
                        "completion_token_ids": choice.token_ids,
                    }
                )
            return generation

        return call

    router.completion = recording(router.completion, "completion")
    router.chat_completion = recording(router.chat_completion, "chat")
    try:
        await loaded.env.setup()
        item = await loaded.env.get_next_item()
        outcome = await collect_group(loaded.env, item, index=0)
    finally:
        await router.aclose()
    result = {
        "groups": [
            g.model_dump(mode="json", exclude={"meta": {"created_at", "duration_s", "group_id"}})
            for g in outcome.groups
        ],
        "calls": calls,
        "failures": [f.model_dump(mode="json") for f in outcome.failures],
    }
    for group in result["groups"]:
        for rollout in (group.get("meta") or {}).get("rollouts") or []:
            rollout.pop("latency_s", None)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3:]))
