"""A mixture-of-experts feed-forward layer: a router picks `top_k` of `n_experts` SwiGLU MLPs for each token.

Parameters grow with `n_experts`, compute per token only with `top_k`: each expert runs on the tokens routed to
it, gathered by index (`index_select`) and scattered back weighted (`index_add_`), never on all of them.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import nn
from torch.nn import functional as F

from .mlp import SwiGLU

Routing = Literal["softmax_then_topk", "topk_then_softmax"]


def top_k_routing(router_logits: torch.Tensor, top_k: int, order: Routing = "softmax_then_topk",
                  renormalize: bool = True,
                  selection_bias: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's `top_k` experts and their weights, from router logits (N, E): both (N, top_k), best first.

    "softmax_then_topk" (Mixtral in transformers, Qwen-MoE, DeepSeek-V2) keeps the top-k probabilities of all E;
    `renormalize` rescales them to sum to 1 (Mixtral and Qwen3's MoE models do; Qwen1.5/Qwen2-MoE's
    `norm_topk_prob=False` does not). With top_k = 1, renormalising makes every weight 1 and leaves the router no
    gradient from the task loss (the Switch Transformer keeps the probability). DeepSeek-V3 routes otherwise: a
    sigmoid per expert, the top k chosen with a per-expert bias added, the kept sigmoids renormalised.
    "topk_then_softmax" (Mistral's reference Mixtral code) takes a softmax over the k chosen logits only, which is
    the same as softmax-then-top-k renormalised: exp(l_i) / sum over the chosen j of exp(l_j) either way.
    `selection_bias` (E,) is added to the scores (the probabilities, or the logits for "topk_then_softmax") only to
    choose the experts; the weights come from the unbiased scores (DeepSeek-V3's auxiliary-loss-free balancing).
    """
    n_experts = router_logits.shape[-1]
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be between 1 and n_experts = {n_experts}, got {top_k}")
    if selection_bias is not None and tuple(selection_bias.shape) != (n_experts,):
        raise ValueError(f"selection_bias must have one entry per expert, shape ({n_experts},), got "
                         f"{tuple(selection_bias.shape)}")
    if order == "softmax_then_topk":
        probs = F.softmax(router_logits.float(), dim=-1)  # (N, E)
        weights, experts = _top_k(probs, top_k, selection_bias)  # each (N, top_k)
        if renormalize:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights, experts
    if order == "topk_then_softmax":
        logits, experts = _top_k(router_logits.float(), top_k, selection_bias)  # each (N, top_k)
        return F.softmax(logits, dim=-1), experts
    raise ValueError(f"unknown routing order {order!r}; expected 'softmax_then_topk' or 'topk_then_softmax'")


def _top_k(scores: torch.Tensor, top_k: int, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The `top_k` largest scores (N, E) and their experts, each (N, top_k); chosen on scores + bias if any."""
    if bias is None:
        return scores.topk(top_k, dim=-1)
    experts = (scores + bias.to(scores)).topk(top_k, dim=-1).indices  # (N, top_k): the bias only chooses
    return scores.gather(-1, experts), experts


class MoE(nn.Module):
    """A sparse MLP: y = sum over the token's top-k experts e of w_e SwiGLU_e(x) (+ a shared SwiGLU(x)).

    `forward` returns the output (B, T, C) and the router logits (B T, E), which the load-balancing loss needs.
    `shared_d_ff` > 0 adds DeepSeek's shared expert, which every token goes through with weight 1.
    `capacity_factor` caps each expert at ceil(factor N top_k / E) tokens of the N in a call; the tokens past the
    cap (in token order) are dropped from that expert, and `dropped` counts the (token, expert) pairs dropped.
    `selection_bias`, None or (E,), is added to the router's probabilities only to choose the experts
    (`top_k_routing`): DeepSeek-V3 moves it after each step to balance the load without an auxiliary loss.
    """

    def __init__(self, d_model: int, d_ff: int, n_experts: int, top_k: int, order: Routing = "softmax_then_topk",
                 renormalize: bool = True, shared_d_ff: int = 0, capacity_factor: float | None = None) -> None:
        super().__init__()
        if not 1 <= top_k <= n_experts:
            raise ValueError(f"top_k must be between 1 and n_experts = {n_experts}, got {top_k}")
        if capacity_factor is not None and not capacity_factor > 0:
            raise ValueError(f"capacity_factor must be > 0 or None, got {capacity_factor!r}")
        self.top_k, self.order, self.renormalize = top_k, order, renormalize
        self.capacity_factor, self.dropped = capacity_factor, 0
        self.selection_bias: torch.Tensor | None = None  # (E,): set and updated by a balancing rule, never trained
        self.router = nn.Linear(d_model, n_experts, bias=False)
        self.experts = nn.ModuleList(SwiGLU(d_model, d_ff) for _ in range(n_experts))
        self.shared_expert = SwiGLU(d_model, shared_d_ff) if shared_d_ff > 0 else None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        B, T, C = x.shape
        tokens = x.reshape(B * T, C)  # (N, C), N = B T
        router_logits = self.router(tokens)  # (N, E)
        weights, chosen = top_k_routing(router_logits, self.top_k, self.order, self.renormalize,
                                        self.selection_bias)  # each (N, top_k)
        out = torch.zeros_like(tokens)  # (N, C)
        capacity = self.capacity(B * T)
        self.dropped = 0
        for e, expert in enumerate(self.experts):
            token, slot = (chosen == e).nonzero(as_tuple=True)  # each (N_e,): which tokens, in which top-k slot
            if capacity is not None and token.numel() > capacity:
                self.dropped += token.numel() - capacity
                token, slot = token[:capacity], slot[:capacity]  # the first tokens in order fill the expert
            if token.numel() == 0:
                continue
            y = expert(tokens.index_select(0, token))  # (N_e, C): this expert's tokens only
            out.index_add_(0, token, y * weights[token, slot, None].to(y.dtype))  # (N_e, C) added to their rows
        if self.shared_expert is not None:
            out = out + self.shared_expert(tokens)  # (N, C)
        return out.reshape(B, T, C), router_logits  # (B, T, C), (N, E)

    def capacity(self, n_tokens: int) -> int | None:
        """The most tokens one expert takes from a call with `n_tokens` tokens: ceil(factor N k / E), or None."""
        if self.capacity_factor is None:
            return None
        return math.ceil(self.capacity_factor * n_tokens * self.top_k / len(self.experts))
