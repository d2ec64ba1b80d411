"""The batched sampling loop of the local backend: rows of token ids in, sampled completions out.

One call = one batch: prompts are left-padded into one tensor (position ids count real tokens only, so a
padded row sees exactly what it would see alone), prefilled once, then decoded one token per step with the
model's KV cache until every row has stopped. Each row has its own temperature, top-p, stop strings, token
budget and seeded `torch.Generator`, so a seeded request gives the same answer whatever it is batched with.

Per-token logprobs are "raw" (vLLM's default `logprobs_mode`): log-softmax of the unscaled logits at the
sampled token, i.e. what a forward pass of the same model over prompt + completion gives.
Called from the backend's worker thread; imports torch at call time only.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RowRequest", "RowResult", "sample_rows", "eos_ids", "stop_cut", "cache_kwarg", "GREEDY_BELOW", "MIN_TOP_P"]

# What fp32 sampling can do: logits / T overflows to inf (softmax NaN) for T near 1e-38, and a top-p that rounds
# to 0 in fp32 would drop every token. Below GREEDY_BELOW a temperature means greedy (vLLM's rule); a top-p
# below MIN_TOP_P keeps the most likely token only, as MIN_TOP_P does.
GREEDY_BELOW = 1e-5
MIN_TOP_P = 1e-5


@dataclass
class RowRequest:
    prompt_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    stop: list[str] = field(default_factory=list)
    seed: int = 0
    top_logprobs: int = 0
    vision: Any = None  # the row's images (`atropos_cli.vision.VisionInputs`), None: a text row

    def __post_init__(self) -> None:
        if not self.temperature >= GREEDY_BELOW:  # NaN too
            self.temperature = 0.0
        self.top_p = min(max(self.top_p, MIN_TOP_P), 1.0) if self.top_p == self.top_p else 1.0


@dataclass
class RowResult:
    token_ids: list[int]
    logprobs: list[float]
    text: str = ""
    finish_reason: str = "length"
    top_logprobs: list[list[tuple[int, float]]] | None = None
    versions: list[int] | None = None  # the weight version that produced each token (an engine with swap points)


def eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    configured = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(configured, int):
        ids.add(configured)
    elif isinstance(configured, list):
        ids.update(configured)
    return ids


def cache_kwarg(model: Any) -> str:
    # transformers 5 renamed `past_key_values` to `cache`; support both spellings.
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def _new_cache(model: Any) -> Any:
    from transformers import DynamicCache

    try:
        return DynamicCache(config=model.config)
    except TypeError:  # older transformers: no config argument
        return DynamicCache()


def _sample(logits: Any, rows: list[RowRequest], generators: list[Any]) -> Any:
    """Next token per row: argmax at temperature 0, else top-p sampling from softmax(logits / T)."""
    import torch

    chosen = logits.argmax(dim=-1)
    hot = [i for i, r in enumerate(rows) if r.temperature > 0]
    if not hot:
        return chosen
    temps = torch.tensor([rows[i].temperature for i in hot], dtype=logits.dtype, device=logits.device)
    probs = torch.softmax(logits[hot] / temps[:, None], dim=-1)
    top_p = torch.tensor([rows[i].top_p for i in hot], dtype=logits.dtype, device=logits.device)
    if bool((top_p < 1).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        # drop a token when the mass before it already reaches top_p (the first token always stays)
        drop = sorted_probs.cumsum(dim=-1) - sorted_probs >= top_p[:, None]
        drop[:, 0] = False
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_probs)
    for j, i in enumerate(hot):
        chosen[i] = torch.multinomial(probs[j], 1, generator=generators[i])[0]
    return chosen


def _prefill_inputs(rows: list[RowRequest], pad_id: int, device: Any) -> tuple[Any, Any, Any]:
    import torch

    width = max(len(r.prompt_ids) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row.prompt_ids) :] = torch.tensor(row.prompt_ids, dtype=torch.long)
        mask[i, width - len(row.prompt_ids) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids.to(device), mask.to(device), positions.to(device)


def stop_cut(tokenizer: Any, row: RowRequest, tokens: list[int], new_from: int = 0) -> tuple[int, str] | None:
    """Where a stop string first completes among `tokens[new_from:]`: (tokens kept, text before the stop), as
    a check after every token would give; None when none does. One decode when no stop string appears."""
    if not any(s and s in tokenizer.decode(tokens, skip_special_tokens=True) for s in row.stop):
        return None
    for j in range(max(new_from, 0), len(tokens)):
        text = tokenizer.decode(tokens[: j + 1], skip_special_tokens=True)
        hits = [text.find(s) for s in row.stop if s and s in text]
        if hits:
            return j + 1, text[: min(hits)]
    return None


def _stopped_by_string(tokenizer: Any, row: RowRequest, result: RowResult) -> bool:
    text = tokenizer.decode(result.token_ids, skip_special_tokens=True)
    hits = [text.find(s) for s in row.stop if s and s in text]
    if hits:
        result.text = text[: min(hits)]
        return True
    return False


def _image_markers(model: Any) -> list[int]:
    """A vision-language model's image marker tokens (vision start/end, image and video pads): never sampled, as
    a pad the model wrote would be an image placeholder without pixels in any later forward of the row."""
    config = model.config
    if getattr(config, "vision_config", None) is None:
        return []
    names = ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id")
    vocab = config.get_text_config().vocab_size
    return [int(i) for i in (getattr(config, n, None) for n in names) if i is not None and i < vocab]


def sample_rows(model: Any, tokenizer: Any, rows: list[RowRequest]) -> list[RowResult]:
    """Sample a completion for every row in one batched decode; returns results in row order.

    A VL model's image rows (`RowRequest.vision`) batch with each other and with text rows, of any prompts: the
    prefill takes the rows' images concatenated in row order and the mrope positions of the model's own rope index
    over the padded batch (its attention mask skips the pads), and every later token is one position past the
    row's last on all three axes."""
    import torch

    device = model.device
    eos = eos_ids(model, tokenizer)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos), 0)
    generators = [torch.Generator(device=device).manual_seed(r.seed) for r in rows]
    results = [RowResult([], [], top_logprobs=[] if r.top_logprobs else None) for r in rows]
    active = [True] * len(rows)
    top_k = max(r.top_logprobs for r in rows)
    ids, mask, positions = _prefill_inputs(rows, pad_id, device)
    cache, cache_kw = _new_cache(model), cache_kwarg(model)
    extra = {cache_kw: cache}
    if "logits_to_keep" in inspect.signature(model.forward).parameters:
        extra["logits_to_keep"] = 1  # the prefill only needs the last position's logits
    images: dict[str, Any] = {}
    if any(r.vision is not None for r in rows):
        from atropos_cli.vision import VisionInputs
        from atropos_cli.vision import positions as mrope_positions

        batch = VisionInputs.batched([r.vision for r in rows])
        assert batch is not None
        batch = VisionInputs(batch.pixel_values.to(device, model.dtype), batch.image_grid_thw.to(device))
        images = {"pixel_values": batch.pixel_values, "image_grid_thw": batch.image_grid_thw}
        positions = mrope_positions(model, ids, batch, mask)
    banned = _image_markers(model)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, **extra, **images)
        for step in range(max(r.max_new_tokens for r in rows)):
            logits = out.logits[:, -1, :].float()
            logprobs = torch.log_softmax(logits, dim=-1)
            if banned:  # sampled never, their logprobs stay the model's
                logits = logits.index_fill(1, torch.tensor(banned, device=logits.device), float("-inf"))
            tokens = _sample(logits, rows, generators)
            picked = logprobs.gather(1, tokens[:, None])[:, 0].tolist()
            top = logprobs.topk(top_k, dim=-1) if top_k else None
            token_list = tokens.tolist()
            for i, row in enumerate(rows):
                if not active[i]:
                    continue
                result = results[i]
                result.token_ids.append(token_list[i])
                result.logprobs.append(picked[i])
                if result.top_logprobs is not None and top is not None:
                    k = row.top_logprobs
                    pairs = zip(top.indices[i, :k].tolist(), top.values[i, :k].tolist(), strict=True)
                    result.top_logprobs.append(list(pairs))
                if token_list[i] in eos or (row.stop and _stopped_by_string(tokenizer, row, result)):
                    result.finish_reason, active[i] = "stop", False
                elif step + 1 >= row.max_new_tokens:
                    active[i] = False
            if not any(active):
                break
            mask = torch.cat([mask, mask.new_ones((len(rows), 1))], dim=1)
            positions = positions[..., -1:] + 1
            out = model(
                input_ids=tokens[:, None], attention_mask=mask, position_ids=positions, use_cache=True, **extra,
            )  # fmt: skip
    for row, result in zip(rows, results, strict=True):
        if not (row.stop and result.finish_reason == "stop" and result.token_ids[-1] not in eos):
            body = result.token_ids[:-1] if result.token_ids and result.token_ids[-1] in eos else result.token_ids
            result.text = tokenizer.decode(body, skip_special_tokens=True)
    return results
