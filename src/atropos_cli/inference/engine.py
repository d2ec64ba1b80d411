"""The local backend's static engine (the CUDA default): prefix-shared block KV cache, CUDA-graph decode steps.

Where it sits: `LocalBackend._sample` hands it the batch's `RowRequest`s (sampler.py) and gets `RowResult`s back,
the same contract as `sample_rows` (token ids, raw logprobs, finish reasons, stop strings, per-row temperature /
top-p / seed). `sample_rows` stays the CPU path and the path for top-logprobs requests.

How (the serving tricks, for RL's shape: n rollouts of the same prompt):
- **Groups share their prompt.** Rows with identical prompt ids form a group (chunks of at most `width` rows).
  The cache has one *prompt block* per group slot ([groups, kv heads, prompt_len, dim] a layer), prefilled once
  by one forward of the prompt, and one *generation block* per row ([groups x width, kv heads, gen_len, dim]).
  A group's n rows never copy or re-read each other's prompt: the prompt is prefilled once and its keys/values
  are read once a step for all n rows (`group_attention`: the group's n x (query heads per KV head) query rows
  attend to the shared block as one batch; each row attends to its own tokens apart; the two partial results
  are merged by their log-sum-exps, so the result is exactly attention over prompt + row). The CUDA default
  where Triton imports (`ATTENTION`): one Triton kernel does both parts in one pass (`decode_attention.py`), one
  launch a layer instead of a query copy, two attention kernels and the merge.
- **Continuous batching by group slot.** A finished group frees its slot; the next queued group is prefilled
  into it while the others keep decoding.
- **The decode step runs on the GPU with no host sync** (model forward, raw log-softmax, Gumbel-max sampling at
  each row's temperature / top-p, EOS and length checks) and on CUDA `sync_every` steps are captured as one CUDA
  graph per (top-p on/off, generation bucket) and replayed; the host reads tokens once per replay, checks stop
  strings and refills slots, one replay behind: the next replay runs meanwhile (`_run`). Generation blocks are
  read only up to the current bucket (a power of two covering the longest row so far, `gen_bucket`), so early
  steps read a short cache.
- On CUDA the whole decode step is compiled (`compile_step`) before its graphs are captured, its q/k/v and
  gate/up products merged into one each (`fuse.py`); inductor fuses the norms, rotary, the split attention's
  softmax and the sampler, so a step launches a few kernels a layer (measured 2.4x at batch 64 over the eager
  step; compiling layer by layer instead gave no gain). The price is compile time on the first call: one compile
  per engine shape and generation bucket.
- **Weights change between decode steps.** `run(rows, swap=...)` calls `swap()` before each launch (and each
  prefill): it may copy new weights into the model's tensors in place (the captured graphs read them where they
  are) and returns the version the model now holds. Running rows keep their KV cache and go on under the new
  weights (their earlier keys/values stay those of the old ones, as in PipelineRL's in-flight updates), so a
  row can span versions: a partial rollout. Each token is tagged with the version of the launch (or prefill)
  that produced it (`RowResult.versions`). On CUDA the copy is queued on the stream behind the replay in
  flight, so that replay finishes on the old weights and the next one reads the new.
- Sampling noise is a counter-based hash of (row seed, token index, vocab id): a seeded row gets the same noise
  whatever slot or batch it lands in. The [rows x vocabulary] part runs in int32 (`_mix32`, bit for bit the
  int64 hash: GPUs emulate int64 multiplies). Its tokens are bitwise the same across identical calls; alone vs batched
  they are the same unless a near-tie in the logits flips (batched products can round differently).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from atropos_cli.attention import LayerVariant, sequence_attention
from atropos_cli.inference.sampler import RowRequest, RowResult, cache_kwarg, eos_ids, stop_cut

__all__ = [
    "StaticEngine", "EngineShape", "engine_shape", "group_attention", "kv_layout", "refusal", "supports",
    "decode_attention_for",
    "GROUP_ATTENTION",
]  # fmt: skip

GROUP_ATTENTION = "atropos_group"
PREFILL_TOKENS = 32768  # padded prompt tokens per prefill forward
GEN_BUCKET = 128  # the shortest generation read (buckets are powers of two from here)
PROMPT_BUCKET = 256  # the shortest prompt block (longer ones: powers of two)
_MASK32 = 0xFFFFFFFF


@dataclass(frozen=True)
class EngineShape:
    """The engine's static shape: `groups` group slots of `width` rows, prompt and generation block lengths."""

    width: int
    groups: int
    prompt_len: int
    gen_len: int

    @property
    def slots(self) -> int:
        return self.width * self.groups


def prompt_bucket(tokens: int) -> int:
    """A prompt block's length: a power of two, at least PROMPT_BUCKET. A block too short for a batch means a new
    engine (a compile of the decode step), so blocks come in few sizes: on an H100 a loop whose prompts crossed
    a multiple of 64 now and then paid a ~60 s rebuild inside its steps. A group's block is read once a step for
    all its rows, so the room costs little."""
    return max(PROMPT_BUCKET, 1 << (tokens - 1).bit_length())


def group_rows(rows: list[RowRequest], width: int) -> list[list[int]]:
    """Row indices grouped by identical prompt (first-seen order), each group cut into chunks of `width`."""
    by_prompt: dict[tuple[int, ...], list[int]] = {}
    for i, r in enumerate(rows):
        by_prompt.setdefault(tuple(r.prompt_ids), []).append(i)
    return [idx[k : k + width] for idx in by_prompt.values() for k in range(0, len(idx), width)]


def gen_bucket(entries: int) -> int:
    """Generation entries a step reads: a power of two, at least `GEN_BUCKET` (few buckets, few graphs)."""
    return max(GEN_BUCKET, 1 << (entries - 1).bit_length())


def engine_shape(rows: list[RowRequest], max_rows: int) -> EngineShape:
    """The shape for this batch: width = the most common group size (ties: the larger; rounded up to a power of
    two, at most `max_rows`; a larger group runs as several chunks), enough group slots for the batch rounded up
    to a power of two rows (at most `max_rows`; more groups queue), blocks in power-of-two buckets (few shapes).
    Not the largest group: two of a step's items with the same prompt make one group of twice the size, and an
    engine of twice the width is another compile (H100, arithmetic's second step: 70-79 s), then runs the step's
    other groups in half-empty slots (its fourth step: 2.9 s of generation instead of 0.6 s)."""
    sizes = [len(group) for group in group_rows(rows, len(rows))]  # whole groups, before chunking
    common = max(Counter(sizes).items(), key=lambda item: (item[1], item[0]))[0]
    width = min(1 << (min(common, max_rows) - 1).bit_length(), max_rows)
    wanted = sum(-(-s // width) for s in sizes) * width
    slots = min(max_rows, 1 << max(3, (wanted - 1).bit_length()))
    groups = max(1, slots // width)
    prompt = prompt_bucket(max(len(r.prompt_ids) for r in rows))
    gen = gen_bucket(max(r.max_new_tokens for r in rows))
    return EngineShape(width, groups, prompt, gen)


def kv_layout(config: Any) -> tuple[int, int]:
    """(key/value heads, head dimension) of a decoder config: GQA models name their KV heads, others have one per
    query head; the head dimension is given or the hidden size over the query heads."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return heads, dim


def refusal(model: Any) -> str | None:
    """Why the engine cannot drive this model exactly (None: it can). It drives decoder layers whose attention has
    a `layer_idx` and calls transformers' attention interface, with causal attention, sliding windows (uniform or
    interleaved), attention sinks and soft-capped scores (`atropos_cli.attention`); a model it cannot drive
    exactly runs on the loop sampler instead, never approximately."""
    from atropos_cli.attention import describe
    from atropos_cli.vision import is_vision_config

    if is_vision_config(model.config):
        return "a vision-language model: image inputs and mrope positions are not in its decode step"
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not layers:
        return "no `model.layers` decoder stack"
    attn = getattr(layers[0], "self_attn", None)
    if attn is None or not hasattr(attn, "layer_idx"):
        return "its attention layers have no `layer_idx` (not transformers' attention interface)"
    facts = describe(model)
    if facts.bidirectional:
        return "bidirectional attention"
    if facts.chunked:
        return "chunked attention"
    return None


def supports(model: Any) -> bool:
    """Whether the engine can drive this model exactly (`refusal` gives the reason when not)."""
    return refusal(model) is None


# How decode attention runs: "triton" (one kernel over both blocks, `decode_attention.py`), "fused" (torch's
# memory-efficient kernel on each block, merged by log-sum-exps) or "plain" (matmuls). None: "triton" on CUDA
# where Triton imports (H100, 0.5B shape, batch 512: 118.9k tok/s against fused 106.6k in the same run), else
# "fused"; "plain" on CPU. Read when an engine builds its cache; the benchmark sets it.
ATTENTION: str | None = None


def attention_kind(is_cuda: bool) -> str:
    """The decode attention an engine on a CUDA or a CPU device uses (`ATTENTION` resolved)."""
    if ATTENTION is not None:
        return ATTENTION
    if not is_cuda:
        return "plain"
    from .decode_attention import available

    return "triton" if available() else "fused"


def decode_attention_for(model: Any, is_cuda: bool) -> str:
    """The decode attention an engine uses for this model: the device's (`attention_kind`), except the plain path
    for soft-capped scores (only it caps them: the kernels take raw scores)."""
    from atropos_cli.attention import describe

    return "plain" if describe(model).attn_softcap else attention_kind(is_cuda)


def _partial(q: Any, k: Any, v: Any, mask: Any, bias: Any, scale: float, fused: bool, softcap: float | None):
    """Attention of q [B, H, Lq, D] over the entries of k/v [B, H, Lk, D] that `mask` [B, Lk] allows: (output in
    fp32 [B, H, Lq, D], log-sum-exp of the scaled scores [B, H, Lq]; -inf where no entry is allowed, and then the
    output is 0). Fused: torch's memory-efficient kernel with an additive bias [B, 1, 1, Lk] (0 or -inf), which
    returns its log-sum-exp (no soft-cap: a soft-capped model decodes on the plain path)."""
    import torch

    if fused:
        b, h, lq, _ = q.shape
        full = bias.expand(b, h, lq, bias.shape[-1])
        out, lse = torch.ops.aten._scaled_dot_product_efficient_attention(
            q.contiguous(), k, v, full, True, 0.0, False, scale=scale
        )[:2]
        out, lse = out.float(), lse[:, :, :lq]
    else:
        scores = torch.matmul(q, k.transpose(-1, -2)).float() * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
        lse = torch.logsumexp(scores, -1)
        probs = torch.exp(scores - lse[..., None])
        out = torch.matmul(probs.to(q.dtype), v).float()
    empty = ~mask.any(-1)[:, None, None]  # a window past every entry of this part (or a free slot)
    return out.masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, float("-inf"))


def group_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling=None, **kw: Any):
    """Decode attention over a group's shared prompt block plus each row's own generation block.

    query [S, Hq, 1, D] (S = groups x width rows); the blocks come from `atropos_kv` (a `GroupCache`). The group's
    n rows x (query heads per KV head) attend to the shared prompt block as one batch of query rows, each row to
    its own generation block; the two parts are merged by their log-sum-exps: exactly softmax attention over
    prompt + generated tokens. A layer's sliding window narrows both parts' masks (or the kernel's ranges), sinks
    join the merge's denominator, soft-capped scores decode on the plain path. Anything else (a prefill) goes to
    `attention.sequence_attention`."""
    import torch

    kv = kw.pop("atropos_kv", None)
    if kv is None or query.shape[2] != 1:
        return sequence_attention(module, query, key, value, attention_mask, scaling, **kw)
    variant = LayerVariant.of(kw)
    layer = module.layer_idx
    s, hq, _, d = query.shape
    hk, n = kv.heads, kv.width
    g, r = s // n, hq // hk
    scale = scaling if scaling is not None else d**-0.5
    if kv.decode_op is not None:  # the Triton kernel (fetched when the cache was built: no graph break here)
        sinks = variant.sinks.float() if variant.sinks is not None else kv.no_sinks
        out = kv.decode_op(
            query[:, :, 0, :], kv.prompt_k[layer], kv.prompt_v[layer], kv.gen_k[layer], kv.gen_v[layer],
            kv.prompt_len, kv.gen_pos, sinks, n, kv.bucket, scale, variant.window or 0,
        )  # fmt: skip
        return out.reshape(s, 1, hq, d), None
    fused = kv.attention == "fused"
    q = query.reshape(s, hk, r, d)
    qg = q.reshape(g, n, hk, r, d).permute(0, 2, 1, 3, 4).reshape(g, hk, n * r, d)
    bucket = kv.bucket
    gen_k, gen_v = kv.gen_k[layer][:, :, :bucket], kv.gen_v[layer][:, :, :bucket]
    prompt_mask, gen_mask, prompt_bias, gen_bias = kv.masks(variant.window)
    softcap = variant.softcap
    o1, lse1 = _partial(qg, kv.prompt_k[layer], kv.prompt_v[layer], prompt_mask, prompt_bias, scale, fused, softcap)
    o2, lse2 = _partial(q, gen_k, gen_v, gen_mask, gen_bias, scale, fused, softcap)

    def to_rows(t: Any) -> Any:  # [G, hk, n*r, ...] -> [S, hk, r, ...]
        tail = t.shape[3:]
        return t.reshape(g, hk, n, r, *tail).transpose(1, 2).reshape(s, hk, r, *tail)

    lse1 = to_rows(lse1)
    m = torch.maximum(lse1, lse2)  # finite: a row always sees its own new token
    w1, w2 = torch.exp(lse1 - m)[..., None], torch.exp(lse2 - m)[..., None]
    total = w1 + w2
    if variant.sinks is not None:  # one more logit per query head in the denominator
        sink = variant.sinks.float().reshape(1, hk, r)
        shift = torch.exp(m - torch.maximum(m, sink))[..., None]
        w1, w2 = w1 * shift, w2 * shift
        total = w1 + w2 + torch.exp(sink - torch.maximum(m, sink))[..., None]
    out = (to_rows(o1) * w1 + o2 * w2) / total
    return out.reshape(s, 1, hq, d).to(query.dtype), None


def _use_group_attention(model: Any) -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(GROUP_ATTENTION, group_attention)
    AttentionMaskInterface.register(GROUP_ATTENTION, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    model.set_attn_implementation(GROUP_ATTENTION)


class GroupCache:
    """Prompt blocks per group slot, generation blocks per row; transformers' attention layers write the decode
    step's new key/value through `update` at each row's own generation position (`gen_pos`)."""

    is_compileable = True

    def __init__(
        self, layers: int, shape: EngineShape, heads: int, dim: int, dtype: Any, device: Any, attention: str = ""
    ):
        import torch

        p_shape = (shape.groups, heads, shape.prompt_len, dim)
        g_shape = (shape.slots, heads, shape.gen_len, dim)
        self.prompt_k = [torch.zeros(p_shape, dtype=dtype, device=device) for _ in range(layers)]
        self.prompt_v = [torch.zeros(p_shape, dtype=dtype, device=device) for _ in range(layers)]
        self.gen_k = [torch.zeros(g_shape, dtype=dtype, device=device) for _ in range(layers)]
        self.gen_v = [torch.zeros(g_shape, dtype=dtype, device=device) for _ in range(layers)]
        self.heads, self.width = heads, shape.width
        self.rows = torch.arange(shape.slots, device=device)
        self.prompt_pos = torch.arange(shape.prompt_len, device=device)
        self.gen_pos_range = torch.arange(shape.gen_len, device=device)
        # a free group slot keeps one (finite) entry: no all-masked row, no NaN in any kernel
        self.prompt_len = torch.ones(shape.groups, dtype=torch.long, device=device)
        self.dtype = dtype
        self.gen_pos = torch.zeros(shape.slots, dtype=torch.long, device=device)
        self.bucket = shape.gen_len  # a host int: the generation entries a step reads (one graph per value)
        # the model's decode attention (`decode_attention_for`), or the device's default
        self.attention = attention or attention_kind(torch.device(device).type == "cuda")
        self.no_sinks = torch.empty(0, dtype=torch.float32, device=device)
        self.decode_op = None
        if self.attention == "triton":
            from atropos_cli.inference import decode_attention

            self.decode_op = decode_attention.op()
        self.refresh_masks()

    def refresh_masks(self) -> None:
        """Masks of this step (prompt entries of each group, a row's generated entries up to its new one). The
        Triton kernel needs none: it reads prompt_len and gen_pos itself."""
        if self.decode_op is not None:
            return
        self.prompt_mask = self.prompt_pos[None, :] < self.prompt_len[:, None]
        self.gen_mask = self.gen_pos_range[None, : self.bucket] <= self.gen_pos[:, None]
        self.prompt_bias = _bias(self.prompt_mask, self.dtype)
        self.gen_bias = _bias(self.gen_mask, self.dtype)

    def masks(self, window: int | None) -> tuple[Any, Any, Any, Any]:
        """(prompt mask, generation mask, their biases) of this step for a layer with this sliding window: only
        entries at positions > p - window for a row whose new token sits at p = prompt_len + gen_pos. A group's
        live rows share their position (its rows start together); a finished row's output is never read."""
        if window is None:
            return self.prompt_mask, self.gen_mask, self.prompt_bias, self.gen_bias
        latest = self.gen_pos.view(-1, self.width).amax(1)  # per group
        prompt = self.prompt_mask & (self.prompt_pos[None, :] > (self.prompt_len + latest - window)[:, None])
        gen = self.gen_mask & (self.gen_pos_range[None, : self.bucket] > (self.gen_pos - window)[:, None])
        return prompt, gen, _bias(prompt, self.dtype), _bias(gen, self.dtype)

    def update(self, key: Any, value: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        self.gen_k[layer_idx][self.rows, :, self.gen_pos] = key[:, :, 0]
        self.gen_v[layer_idx][self.rows, :, self.gen_pos] = value[:, :, 0]
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def _bias(mask: Any, dtype: Any) -> Any:
    """An additive attention bias [B, 1, 1, L] from a mask [B, L]: 0 where allowed, -inf elsewhere."""
    import torch

    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(~mask, float("-inf"))[:, None, None]


class _Capture:
    """A cache for a prefill: keeps each layer's keys/values of the prompts (for copying into prompt blocks)."""

    is_compileable = False

    def __init__(self) -> None:
        self.kv: dict[int, tuple[Any, Any]] = {}

    def update(self, key: Any, value: Any, layer_idx: int, *args: Any, **kwargs: Any) -> tuple[Any, Any]:
        self.kv[layer_idx] = (key, value)
        return key, value

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0


def _mix(x: Any) -> Any:
    """A 32-bit integer hash round on int64 tensors holding values < 2^32 (constants < 2^31: no overflow)."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x68E31DA5) & _MASK32
    return x ^ (x >> 16)


def _mix32(x: Any) -> Any:
    """`_mix` on int32 tensors, bit for bit: the multiplies wrap modulo 2^32 as the masked int64 ones do, and the
    right shifts are made logical by masking the sign bits. For the [rows x vocabulary] noise: int64 multiplies
    are emulated on GPUs (several instructions each), int32 ones are native."""
    x = x ^ ((x >> 16) & 0xFFFF)
    x = x * 0x7FEB352D
    x = x ^ ((x >> 15) & 0x1FFFF)
    x = x * 0x68E31DA5
    return x ^ ((x >> 16) & 0xFFFF)


def vocab_hash(vocab: int, device: Any) -> Any:
    """(vocab id x 0x1B873593) mod 2^32 as int32, per vocab id: the noise hash's per-column term."""
    import torch

    return ((torch.arange(vocab, device=device) * 0x1B873593) & _MASK32).to(torch.int32)


def sample_step(
    logits: Any,
    inv_temp: Any,
    greedy: Any,
    top_p: Any,
    seeds: Any,
    counters: Any,
    use_top_p: bool,
    columns: Any = None,
):
    """(token, raw logprob) per row from fp32 logits [S, V]: argmax where `greedy`, else Gumbel-max over
    logits / T restricted to the top-p nucleus when `use_top_p`; noise = hash(seed, counter, vocab id).
    `columns`: `vocab_hash` of the vocabulary, precomputed (the engine's; else made here)."""
    import torch

    if columns is None:
        columns = vocab_hash(logits.shape[-1], logits.device)
    rows, width = logits.shape
    chunks = _vocab_chunks(width)  # two stages, for the same reason as `_argmax`
    lse = torch.logsumexp(torch.logsumexp(logits.view(rows, chunks, width // chunks), -1), -1)
    scaled = logits * inv_temp[:, None]
    if use_top_p:
        probs = torch.softmax(scaled, dim=-1)
        sorted_probs = probs.sort(dim=-1, descending=True).values
        before = sorted_probs.cumsum(dim=-1) - sorted_probs  # mass of the tokens ranked above
        keep = (before < top_p[:, None]).sum(-1, keepdim=True).clamp(min=1)
        threshold = sorted_probs.gather(1, keep - 1)
        scaled = scaled.masked_fill(probs < threshold, float("-inf"))
    row = _mix((seeds ^ _mix(counters & _MASK32)) & _MASK32).to(torch.int32)  # [rows]: int64 is cheap here
    # the per-column term is read from a tensor, not computed from the column index: inductor folds an index
    # times 0x1B873593 into an int32 index expression, and under the two-stage reductions' [rows, 64, vocab / 64]
    # view its constant (0x1B873593 x vocab / 64) no longer fits an int32 (torch 2.11, H100: a compile error)
    bits = _mix32(row[:, None] + columns[None, :])  # [rows, vocab]: int32, wrapping
    uniform = (((bits >> 8) & 0xFFFFFF).to(torch.float32) + 0.5) * (1.0 / 16777216.0)
    noisy = scaled - torch.log(-torch.log(uniform))
    token = torch.where(greedy, _argmax(logits), _argmax(noisy))
    return token, logits.gather(1, token[:, None])[:, 0] - lse


def _vocab_chunks(vocab: int) -> int:
    """Chunks a vocabulary-wide reduction runs in: the largest power of two up to 64 that divides `vocab` into
    chunks of at least 1024 entries (1: no split)."""
    chunks = 64
    while chunks > 1 and (vocab % chunks or vocab // chunks < 1024):
        chunks //= 2
    return chunks


def _argmax(x: Any) -> Any:
    """`x.argmax(-1)` of [rows, vocab] in two stages: the maximum of each vocabulary chunk, then of the chunks.
    The same index (the first maximum: within a chunk, then the first chunk holding it), but [rows x chunks]
    parallel reductions instead of one per row: compiled as one, 64 rows left most of an H100 idle (its Gumbel
    argmax took 87 us of a 1.4 ms decode step at batch 64)."""
    import torch

    rows, vocab = x.shape
    chunks = _vocab_chunks(vocab)
    if chunks == 1:
        return x.argmax(-1)
    best, where = x.view(rows, chunks, vocab // chunks).max(-1)
    chunk = best.argmax(-1)
    # the winning chunk's index picked by a mask, not a gather: inductor (torch 2.11) failed to compile the
    # gather's bounds check nested in the sampler's own gather of the token's logit (H100, 2026-11-27)
    picked = torch.where(torch.arange(chunks, device=x.device) == chunk[:, None], where, 0).sum(-1)
    return chunk * (vocab // chunks) + picked


@dataclass
class _Flight:
    """A launched run of decode steps: host buffers its outputs are copied to (ready once `event` has passed;
    None on CPU, where they are ready at once) and the groups the slots held at launch."""

    host: tuple[Any, ...]
    event: Any
    slots: list[list[_Row] | None]
    version: int | None = None  # the weights' version at launch (None: no swap points)


@dataclass
class _Row:
    index: int  # into the call's rows
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    done: bool = False
    versions: list[int] | None = None  # per token, when the call has swap points


class StaticEngine:
    """Owns the group cache, the per-row state tensors and (CUDA) the captured decode graphs of one model."""

    def __init__(
        self, model: Any, tokenizer: Any, shape: EngineShape, sync_every: int = 8, compile_step: bool | None = None
    ) -> None:
        import torch

        cfg = model.config
        self.model, self.tokenizer, self.shape = model, tokenizer, shape
        self.sync_every = sync_every
        self.device = model.device
        self.cache_kw = cache_kwarg(model)
        heads, dim = kv_layout(cfg)
        attention = decode_attention_for(model, self.device.type == "cuda")
        self.cache = GroupCache(cfg.num_hidden_layers, shape, heads, dim, model.dtype, self.device, attention)
        self.eos = sorted(eos_ids(model, tokenizer))
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (self.eos or [0])[0]
        _use_group_attention(model)
        slots, dev = shape.slots, self.device
        z = lambda dtype: torch.zeros(slots, dtype=dtype, device=dev)  # noqa: E731
        long, f32, bool_ = torch.long, torch.float32, torch.bool
        self.state = {
            "token": z(long), "pos": z(long), "active": z(bool_), "generated": z(long), "max_new": z(long),
            "inv_temp": torch.ones(slots, dtype=f32, device=dev), "greedy": z(bool_),
            "top_p": torch.ones(slots, dtype=f32, device=dev), "seed": z(long),
        }  # fmt: skip
        self.dummy_mask = torch.ones(slots, 1, 1, 1, dtype=bool_, device=dev)  # a 4D mask: transformers passes it on
        self.eos_tensor = torch.tensor(self.eos or [-1], dtype=long, device=dev)
        head = model.get_output_embeddings()
        self.columns = vocab_hash(head.weight.shape[0] if head is not None else cfg.vocab_size, dev)
        self.column = torch.zeros(1, dtype=long, device=dev)
        self.out_token = torch.zeros(slots, sync_every, dtype=long, device=dev)
        self.out_logp = torch.zeros(slots, sync_every, dtype=f32, device=dev)
        self.out_alive = torch.zeros(slots, sync_every, dtype=bool_, device=dev)
        self._graphs: dict[tuple[bool, int], Any] = {}
        self._pool: Any = None
        # two sets of host buffers for the outputs of the replay in flight and the one before (`_launch`)
        pin = self.device.type == "cuda"
        outs = (self.out_token, self.out_logp, self.out_alive)
        self._host = [tuple(torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for t in outs) for _ in range(2)]
        self._flip = 0
        on_cuda = self.device.type == "cuda"
        if on_cuda and model.dtype != torch.bfloat16 and getattr(cfg, "_experts_implementation", None) == "grouped_mm":
            # transformers' grouped experts take a looping fallback outside bf16 that reads expert counts on the
            # host: no CUDA graph can hold it. The batched form is the same products without that read.
            model.set_experts_implementation("batched_mm")
        self._sampler = _compiled(sample_step) if on_cuda else sample_step
        compile_step = on_cuda if compile_step is None else compile_step
        if compile_step:  # q/k/v and gate/up as one matrix product each in the compiled step (fuse.py)
            from . import fuse

            fuse.share_storage(model)
            self._step_fn = _compiled(self._step, fuse.backend)
        else:
            self._step_fn = self._step
        self._step_sampler = sample_step if compile_step else self._sampler  # a compiled step fuses it itself
        self._swap: Callable[[], int] | None = None  # this call's swap point (run)
        self._version: int | None = None  # the weights' version the next launch runs on

    # -- the step (no host sync) ------------------------------------------------------------------------
    def _step(self, use_top_p: bool) -> None:
        s, cache = self.state, self.cache
        cache.refresh_masks()
        out = self.model(
            input_ids=s["token"][:, None], position_ids=s["pos"][:, None], attention_mask=self.dummy_mask,
            use_cache=True, atropos_kv=cache, logits_to_keep=1, **{self.cache_kw: cache},
        )  # fmt: skip
        logits = out.logits[:, -1, :].float()
        token, logp = self._step_sampler(
            logits, s["inv_temp"], s["greedy"], s["top_p"], s["seed"], s["generated"], use_top_p, self.columns
        )
        alive = s["active"].clone()
        self.out_token.index_copy_(1, self.column, token[:, None])
        self.out_logp.index_copy_(1, self.column, logp[:, None])
        self.out_alive.index_copy_(1, self.column, alive[:, None])
        done = (token[:, None] == self.eos_tensor[None, :]).any(-1) | (s["generated"] + 1 >= s["max_new"])
        s["active"].logical_and_(~done)
        s["token"].copy_(token)
        step = alive.long()  # finished rows stop advancing: their next writes stay inside their block
        s["pos"].add_(step)
        s["generated"].add_(step)
        cache.gen_pos.add_(step)
        self.column.add_(1)

    def _run_steps(self, use_top_p: bool, bucket: int) -> None:
        """`sync_every` decode steps: replays of the captured graph on CUDA, eager (or compiled) elsewhere. Runs
        under `_launch`'s inference mode."""
        self.cache.bucket = bucket
        self.column.zero_()
        if self.device.type != "cuda":
            for _ in range(self.sync_every):
                self._step_fn(use_top_p)
            return
        graph = self._graphs.get((use_top_p, bucket))
        if graph is None:
            graph = self._graphs[(use_top_p, bucket)] = self._capture(use_top_p)
        graph.replay()

    def _capture(self, use_top_p: bool) -> Any:
        """Capture `sync_every` steps as one graph (one memory pool for all of this engine's graphs). Warm-up
        steps first (kernel choices, compilation); the state they advance is saved and restored."""
        import torch

        saved = self._snapshot()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for _ in range(2):
                self.column.zero_()
                self._step_fn(use_top_p)
        torch.cuda.current_stream().wait_stream(stream)
        self._restore(saved)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.inference_mode(), torch.cuda.graph(graph, pool=self._pool):
            for _ in range(self.sync_every):
                self._step_fn(use_top_p)
        self._restore(saved)
        return graph

    def _tensors(self) -> dict[str, Any]:
        return {**self.state, "gen_pos": self.cache.gen_pos, "column": self.column}

    def _snapshot(self) -> dict[str, Any]:
        return {k: v.clone() for k, v in self._tensors().items()}

    def _restore(self, saved: dict[str, Any]) -> None:
        tensors = self._tensors()
        for k, v in saved.items():
            tensors[k].copy_(v)

    # -- admitting groups -------------------------------------------------------------------------------
    def _prefill(self, rows: list[RowRequest], groups: list[list[int]], slots: list[int]) -> tuple[Any, Any]:
        """One forward over the groups' prompts (left-padded), their keys/values copied into the slots' prompt
        blocks; each row's first token is sampled from its group's last logits. Returns (token, logprob) of
        the rows in slot order (group slot, then position in the group)."""
        import torch

        prompts = [rows[g[0]].prompt_ids for g in groups]
        width = max(len(p) for p in prompts)
        n, dev = len(prompts), self.device
        ids = torch.full((n, width), self.pad_id, dtype=torch.long)
        real = torch.zeros((n, width), dtype=torch.bool)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            real[i, width - len(p) :] = True
        ids, real = ids.to(dev), real.to(dev)
        positions = (real.long().cumsum(-1) - 1).clamp(min=0)
        causal = torch.ones(width, width, dtype=torch.bool, device=dev).tril()
        mask = (causal[None] & real[:, None, :]) | torch.eye(width, dtype=torch.bool, device=dev)[None]
        capture = _Capture()
        out = self.model(
            input_ids=ids, position_ids=positions, attention_mask=mask[:, None], use_cache=True, logits_to_keep=1,
            **{self.cache_kw: capture},
        )  # fmt: skip
        self._write_prompts(prompts, slots, capture, width)
        row_slots = self._set_rows(rows, groups, slots)
        group_of = torch.tensor([i for i, g in enumerate(groups) for _ in g], device=dev)
        s, slot_t = self.state, torch.tensor(row_slots, device=dev)
        logits = out.logits[:, -1, :].float()[group_of]
        token, logp = self._sampler(
            logits, s["inv_temp"][slot_t], s["greedy"][slot_t], s["top_p"][slot_t],
            s["seed"][slot_t], s["generated"][slot_t] - 1, bool((s["top_p"][slot_t] < 1).any()), self.columns,
        )  # fmt: skip
        s["token"][slot_t] = token
        return token, logp

    def _write_prompts(self, prompts: list[list[int]], slots: list[int], capture: _Capture, width: int) -> None:
        """Copy each prompt's keys/values (left-padded in the prefill) to the start of its slot's prompt block."""
        import torch

        dev = self.device
        lengths = torch.tensor([len(p) for p in prompts])
        which = torch.arange(len(prompts)).repeat_interleave(lengths)
        offset = torch.cat([torch.arange(n) for n in lengths.tolist()])
        col = (width - lengths)[which] + offset  # where the token sits in the padded prefill
        slot = torch.tensor(slots)[which]
        which, col, slot, offset = (t.to(dev) for t in (which, col, slot, offset))
        for layer, (k, v) in capture.kv.items():
            self.cache.prompt_k[layer][slot, :, offset, :] = k[which, :, col, :]
            self.cache.prompt_v[layer][slot, :, offset, :] = v[which, :, col, :]
        self.cache.prompt_len[torch.tensor(slots, device=dev)] = lengths.to(dev)

    def _set_rows(self, rows: list[RowRequest], groups: list[list[int]], slots: list[int]) -> list[int]:
        """Per-row state of the admitted groups (the group slot's unused rows stay inactive); returns the row
        slots of the admitted rows."""
        import torch

        s, dev, w = self.state, self.device, self.shape.width
        row_slots = [slot * w + j for g, slot in zip(groups, slots, strict=True) for j in range(len(g))]
        all_slots = torch.tensor([slot * w + j for slot in slots for j in range(w)], device=dev)
        s["active"][all_slots] = False
        self.cache.gen_pos[all_slots] = 0
        picked = [rows[i] for g in groups for i in g]
        slot_t = torch.tensor(row_slots, device=dev)
        values = {
            "pos": [len(r.prompt_ids) for r in picked],
            "max_new": [r.max_new_tokens for r in picked],
            "inv_temp": [1.0 / r.temperature if r.temperature > 0 else 1.0 for r in picked],
            "greedy": [r.temperature <= 0 for r in picked],
            "top_p": [r.top_p for r in picked],
            "seed": [(r.seed ^ (r.seed >> 32)) & _MASK32 for r in picked],
            "generated": [1] * len(picked),  # the prefill samples token 0 (counter 0); decode steps count on
            "active": [True] * len(picked),
        }
        for name, vals in values.items():
            s[name][slot_t] = torch.tensor(vals, dtype=s[name].dtype, device=dev)
        return row_slots

    # -- the call -----------------------------------------------------------------------------------------
    def run(self, rows: list[RowRequest], swap: Callable[[], int] | None = None) -> list[RowResult]:
        """Sample every row (groups queue when there are more than group slots); results in row order. `swap`:
        called between decode steps (see the module docstring); it returns the weights' version."""
        import contextlib

        import torch

        # the model's GPU is made current for this call: it may run on a worker thread, whose current device is
        # cuda:0 whatever the process chose (a many-GPU run's rank on cuda:2 would capture its graphs on cuda:0)
        on_device = torch.cuda.device(self.device) if self.device.type == "cuda" else contextlib.nullcontext()
        self._swap, self._version = swap, None
        with on_device:
            return self._run(rows)

    def _check(self, rows: list[RowRequest]) -> None:
        shape = self.shape
        for r in rows:
            if len(r.prompt_ids) > shape.prompt_len or r.max_new_tokens > shape.gen_len:
                raise ValueError(
                    f"row of {len(r.prompt_ids)} prompt + {r.max_new_tokens} new tokens exceeds the engine's "
                    f"blocks ({shape.prompt_len} + {shape.gen_len}): build the engine with engine_shape(rows)"
                )

    def _run(self, rows: list[RowRequest]) -> list[RowResult]:
        """The decode loop, one replay ahead: the next `sync_every` steps are launched before the host reads the
        last ones' tokens, so the host's reading, stop checks and bookkeeping overlap the GPU's next steps
        (H100, 0.5B shape: they were a quarter of a batch-512 call's time, the GPU idle meanwhile). What the host
        learns from a replay (a stop string, a finished group) takes effect one replay later: a row that a stop
        string ended decodes up to `sync_every` more tokens, which are never read, and a freed slot is refilled
        after the replay in flight. A replay is launched only while some row can still need it (below its token
        budget after the one in flight), so a batch that ends by length wastes none."""
        self._check(rows)
        results = [RowResult([], []) for _ in rows]
        queue = group_rows(rows, self.shape.width)
        slots: list[list[_Row] | None] = [None] * self.shape.groups
        use_top_p = any(r.top_p < 1 and r.temperature > 0 for r in rows)
        self.state["active"].zero_()
        flight: _Flight | None = None
        while True:
            if self._swap is not None:  # new weights land here, between two launches
                self._version = self._swap()
            self._fill(rows, queue, slots, results)
            ahead = 0 if flight is None else self.sync_every  # tokens the replay in flight adds to every live row
            needed = [
                len(m.tokens) + ahead
                for g in slots if g is not None for m in g
                if not m.done and len(m.tokens) + ahead < rows[m.index].max_new_tokens
            ]  # fmt: skip
            launched = self._launch(use_top_p, max(needed) + self.sync_every, slots) if needed else None
            if flight is not None:
                self._collect(rows, flight, slots, results)
            flight = launched
            if flight is None and not queue and all(g is None for g in slots):
                return results

    def _launch(self, use_top_p: bool, reach: int, slots: list[list[_Row] | None]) -> _Flight:
        """Run (CUDA: enqueue) `sync_every` steps reading generation entries up to `reach`, and the copy of their
        outputs to host buffers; the flight remembers which rows the slots held."""
        import torch

        bucket = min(gen_bucket(reach), self.shape.gen_len)
        with torch.inference_mode():
            self._run_steps(use_top_p, bucket)
            host = self._host[self._flip]
            self._flip ^= 1
            for dst, src in zip(host, (self.out_token, self.out_logp, self.out_alive), strict=True):
                dst.copy_(src, non_blocking=True)
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return _Flight(host, event, list(slots), self._version)

    def _fill(self, rows: list[RowRequest], queue: list[list[int]], slots: list[list[_Row] | None], results) -> None:
        free = [i for i, g in enumerate(slots) if g is None]
        take = queue[: len(free)]
        if not take:
            return
        del queue[: len(take)]
        import torch

        token_l: list[int] = []
        logp_l: list[float] = []
        sizes = [len(rows[g[0]].prompt_ids) for g in take]
        with torch.inference_mode():
            for lo, hi in _chunks(sizes, PREFILL_TOKENS):
                token, logp = self._prefill(rows, take[lo:hi], free[lo:hi])
                token_l += token.tolist()
                logp_l += logp.tolist()
        k = 0
        for group, slot in zip(take, free, strict=False):
            members = []
            for j, i in enumerate(group):
                member = _Row(i, [token_l[k]], [logp_l[k]])
                if self._version is not None:
                    member.versions = [self._version]
                k += 1
                members.append(member)
                self._maybe_finish(rows, member, slot * self.shape.width + j, results, new_from=0)
            slots[slot] = None if all(m.done for m in members) else members  # finished at the first token

    def _collect(self, rows, flight: _Flight, slots: list[list[_Row] | None], results) -> None:
        """Append a finished flight's tokens to the rows it ran for; a group done by now frees its slot (unless
        the slot holds another group already)."""
        if flight.event is not None:
            flight.event.synchronize()
        tokens, logps, alive = (t.tolist() for t in flight.host)
        w = self.shape.width
        for slot, group in enumerate(flight.slots):
            if group is None:
                continue
            for j, member in enumerate(group):
                if member.done:
                    continue
                start = len(member.tokens)
                for t, lp, a in zip(tokens[slot * w + j], logps[slot * w + j], alive[slot * w + j], strict=True):
                    if a:
                        member.tokens.append(t)
                        member.logprobs.append(lp)
                        if member.versions is not None and flight.version is not None:
                            member.versions.append(flight.version)
                self._maybe_finish(rows, member, slot * w + j, results, new_from=start)
            if slots[slot] is group and all(m.done for m in group):
                slots[slot] = None

    def _maybe_finish(self, rows, member: _Row, row_slot: int, results, new_from: int) -> None:
        """Finish the row if it hit EOS, its budget or a stop string (then cut there); deactivate its slot."""
        import torch

        row, eos = rows[member.index], set(self.eos)
        reason = None
        for j in range(new_from, len(member.tokens)):
            if member.tokens[j] in eos:
                reason, member.tokens, member.logprobs = "stop", member.tokens[: j + 1], member.logprobs[: j + 1]
                break
        cut = stop_cut(self.tokenizer, row, member.tokens, new_from) if row.stop else None
        if cut is not None:
            reason, member.tokens, member.logprobs = "stop", member.tokens[: cut[0]], member.logprobs[: cut[0]]
        if reason is None and len(member.tokens) >= row.max_new_tokens:
            n = row.max_new_tokens
            reason, member.tokens, member.logprobs = "length", member.tokens[:n], member.logprobs[:n]
        if reason is None:
            return
        result = results[member.index]
        result.token_ids, result.logprobs, result.finish_reason = member.tokens, member.logprobs, reason
        if member.versions is not None:
            result.versions = member.versions[: len(member.tokens)]
        if cut is not None:
            result.text = cut[1]
        else:
            body = member.tokens[:-1] if member.tokens and member.tokens[-1] in eos else member.tokens
            result.text = self.tokenizer.decode(body, skip_special_tokens=True)
        self.state["active"][torch.tensor([row_slot], device=self.device)] = False
        member.done = True


def _compiled(fn: Any, backend: Any = "inductor") -> Any:
    """`fn` compiled by torch.compile (CUDA: inductor fuses the elementwise work between matrix products; the
    decode step's `backend` first fuses its projections, fuse.py). Each engine shape and generation bucket is
    one static graph: the recompile limit is raised to hold them. Kernels are kept across runs
    (compile_cache.py)."""
    import torch

    from atropos_cli import compile_cache

    compile_cache.enable()

    config = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(config, name) and getattr(config, name) < 64:
            setattr(config, name, 64)
    return torch.compile(fn, dynamic=False, backend=backend)


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
