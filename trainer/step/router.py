"""Mixture-of-experts routers in the GRPO step: the load-balancing loss the model's config asks for, and the
load-balance metrics of every MoE run.

Where it sits: `GRPOTrainer` builds a `Router` when the model routes tokens to experts (Qwen3-MoE, OLMoE,
gpt-oss: a config with `router_aux_loss_coef` and an expert count). Its forward then asks the body for each
layer's router logits ([tokens, experts], transformers' `output_router_logits`), and `Router.term` turns them
into the micro-batch's share of the step's auxiliary loss and its metrics.

The loss is the Switch Transformer's, as transformers computes it for these models: with f_e the fraction of
top-k assignments that go to expert e and P_e the mean router probability of e (both over every layer's real
tokens), aux = E * sum_e f_e * P_e (k, the experts a token goes to, when perfectly balanced). It joins the
loss as the config says: only when `output_router_logits` is true, weighted by `router_aux_loss_coef`, as
transformers' own `...ForCausalLM.forward` adds it when training with labels. The metrics come either way:

- `moe_aux_loss`: the aux value above (mean over the step's trained tokens, micro-batch by micro-batch);
- `moe_load_max` / `moe_load_min`: the busiest and idlest expert's share of assignments over the uniform share
  (k / E), in the layer where it is most extreme: 1.0 both when balanced, `moe_load_min` 0 when an expert of some
  layer got no token (a dead expert).

Every reduction stays on the device (no host sync: a CUDA graph may record it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["Router", "router_for"]


@dataclass(frozen=True)
class Router:
    """A model's routing facts, read once from its config."""

    experts: int
    top_k: int
    coef: float  # the aux loss's weight in the step loss; 0.0 when the config does not ask for it

    def stats(self, router_logits: tuple[Any, ...], mask: Any) -> tuple[Any, Any, Any]:
        """(aux, load_max, load_min) over every layer's [tokens, experts] logits; `mask` [tokens] (1 on real
        tokens) keeps padding out."""
        import torch

        weight = mask.reshape(-1).float()
        rows = weight.sum().clamp_min(1.0)
        counts, probs = [], []
        for logits in router_logits:
            p = torch.softmax(logits.float(), dim=-1)
            chosen = torch.topk(p, self.top_k, dim=-1).indices
            hits = torch.zeros_like(p).scatter_(1, chosen, 1.0)  # [tokens, E]: 1 where the token went
            counts.append((hits * weight[:, None]).sum(0) / rows)
            probs.append((p * weight[:, None]).sum(0) / rows)
        per_layer = torch.stack(counts)  # [layers, E]: each layer's assignments per token, summing to k
        f, prob = per_layer.mean(0), torch.stack(probs).mean(0)
        aux = self.experts * (f * prob).sum()
        load = per_layer * (self.experts / self.top_k)  # over the uniform share
        return aux, load.max(), load.min()

    def term(self, router_logits: tuple[Any, ...], mask: Any, tokens: Any, divisor: Any, stats: Any) -> Any:
        """This micro-batch's share of the step's aux loss (`tokens` of the step's `divisor` trained tokens), its
        metrics added to `stats` weighted by `tokens` (loss_metrics divides by the step's)."""
        aux, high, low = self.stats(router_logits, mask)
        stats.add("moe_aux_sum", aux * tokens)
        stats.add("moe_load_max_sum", high * tokens)
        stats.add("moe_load_min_sum", low * tokens)
        return aux * (self.coef * tokens / divisor)


def router_for(config: Any) -> Router | None:
    """The model's `Router`, or None for a model without experts."""
    experts = getattr(config, "num_experts", None) or getattr(config, "num_local_experts", None)
    top_k = getattr(config, "num_experts_per_tok", None)
    if not experts or not top_k or not hasattr(config, "router_aux_loss_coef"):
        return None
    coef = float(config.router_aux_loss_coef) if getattr(config, "output_router_logits", False) else 0.0
    return Router(experts=int(experts), top_k=int(top_k), coef=coef)
