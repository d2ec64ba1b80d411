"""atroposlib.envs.server_handling.vllm_server: `VLLMServer`, which also speaks vLLM's native `POST /generate`
(token ids in; token ids and logprobs out) for ManagedServer and for teacher prompt logprobs."""

from __future__ import annotations

from typing import Any

from atropos_cli.compat.atroposlib.envs.server_handling.server_baseline import APIServer
from atropos_cli.errors import BadResponseError, InferenceError, ServerUnreachableError

__all__ = ["VLLMServer"]


def _generate_url(base_url: str) -> str:
    return base_url.rstrip("/").removesuffix("/v1") + "/generate"


def _topk(entry: Any) -> tuple[list[int], list[float]]:
    """One position's top-k as parallel lists, from `{id: lp}` or `[{id: lp}, ...]` (None -> empty)."""
    pairs = entry.items() if isinstance(entry, dict) else [kv for d in entry or [] for kv in d.items()]
    ids, lps = [], []
    for key, value in pairs:
        ids.append(int(key))
        lps.append(float(value))
    return ids, lps


class VLLMServer(APIServer):
    """A vLLM server: the OpenAI routes for text, `/generate` for token-level data."""

    async def _generate(self, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        url = _generate_url(self.config.base_url)
        headers = {"Authorization": f"Bearer {self.config.api_key}"} if self.config.api_key else {}
        try:
            async with httpx.AsyncClient(timeout=self.config.timeout) as client:
                response = await client.post(url, json=body, headers=headers)
        except httpx.TransportError as exc:
            raise ServerUnreachableError(
                f"cannot reach {url} ({type(exc).__name__})",
                hint="start the vLLM server, or run offline with --openai.server_type local",
            ) from None
        if response.status_code >= 400:
            raise InferenceError(f"{url} answered HTTP {response.status_code}: {response.text[:200]}")
        try:
            return response.json()
        except ValueError:
            raise BadResponseError(f"{url} did not answer JSON: {response.text[:200]!r}") from None

    @staticmethod
    def _request(kwargs: dict[str, Any]) -> tuple[list[int], dict[str, Any]]:
        kwargs = {k: v for k, v in kwargs.items() if k not in ("model", "skip_reasoning", "split")}
        prompt = kwargs.pop("input_ids", None)
        text = kwargs.pop("prompt", None)
        if prompt is None:
            raise InferenceError("VLLMServer needs input_ids (token ids) for /generate")
        for alias in ("max_new_tokens", "max_completion_tokens"):
            if alias in kwargs:
                kwargs["max_tokens"] = kwargs.pop(alias)
        del text
        return list(prompt), kwargs

    async def tokens_and_logprobs_completion(self, **kwargs: Any) -> tuple[list, list, list, list]:
        prompt, kwargs = self._request(kwargs)
        body = {"prompt": {"prompt_token_ids": prompt}, "logprobs": 0, **kwargs}
        data = await self._generate(body)
        outputs, logprobs = [], []
        for per_token in data.get("logprobs") or []:
            pairs = [next(iter(position[0].items())) for position in per_token]
            outputs.append([int(k) for k, _ in pairs])
            logprobs.append([float(v) for _, v in pairs])
        return prompt, outputs, logprobs, list(data.get("finish_reasons") or ["stop"] * len(outputs))

    async def get_logprobs(self, **kwargs: Any) -> dict[str, Any]:
        """{prompt_tokens, prompt_topk_token_ids, prompt_topk_logprobs}: the top-k logprobs of every prompt
        position (`top_k` / `top_logprobs`, default 1); position 0 has none."""
        top_k = max(1, int(kwargs.pop("top_k", kwargs.pop("top_logprobs", 1))))
        prompt, kwargs = self._request(kwargs)
        body = {"prompt": {"prompt_token_ids": prompt}, **kwargs, "prompt_logprobs": top_k}
        body.update(n=1, temperature=0.0, top_p=1.0)
        body.setdefault("max_tokens", 1)
        data = await self._generate(body)
        entries = data.get("prompt_logprobs")
        if entries is None:
            raise BadResponseError("vLLM /generate response missing 'prompt_logprobs'")
        if entries and isinstance(entries[0], list):
            entries = entries[0]
        pairs = [_topk(entry) for entry in entries]
        return {
            "prompt_tokens": prompt,
            "prompt_topk_token_ids": [ids for ids, _ in pairs],
            "prompt_topk_logprobs": [lps for _, lps in pairs],
        }
