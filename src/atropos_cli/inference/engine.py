"""The local backend's static engine (the CUDA default): a fixed-shape decode step captured as a CUDA graph.

Where it sits: `LocalBackend._run_jobs` hands it the batch's `RowRequest`s (sampler.py) and gets `RowResult`s
back, the same contract as `sample_rows` (token ids, raw logprobs, finish reasons, stop strings, per-row
temperature / top-p / seed). `sample_rows` stays the CPU path and the path for top-logprobs requests.

How:
- `slots` rows decode together over a ring KV cache ([slots, kv heads, length, dim] per layer, `RingCache`):
  every step writes each slot's new key/value at one shared cursor, and a per-slot validity mask tells attention
  which entries are the slot's. A row needs `prompt + max_new <= length` entries, wherever they start.
- Continuous batching: rows wait in a queue; a free slot takes the next one by a prefill (an ordinary forward
  over the new prompts, left-padded, whose keys/values are copied into the ring just before the cursor).
  Finished rows free their slot at the next host sync.
- The decode step (model forward for one token a slot, raw log-softmax, Gumbel-max sampling at each row's
  temperature and top-p, EOS / length checks, bookkeeping) runs on the GPU with no host sync; on CUDA it is
  captured once per (slots, length) as a CUDA graph and replayed. The host reads the tokens every
  `sync_every` steps (one copy), checks stop strings and refills slots.
- Sampling noise is a counter-based hash of (row seed, token index, vocab id), so it needs no generator state:
  a seeded row gets the same noise whatever slot or batch it lands in. Its tokens are bitwise the same across
  identical calls; alone vs batched they are the same unless a near-tie in the logits flips (batched matrix
  products can round differently in the last bit).
- GQA decode attention: a slot's query heads that share a KV head are folded into that head's query rows,
  so SDPA reads each cached key once instead of once per query head (`decode_attention`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atropos_cli.inference.sampler import RowRequest, RowResult, cache_kwarg, eos_ids, stop_cut

__all__ = ["StaticEngine", "DECODE_ATTENTION", "decode_attention", "ring_length"]

DECODE_ATTENTION = "atropos_decode"
PREFILL_TOKENS = 32768  # padded prompt tokens per prefill forward
_MASK32 = 0xFFFFFFFF


def ring_length(rows: list[RowRequest], multiple: int = 128) -> int:
    """KV entries a slot needs for these rows, rounded up (few distinct shapes, so few graph captures)."""
    need = max(len(r.prompt_ids) + r.max_new_tokens for r in rows)
    return -(-need // multiple) * multiple


def decode_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling=None, **kw: Any):
    """SDPA for one query token a row with GQA folded: query [B, Hq, 1, D] -> [B, Hkv, Hq/Hkv, D] against
    key/value [B, Hkv, L, D] and a [B, 1, 1, L] mask. Anything else goes to transformers' SDPA function."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, hq, q_len, d = query.shape
    hk = key.shape[1]
    if q_len != 1 or hq == hk or attention_mask is None or attention_mask.dim() != 4:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, **kw)
    q = query.reshape(b, hk, hq // hk, d)
    out = torch.nn.functional.scaled_dot_product_attention(q, key, value, attn_mask=attention_mask, scale=scaling)
    return out.reshape(b, hq, 1, d).transpose(1, 2), None


def _use_decode_attention(model: Any) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(DECODE_ATTENTION, decode_attention)
    AttentionMaskInterface.register(DECODE_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(DECODE_ATTENTION)


class RingCache:
    """A static KV cache that transformers' attention layers write through `update`: [slots, kv heads, length,
    dim] per layer, one write position (`cursor`, a device tensor) for every slot."""

    is_compileable = True

    def __init__(self, layers: int, slots: int, length: int, heads: int, dim: int, dtype: Any, device: Any):
        import torch

        shape = (slots, heads, length, dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(layers)]
        self.cursor = torch.zeros(1, dtype=torch.long, device=device)
        self.length = length

    def update(self, key: Any, value: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        self.keys[layer_idx].index_copy_(2, self.cursor, key)
        self.values[layer_idx].index_copy_(2, self.cursor, value)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


class _Capture:
    """A cache for a prefill: keeps each layer's keys/values of the prompt (for copying into the ring)."""

    is_compileable = False

    def __init__(self) -> None:
        self.kv: dict[int, tuple[Any, Any]] = {}

    def update(self, key: Any, value: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        self.kv[layer_idx] = (key, value)
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def _mix(x: Any) -> Any:
    """A 32-bit integer hash round on int64 tensors (constants < 2^31: no int64 overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x68E31DA5) & _MASK32
    return x ^ (x >> 16)


def sample_step(logits: Any, inv_temp: Any, greedy: Any, top_p: Any, seeds: Any, counters: Any, use_top_p: bool):
    """(token, raw logprob) per row from fp32 logits [S, V]: argmax where `greedy`, else Gumbel-max over
    logits / T restricted to the top-p nucleus when `use_top_p`; noise = hash(seed, counter, vocab id)."""
    import torch

    vocab = torch.arange(logits.shape[-1], device=logits.device)
    lse = torch.logsumexp(logits, dim=-1)
    scaled = logits * inv_temp[:, None]
    if use_top_p:
        probs = torch.softmax(scaled, dim=-1)
        sorted_probs = probs.sort(dim=-1, descending=True).values
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above
        keep = (before < top_p[:, None]).sum(-1, keepdim=True).clamp(min=1)
        threshold = sorted_probs.gather(1, keep - 1)
        scaled = scaled.masked_fill(probs < threshold, float("-inf"))
    row = _mix((seeds ^ _mix(counters & _MASK32)) & _MASK32)
    bits = _mix((row[:, None] + vocab[None, :] * 0x1B873593) & _MASK32)
    uniform = ((bits >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
    noisy = scaled - torch.log(-torch.log(uniform))
    token = torch.where(greedy, logits.argmax(-1), noisy.argmax(-1))
    return token, logits.gather(1, token[:, None])[:, 0] - lse


@dataclass
class _Slot:
    row: int = -1  # index into the call's rows; -1 = free
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


class StaticEngine:
    """Owns the ring cache, the per-slot state tensors and (CUDA) the captured decode graph of one model."""

    def __init__(self, model: Any, tokenizer: Any, slots: int, length: int, sync_every: int = 8) -> None:
        import torch

        cfg = model.config
        self.model, self.tokenizer = model, tokenizer
        self.slots, self.length, self.sync_every = slots, length, sync_every
        self.device = model.device
        self.cache_kw = cache_kwarg(model)
        heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
        dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.cache = RingCache(cfg.num_hidden_layers, slots, length, heads, dim, model.dtype, self.device)
        self.eos = sorted(eos_ids(model, tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self.eos or [0])[0]
        if getattr(cfg, "_attn_implementation", None) in ("sdpa", None):
            _use_decode_attention(model)
        z = lambda dtype: torch.zeros(slots, dtype=dtype, device=self.device)  # noqa: E731
        long, f32, bool_ = torch.long, torch.float32, torch.bool
        self.state = {
            "token": z(long), "pos": z(long), "active": z(bool_), "generated": z(long), "max_new": z(long),
            "inv_temp": torch.ones(slots, dtype=f32, device=self.device), "greedy": z(bool_),
            "top_p": torch.ones(slots, dtype=f32, device=self.device), "seed": z(long),
        }  # fmt: skip
        self.valid = torch.zeros(slots, length, dtype=bool_, device=self.device)
        self.eos_tensor = torch.tensor(self.eos or [-1], dtype=long, device=self.device)
        self.column = torch.zeros(1, dtype=long, device=self.device)
        self.out_token = torch.zeros(slots, sync_every, dtype=long, device=self.device)
        self.out_logp = torch.zeros(slots, sync_every, dtype=f32, device=self.device)
        self.out_alive = torch.zeros(slots, sync_every, dtype=bool_, device=self.device)
        self._graphs: dict[bool, Any] = {}
        self._sampler = _compiled_sampler(self.device)

    # -- the step (no host sync) ------------------------------------------------------------------------
    def _step(self, use_top_p: bool) -> None:

        s, cache = self.state, self.cache
        self.valid.index_fill_(1, cache.cursor, True)  # every slot sees its own new entry (no empty mask row)
        mask = self.valid[:, None, None, :]
        out = self.model(
            input_ids=s["token"][:, None], position_ids=s["pos"][:, None], attention_mask=mask,
            cache_position=cache.cursor, use_cache=True, **{self.cache_kw: cache},
        )  # fmt: skip
        logits = out.logits[:, -1, :].float()
        token, logp = self._sampler(
            logits, s["inv_temp"], s["greedy"], s["top_p"], s["seed"], s["generated"], use_top_p
        )
        alive = s["active"].clone()
        self.out_token.index_copy_(1, self.column, token[:, None])
        self.out_logp.index_copy_(1, self.column, logp[:, None])
        self.out_alive.index_copy_(1, self.column, alive[:, None])
        done = (token[:, None] == self.eos_tensor[None, :]).any(-1) | (s["generated"] + 1 >= s["max_new"])
        s["active"].logical_and_(~done)
        s["token"].copy_(token)
        s["pos"].add_(1)
        s["generated"].add_(1)
        cache.cursor.add_(1).remainder_(self.length)
        self.column.add_(1)

    def _run_steps(self, use_top_p: bool) -> None:
        """`sync_every` decode steps: replays of the captured graph on CUDA, eager elsewhere."""
        import torch

        self.column.zero_()
        if self.device.type != "cuda":
            with torch.inference_mode():
                for _ in range(self.sync_every):
                    self._step(use_top_p)
            return
        graph = self._graphs.get(use_top_p)
        if graph is None:
            graph = self._graphs[use_top_p] = self._capture(use_top_p)
        graph.replay()

    def _capture(self, use_top_p: bool) -> Any:
        """Capture `sync_every` steps as one graph. Warm-up steps first (kernel choices, the compiled
        sampler); the state they advance is saved and restored, so capturing changes nothing."""
        import torch

        saved = self._snapshot()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):
                self.column.zero_()
                self._step(use_top_p)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph):
            for _ in range(self.sync_every):
                self._step(use_top_p)
        self._restore(saved)
        return graph

    def _snapshot(self) -> dict[str, Any]:
        tensors = {**self.state, "valid": self.valid, "cursor": self.cache.cursor, "column": self.column}
        return {k: v.clone() for k, v in tensors.items()}

    def _restore(self, saved: dict[str, Any]) -> None:
        for k, v in saved.items():
            {**self.state, "valid": self.valid, "cursor": self.cache.cursor, "column": self.column}[k].copy_(v)

    # -- admitting rows ---------------------------------------------------------------------------------
    def _admit(self, rows: list[RowRequest], indices: list[int], slots: list[int], results: list[RowResult]):
        """Prefill `rows` (left-padded, one forward) into free `slots`; their first tokens are sampled here."""
        import torch

        width = max(len(r.prompt_ids) for r in rows)
        n, dev = len(rows), self.device
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        real = torch.zeros((n, width), dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            real[i, width - len(r.prompt_ids) :] = True
        ids, real = ids.to(dev), real.to(dev)
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        mask = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool, device=dev)[None]
        capture = _Capture()
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask[:, None], use_cache=True, logits_to_keep=1,
            **{self.cache_kw: capture},
        )  # fmt: skip
        self._write_prompts(rows, slots, capture, width)
        self._set_rows(rows, slots, indices)
        s, slot_t = self.state, torch.tensor(slots, device=dev)
        token, logp = self._sampler(
            out.logits[:, -1, :].float(), s["inv_temp"][slot_t], s["greedy"][slot_t], s["top_p"][slot_t],
            s["seed"][slot_t], s["generated"][slot_t] - 1, bool((s["top_p"][slot_t] < 1).any()),
        )  # fmt: skip
        return token, logp

    def _write_prompts(self, rows: list[RowRequest], slots: list[int], capture: _Capture, width: int) -> None:
        """Copy each prompt's keys/values into its slot at the ring entries just before the cursor."""
        import torch

        dev, cursor = self.device, int(self.cache.cursor)
        lengths = torch.tensor([len(r.prompt_ids) for r in rows])
        row_of = torch.arange(len(rows)).repeat_interleave(lengths)
        offset = torch.cat([torch.arange(n) for n in lengths.tolist()])
        col = (width - lengths)[row_of] + offset  # where the token sits in the padded prefill
        ring = (cursor - lengths[row_of] + offset) % self.length
        slot = torch.tensor(slots)[row_of]
        row_of, col, ring, slot = (t.to(dev) for t in (row_of, col, ring, slot))
        for layer, (k, v) in capture.kv.items():
            self.cache.keys[layer][slot, :, ring, :] = k[row_of, :, col, :]
            self.cache.values[layer][slot, :, ring, :] = v[row_of, :, col, :]
        slot_t = torch.tensor(slots, device=dev)
        self.valid[slot_t] = False
        self.valid[slot, ring] = True

    def _set_rows(self, rows: list[RowRequest], slots: list[int], indices: list[int]) -> None:
        import torch

        s, dev = self.state, self.device
        slot_t = torch.tensor(slots, device=dev)
        values = {
            "pos": [len(r.prompt_ids) for r in rows],
            "max_new": [r.max_new_tokens for r in rows],
            "inv_temp": [1.0 / r.temperature if r.temperature > 0 else 1.0 for r in rows],
            "greedy": [r.temperature <= 0 for r in rows],
            "top_p": [r.top_p for r in rows],
            "seed": [(r.seed ^ (r.seed >> 32)) & _MASK32 for r in rows],
            "generated": [1] * len(rows),  # the prefill samples token 0 (counter 0); decode steps count on
            "active": [True] * len(rows),
        }
        for name, vals in values.items():
            s[name][slot_t] = torch.tensor(vals, dtype=s[name].dtype, device=dev)

    # -- the call -----------------------------------------------------------------------------------------
    def run(self, rows: list[RowRequest]) -> list[RowResult]:
        """Sample every row (queued when there are more rows than slots); results in row order."""
        import contextlib

        import torch

        # the model's GPU is made current for this call: it may run on a worker thread, whose current device is
        # cuda:0 whatever the process chose (a many-GPU run's rank on cuda:2 would capture its graphs on cuda:0)
        on_device = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
        with on_device:
            return self._run(rows)

    def _run(self, rows: list[RowRequest]) -> list[RowResult]:
        import torch

        results = [RowResult([], []) for _ in rows]
        slots = [_Slot() for _ in range(self.slots)]
        queue = list(range(len(rows)))
        use_top_p = any(r.top_p < 1 and r.temperature > 0 for r in rows)
        self.state["active"].zero_()
        while queue or any(sl.row >= 0 for sl in slots):
            self._fill(rows, queue, slots, results)
            if not any(sl.row >= 0 for sl in slots):
                continue
            with torch.inference_mode():
                self._run_steps(use_top_p)
            tokens, logps, alive = (t.cpu() for t in (self.out_token, self.out_logp, self.out_alive))  # one sync
            self._collect(rows, slots, results, tokens.tolist(), logps.tolist(), alive.tolist())
        return results

    def _fill(self, rows: list[RowRequest], queue: list[int], slots: list[_Slot], results: list[RowResult]) -> None:
        free = [i for i, sl in enumerate(slots) if sl.row < 0]
        take = queue[: len(free)]
        if not take:
            return
        del queue[: len(take)]
        import torch

        token_l, logp_l = [], []
        with torch.inference_mode():
            for lo, hi in _chunks([len(rows[i].prompt_ids) for i in take], PREFILL_TOKENS):
                token, logp = self._admit([rows[i] for i in take[lo:hi]], take[lo:hi], free[lo:hi], results)
                self.state["token"][torch.tensor(free[lo:hi], device=self.device)] = token
                token_l += token.tolist()
                logp_l += logp.tolist()
        for j, (i, slot) in enumerate(zip(take, free, strict=False)):
            slots[slot].row, slots[slot].tokens, slots[slot].logprobs = i, [token_l[j]], [logp_l[j]]
            self._maybe_finish(rows, slots, slot, results, new_from=0)

    def _collect(self, rows, slots, results, tokens, logps, alive) -> None:
        for index, slot in enumerate(slots):
            if slot.row < 0:
                continue
            start = len(slot.tokens)
            for t, lp, a in zip(tokens[index], logps[index], alive[index], strict=True):
                if a:
                    slot.tokens.append(t)
                    slot.logprobs.append(lp)
            self._maybe_finish(rows, slots, index, results, new_from=start)

    def _maybe_finish(self, rows, slots, index: int, results, new_from: int) -> None:
        """Finish the slot's row if it hit EOS, its budget or a stop string (then cut there); free the slot."""
        import torch

        slot = slots[index]
        row, eos = rows[slot.row], set(self.eos)
        reason = None
        for j in range(new_from, len(slot.tokens)):
            if slot.tokens[j] in eos:
                reason, slot.tokens, slot.logprobs = "stop", slot.tokens[: j + 1], slot.logprobs[: j + 1]
                break
        cut = stop_cut(self.tokenizer, row, slot.tokens, new_from) if row.stop else None
        if cut is not None:
            reason, slot.tokens, slot.logprobs = "stop", slot.tokens[: cut[0]], slot.logprobs[: cut[0]]
        if reason is None and len(slot.tokens) >= row.max_new_tokens:
            reason, slot.tokens, slot.logprobs = (
                "length",
                slot.tokens[: row.max_new_tokens],
                slot.logprobs[: row.max_new_tokens],
            )
        if reason is None:
            return
        result = results[slot.row]
        result.token_ids, result.logprobs, result.finish_reason = slot.tokens, slot.logprobs, reason
        if cut is not None:
            result.text = cut[1]
        else:
            body = slot.tokens[:-1] if slot.tokens and slot.tokens[-1] in eos else slot.tokens
            result.text = self.tokenizer.decode(body, skip_special_tokens=True)
        self.state["active"][torch.tensor([index], device=self.device)] = False
        slots[index] = _Slot()


def _compiled_sampler(device: Any) -> Any:
    """`sample_step`, fused by torch.compile on CUDA (the hash, the scaling and the argmax read the logits
    once); eager elsewhere."""
    if device.type != "cuda":
        return sample_step
    import torch

    return torch.compile(sample_step, dynamic=True)


def _chunks(lengths: list[int], budget: int) -> list[tuple[int, int]]:
    """[lo, hi) ranges whose padded size (count x longest) stays within `budget` (at least one item each)."""
    out, lo, longest = [], 0, 0
    for i, n in enumerate(lengths):
        if i > lo and (i - lo + 1) * max(longest, n) > budget:
            out.append((lo, i))
            lo, longest = i, 0
        longest = max(longest, n)
    out.append((lo, len(lengths)))
    return out
