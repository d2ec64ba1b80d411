"""Fused projections for the engine's compiled decode step: one matrix product where a layer has several over
the same input (attention's q/k/v, the MLP's gate/up).

Where it sits: `StaticEngine` calls `share_storage(model)` once, then compiles its decode step with `backend`.

Why: a decode step at batch 64 is a few hundred small kernels (H100, 0.5B shape: 349 kernels, 58% of the GPU time
in matrix products of 4-6 us each, `benchmarks/results/generation_gpu.md`); q, k and v are three products over
the same hidden states (k and v 128 columns wide: pure launch latency), gate and up two more. One product over
the concatenated weights does the same arithmetic in one kernel.

How, without touching the model's parameters or its state dict:
- `share_storage` lays each group's weights (and biases) end to end in one buffer and makes the parameters views
  into it (same values, same names, same shapes): an in-place weight sync (`copy_weights`) writes through them,
  so the fused weight is always the current one, with no copy a step.
- `backend` is a torch.compile backend: in the traced step it finds linear calls over the same input whose
  weights are such adjacent views, replaces them with one linear over an `as_strided` view spanning the group
  (no copy) and slices of its output, then hands the graph to inductor. Groups it cannot prove adjacent at trace
  time are left alone, so the result is the same model whatever it finds.
"""

from __future__ import annotations

import operator
from typing import Any

__all__ = ["share_storage", "backend", "fuse_linears", "GROUPS"]

GROUPS = (("self_attn", ("q_proj", "k_proj", "v_proj")), ("mlp", ("gate_proj", "up_proj")))


def _linear_group(parent: Any, names: tuple[str, ...]) -> list[Any] | None:
    import torch

    mods: list[Any] = [getattr(parent, n, None) for n in names]
    if not all(isinstance(m, torch.nn.Linear) for m in mods):
        return None
    first = mods[0].weight
    same = all(
        m.in_features == mods[0].in_features and m.weight.dtype == first.dtype and m.weight.device == first.device
        for m in mods
    )
    biased = {m.bias is not None for m in mods}
    return mods if same and len(biased) == 1 else None


def _lay_end_to_end(params: list[Any]) -> bool:
    """Make `params` views into one new buffer, end to end in order; False when they already are."""
    import torch

    if _adjacent([p.data for p in params]):
        return False
    flat = torch.cat([p.data.reshape(-1) for p in params])
    offset = 0
    for p in params:
        n = p.numel()
        p.data = flat[offset : offset + n].view(p.shape)
        offset += n
    return True


def share_storage(model: Any) -> int:
    """Lay every decoder layer's q/k/v and gate/up weights (and biases) end to end in one buffer each, the
    parameters views into it; returns the groups laid out (0 when the model has none or they already are)."""
    layers = getattr(getattr(model, "model", None), "layers", None) or []
    done = 0
    for layer in layers:
        for parent_name, names in GROUPS:
            mods = _linear_group(getattr(layer, parent_name, None), names)
            if mods is None:
                continue
            changed = _lay_end_to_end([m.weight for m in mods])
            if mods[0].bias is not None:
                changed = _lay_end_to_end([m.bias for m in mods]) or changed
            done += changed
    return done


def _adjacent(tensors: list[Any]) -> bool:
    """Contiguous tensors of one storage, each starting where the one before ends."""
    if any(t is None or not t.is_contiguous() for t in tensors):
        return False
    storage = tensors[0].untyped_storage().data_ptr()
    offset = tensors[0].storage_offset()
    for t in tensors:
        if t.untyped_storage().data_ptr() != storage or t.storage_offset() != offset:
            return False
        offset += t.numel()
    return True


def fuse_linears(gm: Any, example_inputs: list[Any]) -> int:
    """Rewrite `gm` (a dynamo graph) in place: linear calls over one input whose weights (and biases) are
    adjacent views of graph inputs become one linear and slices. Returns the groups fused."""
    import torch

    values = dict(zip([n for n in gm.graph.nodes if n.op == "placeholder"], example_inputs, strict=False))
    by_input: dict[Any, list[Any]] = {}
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target is torch._C._nn.linear and not node.kwargs:
            by_input.setdefault(node.args[0], []).append(node)
    fused = 0
    for nodes in by_input.values():
        if len(nodes) < 2:
            continue
        weights: list[Any] = [values.get(n.args[1]) for n in nodes]
        biases: list[Any] = [values.get(n.args[2]) if len(n.args) > 2 else None for n in nodes]
        if any(not isinstance(w, torch.Tensor) or w.dim() != 2 for w in weights) or not _adjacent(weights):
            continue
        has_bias = [b is not None for b in biases]
        if any(has_bias) and not (all(has_bias) and _adjacent(biases)):
            continue
        if len({w.shape[1] for w in weights}) != 1:
            continue
        outs = [w.shape[0] for w in weights]
        total, width = sum(outs), weights[0].shape[1]
        first = nodes[0]
        graph = gm.graph
        with graph.inserting_before(first):
            w_all = graph.call_function(
                torch.as_strided, (first.args[1], (total, width), (width, 1), weights[0].storage_offset())
            )
            b_all = None
            if biases[0] is not None:  # all or none (checked above)
                offset = biases[0].storage_offset()
                b_all = graph.call_function(torch.as_strided, (first.args[2], (total,), (1,), offset))
            y = graph.call_function(torch._C._nn.linear, (first.args[0], w_all, b_all))
            parts = graph.call_function(torch.split, (y, outs), {"dim": -1})
            pieces = [graph.call_function(operator.getitem, (parts, i)) for i in range(len(nodes))]
        for node, piece in zip(nodes, pieces, strict=True):
            piece.meta = dict(node.meta)
            node.replace_all_uses_with(piece)
            graph.erase_node(node)
        fused += 1
    if fused:
        gm.graph.lint()
        gm.recompile()
    return fused


def backend(gm: Any, example_inputs: list[Any]) -> Any:
    """torch.compile backend: `fuse_linears`, then inductor."""
    from torch._inductor.compile_fx import compile_fx

    fuse_linears(gm, example_inputs)
    return compile_fx(gm, example_inputs)
