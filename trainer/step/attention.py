"""Compiling the transformer body for training without losing SDPA's causal flash path.

Where it sits: `GRPOTrainer.__init__` calls `compile_body(model, body)` when `--compile` is on (CUDA).

Why this module exists: for an unpadded micro-batch transformers normally passes no attention mask, and SDPA runs
its causal flash kernel. Under torch.compile with torch < 2.14, transformers cannot tell tracing from exporting and
materialises a dense [T, T] causal mask instead; attention then takes a masked kernel about 2.5x slower (measured:
131 ms of a 0.65 s step on an H200). `compile_body` first switches the model to `atropos_sdpa`: the same SDPA
attention with a mask function that returns no mask when the mask would be purely causal (no padding, no packed
samples, no sliding window), exactly what transformers does outside compile; then it compiles the whole body.
`atropos_sdpa` is for unpacked rows only: packed micro-batches use `atropos_varlen` below (grpo.packing_mode).
If the switch is refused (another transformers version), each decoder layer is compiled on its own instead:
the mask is then built outside the compiled graphs, so it is skipped too, at the price of more host overhead.
"""

from __future__ import annotations

from typing import Any

from atropos_cli.attention import LayerVariant, masked_attention, sequence_attention, window_allows

__all__ = ["compile_body", "ATTENTION_NAME", "VARLEN_NAME", "use_varlen", "varlen_attention", "flash_varlen"]

ATTENTION_NAME = "atropos_sdpa"
VARLEN_NAME = "atropos_varlen"  # statically packed rows (batching.static_micro_batches); no "flash" in the name:
# transformers special-cases names containing it


def _register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    sdpa_mask = ALL_MASK_ATTENTION_FUNCTIONS["sdpa"]

    def causal_or_sdpa_mask(*args: Any, **kwargs: Any) -> Any:
        # no padding, no sliding window, no cache offset: purely causal. (Packed rows never reach this mask:
        # packing switches the model to flex attention. Under tracing transformers composes a packed-sequence
        # mask from the default position ids, so the mask function itself cannot tell us.)
        purely_causal = (
            kwargs.get("attention_mask") is None
            and kwargs.get("local_size") is None
            and kwargs.get("q_length") == kwargs.get("kv_length")
            and not kwargs.get("q_offset")
        )  # (allow_is_causal_skip is not consulted: under tracing transformers clears it for that packed mask)
        return None if purely_causal else sdpa_mask(*args, **kwargs)

    AttentionInterface.register(ATTENTION_NAME, ALL_ATTENTION_FUNCTIONS["sdpa"])
    AttentionMaskInterface.register(ATTENTION_NAME, causal_or_sdpa_mask)


def compile_body(model: Any, body: Any, regional: bool | str = False) -> None:
    """Compile `body` (the model without its LM head) in place: whole, or layer by layer (`regional`, or the
    fallback). Layer by layer, the 24 identical layers of a 0.5B model share one compiled graph: a fraction of
    the compile time, at the price of Python between the layers. Kernels are kept across runs (compile_cache.py)."""
    from atropos_cli import compile_cache

    compile_cache.enable()
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation == "sdpa":
        try:
            _register()
            model.set_attn_implementation(ATTENTION_NAME)
        except (ImportError, ValueError, KeyError, AttributeError):
            implementation = None
        else:
            implementation = ATTENTION_NAME
    options = _no_size_guards()
    if implementation in (ATTENTION_NAME, VARLEN_NAME, "flex_attention") and not regional:
        body.compile(options=options)
        return
    layers = getattr(body, "layers", None)
    for layer in layers if layers is not None else [body]:
        layer.compile(dynamic=True if regional == "dynamic" else None, options=options)


def _no_size_guards() -> dict[str, Any]:
    """Inductor options that keep a layer compiled for dynamic row widths from guarding on the width.

    Inductor's mix-order reduction (the RMSNorm backward's two sibling reductions fused) checks by default that
    rows x hidden >= 5M and rows >= 4096, and turns each check into a guard on the width: a micro-batch narrower
    than a threshold then recompiles the layer. Measured on an H100 (1.5B shape, `TORCH_LOGS=recompiles`): the
    step's short last micro-batch recompiled it in the timed steps (3.21 s a step instead of ~1.2 s, the "1.5B
    anomaly"), and the one-command loop paid a 7.6 s training step at its third step. Non-strict mode skips
    those size checks (no guards); where this torch lacks the switch, nothing changes."""
    import torch._inductor.config as inductor_config

    if hasattr(inductor_config.triton, "mix_order_reduction_non_strict_mode"):
        return {"triton.mix_order_reduction_non_strict_mode": True}
    return {}


# -- varlen attention for statically packed rows ------------------------------------------------------------


def flash_varlen() -> Any:
    """torch's variable-length flash attention (`torch.nn.attention.varlen.varlen_attn`, torch >= 2.9) as
    f(q, k, v, cu_seqlens, max_len, scale, window) on [tokens, heads, dim] tensors, or None where torch lacks it.
    Its keyword arguments moved between torch versions (is_causal, then window_size=(-1, 0); enable_gqa), so they
    are read off its signature once. `attend.windows` says whether it takes a sliding window (window_size)."""
    import functools
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    windows = "window_size" in params
    gqa: dict[str, Any] = {"enable_gqa": True} if "enable_gqa" in params else {}

    def attend(
        q: Any, k: Any, v: Any, cu: Any, max_len: int, scale: float | None, window: int | None = None,
        native: bool = True,
    ) -> Any:  # fmt: skip
        if k.shape[1] != q.shape[1] and not (native and NATIVE_GQA):  # one KV head per query head
            k, v = (x.repeat_interleave(q.shape[1] // x.shape[1], dim=1) for x in (k, v))
        extra = gqa if k.shape[1] != q.shape[1] else {}
        # keyword sets chosen by the installed signature, so their types vary by torch version
        # flash's window (left, 0) keeps keys within [p - left, p]: transformers' window w is left = w - 1
        causal: dict[str, Any] = {"window_size": (window - 1 if window else -1, 0)} if windows else {"is_causal": True}
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, scale=scale, **causal, **extra)

    attend.windows = windows  # type: ignore[attr-defined]
    if "enable_gqa" not in params and not _native_gqa_works(attend):
        partial = functools.partial(attend, native=False)
        partial.windows = windows  # type: ignore[attr-defined]
        return partial
    return attend


def _native_gqa_works(attend: Any) -> bool:
    """Older varlen_attn has no enable_gqa flag, but its flash kernel may take fewer KV heads anyway: check
    the output and all gradients on a small CUDA problem against repeated KV heads, once."""
    import torch

    if not torch.cuda.is_available():
        return False
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(96, h, 64, device="cuda", generator=gen, dtype=torch.bfloat16) for h in (4, 2, 2))
    cu = torch.tensor([0, 40, 96, 96], dtype=torch.int32, device="cuda")
    results = []
    for native in (True, False):
        leaves = [x.clone().requires_grad_(True) for x in (q, k, v)]
        try:
            out = attend(*leaves, cu, 64, None, native=native)
            out.float().square().sum().backward()
        except RuntimeError:
            return False
        grads = [x.grad for x in leaves]
        if any(g is None for g in grads):
            return False
        results.append([out.float(), *(g.float() for g in grads if g is not None)])
    return all(torch.allclose(a, b, atol=2e-2, rtol=2e-2) for a, b in zip(*results, strict=True))


_FLASH: list[Any] = [None]  # flash_varlen(), resolved by use_varlen (never while torch.compile traces)
NATIVE_GQA = True  # pass GQA's fewer KV heads straight to the kernel where it computes them right


def _dense_varlen(q: Any, k: Any, v: Any, cu: Any, scale: float | None, variant: LayerVariant) -> Any:
    """The same attention with a dense block-diagonal causal mask (within the layer's window): through SDPA, or
    through the exact reference where the layer has sinks or soft-capped scores. CPU, tests, and layers the
    varlen kernel cannot run."""
    import torch

    t = q.shape[0]
    positions = torch.arange(t, device=q.device)
    piece = torch.searchsorted(cu[1:].long(), positions, right=True)
    allowed = (piece[:, None] == piece[None, :]) & window_allows(positions[:, None], positions[None, :], variant.window)
    q, k, v = (x.transpose(0, 1)[None] for x in (q, k, v))  # [1, heads, t, dim]
    if variant.sinks is not None or variant.softcap is not None:
        scale = scale if scale is not None else q.shape[-1] ** -0.5
        return masked_attention(q, k, v, allowed, scale, variant.sinks, variant.softcap)[0]
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=allowed, scale=scale, enable_gqa=k.shape[1] != q.shape[1]
    )
    return out[0].transpose(0, 1)


def varlen_attention(
    module: Any, query: Any, key: Any, value: Any, attention_mask: Any, scaling: float | None = None, **kwargs: Any
) -> tuple[Any, None]:
    """transformers attention function for one packed row: causal attention within each piece that
    `cu_seq_lens_q` delimits, within the layer's sliding window, with its sinks and soft-cap where it has them.
    query [1, Hq, T, D], key/value [1, Hkv, T, D] -> ([1, T, Hq, D], None)."""
    import torch

    if kwargs.get("cu_seq_lens_q") is None:  # not a packed row (an eval forward, say)
        return sequence_attention(module, query, key, value, attention_mask, scaling, **kwargs)
    variant = LayerVariant.of(kwargs)
    cu, max_len = kwargs["cu_seq_lens_q"], kwargs["max_length_q"]
    q, k, v = (x[0].transpose(0, 1) for x in (query, key, value))  # [T, heads, D]
    flash = _FLASH[0]
    exact_on_flash = flash is not None and variant.sinks is None and variant.softcap is None
    half = q.dtype in (torch.bfloat16, torch.float16)  # the flash kernel computes in these only (fp32: dense)
    if q.is_cuda and half and exact_on_flash and (variant.window is None or flash.windows):
        out = flash(q.contiguous(), k.contiguous(), v.contiguous(), cu, max_len, scaling, variant.window)
    else:
        out = _dense_varlen(q, k, v, cu, scaling, variant)
    return out[None], None


def use_varlen(model: Any) -> None:
    """Switch `model` to `atropos_varlen` (no mask is built: the pieces come as `cu_seq_lens_q`)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    _FLASH[0] = flash_varlen()
    AttentionInterface.register(VARLEN_NAME, varlen_attention)
    AttentionMaskInterface.register(VARLEN_NAME, lambda *args, **kwargs: None)
    model.set_attn_implementation(VARLEN_NAME)
