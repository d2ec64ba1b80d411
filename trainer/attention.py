"""Compiling the transformer body for training without losing SDPA's causal flash path.

Where it sits: `GRPOTrainer.__init__` calls `compile_body(model, body)` when `--compile` is on (CUDA).

Why this module exists: for an unpadded micro-batch transformers normally passes no attention mask, and SDPA runs
its causal flash kernel. Under torch.compile with torch < 2.14, transformers cannot tell tracing from exporting and
materialises a dense [T, T] causal mask instead; attention then takes a masked kernel about 2.5x slower (measured:
131 ms of a 0.65 s step on an H200). `compile_body` first switches the model to `atropos_sdpa`: the same SDPA
attention with a mask function that returns no mask when the mask would be purely causal (no padding, no packed
samples, no sliding window), exactly what transformers does outside compile; then it compiles the whole body.
`atropos_sdpa` is for unpacked rows only: packed micro-batches use flex attention (grpo.use_packing).
If the switch is refused (another transformers version), each decoder layer is compiled on its own instead:
the mask is then built outside the compiled graphs, so it is skipped too, at the price of more host overhead.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compile_body", "ATTENTION_NAME"]

ATTENTION_NAME = "atropos_sdpa"


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


def compile_body(model: Any, body: Any) -> None:
    """Compile `body` (the model without its LM head) in place: whole, or layer by layer as the fallback."""
    implementation = getattr(model.config, "_attn_implementation", None)
    if implementation == "sdpa":
        try:
            _register()
            model.set_attn_implementation(ATTENTION_NAME)
        except (ImportError, ValueError, KeyError, AttributeError):
            implementation = None
        else:
            implementation = ATTENTION_NAME
    if implementation in (ATTENTION_NAME, "flex_attention"):
        body.compile()
        return
    layers = getattr(body, "layers", None)
    for layer in layers if layers is not None else [body]:
        layer.compile()
