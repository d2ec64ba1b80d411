"""Sampling clients: each sampler weights (a `tinker://.../sampler_weights/...` path, or the base model) served
by our local engine (`inference.local.LocalBackend`: the CUDA static engine on a GPU, the batched sampler
elsewhere), with one logprob per sampled token.

Weights saved for sampling reach the sampler in memory (the slot's merged tensors); the copy on disk is only
what a restart reads back. The few most recently used samplers are kept.
"""

from __future__ import annotations

import asyncio
import random
from collections import OrderedDict
from typing import Any

import numpy as np

from atropos_cli.tinker.errors import invalid, unsupported
from atropos_cli.tinker.protowire import WireSequence, write_sample_response
from atropos_cli.tinker.wire import Sample

MAX_SAMPLERS = 4


class Samplers:
    def __init__(self, tokenizer: Any, device: str, max_len: int, seed: int = 0) -> None:
        self.tokenizer, self.device, self.max_len = tokenizer, device, max_len
        self._seeds = random.Random(seed)  # a request without a seed gets the next one: a run repeats as sent
        self._backends: OrderedDict[str, Any] = OrderedDict()

    def has(self, key: str) -> bool:
        return key in self._backends

    async def add(self, key: str, model: Any) -> None:
        """Serve `model` (weights already in memory) as sampler `key`."""
        from atropos_cli.config import ServerConfig
        from atropos_cli.inference.local import LocalBackend

        config = ServerConfig(model_name=key, server_type="local", device=self.device)
        old = self._backends.pop(key, None)
        self._backends[key] = LocalBackend(config, model=(model, self.tokenizer))
        if old is not None:
            await old.aclose()
        while len(self._backends) > MAX_SAMPLERS:
            _, evicted = self._backends.popitem(last=False)
            await evicted.aclose()

    async def refresh(self, key: str, weights: dict[str, Any]) -> None:
        """Copy `weights` into sampler `key`'s model in place, between two of its batches (the tensors keep
        their storage, so a CUDA engine's captured graphs read the new values)."""
        backend = self._backends[key]
        self._backends.move_to_end(key)
        await backend.batcher.run_in_worker(backend.model.load_state_dict, weights, True)

    async def sample(self, key: str, request: Sample) -> bytes:
        """The `SampleResponse` (protobuf) of one request on sampler `key`."""
        from atropos_cli.inference.base import SamplingParams

        backend = self._backends[key]
        self._backends.move_to_end(key)
        prompt = request.prompt.tokens()
        params = request.sampling_params
        if params.top_k not in (-1, 0):
            raise unsupported("top_k sampling is not supported", hint="leave top_k at -1 (use top_p)")
        if request.topk_sample_logprobs or request.target_prompt_logprobs is not None or request.prompt_alt_tokens_k:
            raise unsupported(
                "top-k, target and alternative-token logprobs are not supported",
                hint="ask for prompt_logprobs and the sampled tokens' logprobs",
            )
        if not prompt:
            raise invalid("the prompt has no tokens")
        vocab = len(self.tokenizer)
        if min(prompt) < 0 or max(prompt) >= vocab:
            raise invalid(f"a prompt token id is outside the vocabulary (0..{vocab - 1})")
        if len(prompt) >= self.max_len:
            raise invalid(f"the prompt has {len(prompt)} tokens; the model's context is {self.max_len}")
        stop: list[str | int] = [params.stop] if isinstance(params.stop, str) else list(params.stop or [])
        max_tokens = params.max_tokens if params.max_tokens else self.max_len - len(prompt)
        prompt_logprobs = None
        if request.prompt_logprobs or request.topk_prompt_logprobs:
            prompt_logprobs = await backend.batcher.run_in_worker(_prompt_logprobs, backend, prompt)
        if max_tokens == 0:
            sequences = [WireSequence([], [], "length") for _ in range(request.num_samples)]
        else:
            generation = await backend.complete(
                prompt,
                SamplingParams(
                    n=request.num_samples,
                    temperature=params.temperature,
                    top_p=params.top_p,
                    max_tokens=min(max_tokens, self.max_len - len(prompt)),
                    stop=stop or None,
                    seed=params.seed if params.seed is not None else self._seeds.getrandbits(62),
                ),
            )
            sequences = [
                WireSequence(
                    list(c.token_ids or []),
                    list(c.logprobs or []),
                    "stop" if c.finish_reason == "stop" else "length",
                )
                for c in generation.choices
            ]
        return write_sample_response(sequences, prompt_logprobs)

    async def aclose(self) -> None:
        await asyncio.gather(*(b.aclose() for b in self._backends.values()))
        self._backends.clear()


def _prompt_logprobs(backend: Any, prompt: list[int]) -> list[float]:
    """Each prompt token's log-prob given the tokens before it (the first has none: NaN)."""
    import torch

    model = backend.model
    with torch.no_grad():
        ids = torch.tensor([prompt], device=model.device)
        logits = model(input_ids=ids).logits[0, :-1].float()
        logp = torch.log_softmax(logits, dim=-1).gather(-1, ids[0, 1:, None])[:, 0]
    return [float("nan"), *np.asarray(logp.cpu()).tolist()]
