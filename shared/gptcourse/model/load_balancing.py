"""Auxiliary losses that keep a mixture of experts' router healthy: load balancing (Switch Transformer, Mixtral)
and the router z-loss (ST-MoE)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch.nn import functional as F


def _rows_and_mask(router_logits: torch.Tensor | Sequence[torch.Tensor],
                   attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """All layers' logits as one (L N, E) tensor, and each row's weight (L N,): 1 for a real token, 0 for padding."""
    layers = [router_logits] if isinstance(router_logits, torch.Tensor) else list(router_logits)
    if not layers:
        raise ValueError("router_logits is empty: expected a (B T, E) tensor or one per layer")
    n = layers[0].shape[0]
    if any(layer.dim() != 2 or layer.shape[0] != n for layer in layers):
        raise ValueError(f"every layer's router logits must be (B T, E) with the same B T; got "
                         f"{[tuple(layer.shape) for layer in layers]}")
    if attention_mask is None:
        mask = torch.ones(n, device=layers[0].device)
    elif attention_mask.numel() != n:
        raise ValueError(f"attention_mask has {attention_mask.numel()} entries {tuple(attention_mask.shape)}, but "
                         f"the router logits have B T = {n} rows: expected a (B, T) mask of the same batch")
    else:
        mask = attention_mask.reshape(n).float()  # (N,)
    return torch.cat(layers), mask.repeat(len(layers))  # (L N, E), (L N,)


def load_balancing_loss(router_logits: torch.Tensor | Sequence[torch.Tensor], n_experts: int, top_k: int,
                        attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """E * sum_e f_e P_e, where f_e is the share of (real) tokens routed to expert e among their top k (the shares
    sum to k) and P_e the mean router probability of e: k at perfect balance, E k when one expert takes it all.

    `router_logits` is (B T, E) or a sequence of them, one per layer (pooled, as transformers does);
    `attention_mask` (B, T) leaves out the padding.
    """
    logits, mask = _rows_and_mask(router_logits, attention_mask)  # (L N, E), (L N,)
    if logits.shape[-1] != n_experts:
        raise ValueError(f"router logits have {logits.shape[-1]} experts in their last dimension, n_experts is "
                         f"{n_experts}")
    if not 1 <= top_k <= n_experts:
        raise ValueError(f"top_k must be between 1 and n_experts = {n_experts}, got {top_k}")
    probs = F.softmax(logits.float(), dim=-1)  # (L N, E)
    routed = F.one_hot(probs.topk(top_k, dim=-1).indices, n_experts).sum(dim=1).float()  # (L N, E): 1 if chosen
    real = mask.sum()
    tokens_share = (routed * mask[:, None]).sum(dim=0) / real  # (E,) f_e
    mean_prob = (probs * mask[:, None]).sum(dim=0) / real  # (E,) P_e
    return n_experts * (tokens_share * mean_prob).sum()


def router_z_loss(router_logits: torch.Tensor | Sequence[torch.Tensor],
                  attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """The mean over (real) tokens of logsumexp(router logits)^2: it keeps the logits small, so the router's
    softmax stays out of float round-off (ST-MoE, Zoph et al. 2022)."""
    logits, mask = _rows_and_mask(router_logits, attention_mask)  # (L N, E), (L N,)
    log_z = torch.logsumexp(logits.float(), dim=-1)  # (L N,)
    return (log_z.square() * mask).sum() / mask.sum()
