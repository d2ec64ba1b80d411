"""`atropos_sdpa`: SDPA with a mask function that skips purely causal masks (what keeps the causal flash path
under torch.compile); padded rows get transformers' own SDPA mask. (Packed rows use flex attention instead.)"""

from __future__ import annotations

import torch

from atropos_cli.trainer.step.attention import ATTENTION_NAME, _register
from tiny_models import tiny_causal_lm


def test_the_mask_is_skipped_only_when_purely_causal():
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, causal_mask_function

    _register()
    mask_fn = ALL_MASK_ATTENTION_FUNCTIONS[ATTENTION_NAME]
    common = {"batch_size": 2, "q_length": 6, "kv_length": 6, "q_offset": 0, "kv_offset": 0, "device": "cpu"}
    assert mask_fn(**common, mask_function=causal_mask_function, attention_mask=None) is None
    padding = torch.ones(2, 6, dtype=torch.bool)
    padding[1, 4:] = False
    padded = mask_fn(**common, mask_function=causal_mask_function, attention_mask=padding)
    assert padded is not None and not bool(padded[1, 0, 5, 5]) and bool(padded[0, 0, 5, 5])


def test_atropos_sdpa_gives_the_same_hidden_states_as_sdpa():
    model = tiny_causal_lm("qwen", 89)
    x = torch.randint(1, 80, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    with torch.no_grad():
        before = [
            model.model(input_ids=x, use_cache=False).last_hidden_state,
            model.model(input_ids=x, attention_mask=mask, use_cache=False).last_hidden_state,
        ]
        _register()
        model.set_attn_implementation(ATTENTION_NAME)
        after = [
            model.model(input_ids=x, use_cache=False).last_hidden_state,
            model.model(input_ids=x, attention_mask=mask, use_cache=False).last_hidden_state,
        ]
    for b, a in zip(before, after, strict=True):
        assert torch.allclose(a, b, atol=1e-6)


def test_under_compile_tracing_unpadded_rows_keep_the_causal_flash_path():
    """What the module is for: traced by torch.compile, plain `sdpa` gets a materialised [T, T] mask (torch <
    2.14); `atropos_sdpa` gets none and asks SDPA for is_causal, as eager transformers does."""
    seen: list[tuple[object, object]] = []

    def inspect(gm, example_inputs):
        for node in gm.graph.nodes:
            if "scaled_dot_product_attention" in str(node.target):
                mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
                seen.append((mask, node.kwargs.get("is_causal")))
        return gm.forward

    model = tiny_causal_lm("qwen", 89)
    _register()
    model.set_attn_implementation(ATTENTION_NAME)
    torch._dynamo.reset()
    torch.compile(model.model, backend=inspect)(input_ids=torch.randint(1, 80, (2, 16)), use_cache=False)
    assert len(seen) == 2  # one per layer
    assert all(mask is None and causal is True for mask, causal in seen)


def test_compile_body_compiles_the_whole_body_on_atropos_sdpa_and_layers_otherwise():
    from atropos_cli.trainer.step.attention import compile_body

    model = tiny_causal_lm("qwen", 89)  # sdpa: switched to atropos_sdpa, the body compiled whole
    compile_body(model, model.model)
    assert model.config._attn_implementation == ATTENTION_NAME
    assert model.model._compiled_call_impl is not None
    assert all(layer._compiled_call_impl is None for layer in model.model.layers)

    eager = tiny_causal_lm("qwen", 89)
    eager.set_attn_implementation("eager")  # not ours to switch: each layer compiled on its own
    compile_body(eager, eager.model)
    assert eager.model._compiled_call_impl is None
    assert all(layer._compiled_call_impl is not None for layer in eager.model.layers)
