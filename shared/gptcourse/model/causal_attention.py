"""Causal self-attention: the mask, one head, many heads (which can read and extend a KV cache).

Many heads may share keys and values: grouped-query attention (GQA) keeps H_kv key/value heads for H query heads,
each serving a group of H / H_kv consecutive query heads (`repeat_kv`); multi-query attention is H_kv = 1.

Two paths compute the same thing:
- `attention` is explicit (scores -> mask -> softmax -> weighted sum) and can return the weights for plots;
- `fused_attention` calls `torch.nn.functional.scaled_dot_product_attention`, which never materialises the
  (T, T) weights and is the default.
Neither takes a switch that turns causality off: a decoder never looks ahead. Both take an optional boolean
`mask` (from `padding_mask`, for batches of sequences padded to one length) that replaces the causal mask.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .kv_cache import LayerCache
from .positions import Rope, apply_rope


def causal_mask(t_q: int, t_k: int | None = None, device: torch.device | str | None = None) -> torch.Tensor:
    """Boolean (t_q, t_k) mask, True where query i may attend to key j.

    Queries are the *last* t_q positions of the t_k keys (as when a KV cache holds earlier keys), so query i
    sits at absolute position i + t_k - t_q and sees keys j <= that position: lower-triangular when t_q == t_k.
    """
    t_k = t_q if t_k is None else t_k
    if t_q > t_k:
        raise ValueError(f"more queries than keys: t_q={t_q} > t_k={t_k}")
    return torch.ones(t_q, t_k, dtype=torch.bool, device=device).tril(diagonal=t_k - t_q)


def padding_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) with 1 for real tokens and 0 for pads -> boolean (B, 1, T, T), True where query i may attend to key j.

    Causal, and no query sees a pad key, so pads never influence real tokens, whether the batch is padded on the
    left or the right. A pad still attends to itself, so that no row is empty (a softmax over nothing but -inf is
    NaN, which would reach the gradients); what a pad position computes is never read.
    """
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must have shape (B, T), got {tuple(attention_mask.shape)}")
    t = attention_mask.size(1)
    real_key = attention_mask.bool()[:, None, None, :]  # (B, 1, 1, T): broadcast over heads and queries
    itself = torch.eye(t, dtype=torch.bool, device=attention_mask.device)  # (T, T)
    return causal_mask(t, device=attention_mask.device) & (real_key | itself)  # (B, 1, T, T)


def attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Explicit causal scaled dot-product attention on (..., T, D) tensors; returns (output, weights)."""
    d_head = q.size(-1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)  # (..., T_q, T_k)
    if mask is None:
        mask = causal_mask(q.size(-2), k.size(-2), device=q.device)
    scores = scores.masked_fill(~mask, float("-inf"))  # exp(-inf) = 0: no weight on the future
    weights = scores.softmax(dim=-1)  # each row sums to 1 over the keys
    return weights @ v, weights  # (..., T_q, D), (..., T_q, T_k)


def fused_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """The same computation through PyTorch's fused kernel, without the (T_q, T_k) weights.

    k and v may have fewer heads than q (grouped-query attention, H_kv dividing H) and are never repeated here: a
    decode step reshapes the queries into groups instead, and the other paths pass `enable_gqa`, where whether the
    kernel copies k and v depends on the backend PyTorch picks.
    """
    grouped = q.size(-3) != k.size(-3)  # (B, H, T_q, D) queries against (B, H_kv, T_k, D) keys
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=grouped)
    t_q, t_k = q.size(-2), k.size(-2)
    if t_q == t_k:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=grouped)
    if t_q == 1:  # generating with a KV cache: the newest position sees every cached key, nothing to mask
        if grouped:  # the H / H_kv query heads of a group become rows of one query against their kv head
            b, h, _, d = q.shape
            y = F.scaled_dot_product_attention(q.reshape(b, k.size(-3), -1, d), k, v)  # (B, H_kv, H / H_kv, D)
            return y.reshape(b, h, 1, d)  # (B, H, 1, D)
        return F.scaled_dot_product_attention(q, k, v)
    # is_causal aligns the mask top-left; with cached keys the queries are the last rows, so pass it explicitly.
    return F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask(t_q, t_k, device=q.device),
                                          enable_gqa=grouped)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, H_kv, T, D) -> (B, H_kv * n_rep, T, D): each key/value head repeated for the n_rep query heads of its
    group, kv head j serving query heads j * n_rep ... j * n_rep + n_rep - 1 (Hugging Face's order)."""
    if n_rep == 1:
        return x  # plain multi-head attention: nothing to share, nothing to copy
    return x.repeat_interleave(n_rep, dim=-3)  # (B, H_kv, T, D) -> (B, H, T, D)


class AttentionHead(nn.Module):
    """One causal attention head: project x to q, k, v of width D, then attend."""

    def __init__(self, d_model: int, d_head: int, bias: bool = True) -> None:
        super().__init__()
        self.query = nn.Linear(d_model, d_head, bias=bias)
        self.key = nn.Linear(d_model, d_head, bias=bias)
        self.value = nn.Linear(d_model, d_head, bias=bias)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> output (B, T, D) and attention weights (B, T, T)."""
        return attention(self.query(x), self.key(x), self.value(x))


class MultiHeadAttention(nn.Module):
    """H causal heads computed together from one fused q/k/v projection, then merged and projected.

    With `n_kv_heads` below `n_heads` (grouped-query attention) k and v have H_kv heads: the projection and the
    KV cache shrink by H / H_kv, and each kv head is repeated for its group of query heads before attending.
    """

    def __init__(self, d_model: int, n_heads: int, bias: bool = True, fused: bool = True,
                 n_kv_heads: int | None = None) -> None:
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if n_kv_heads < 1 or n_heads % n_kv_heads:
            raise ValueError(f"n_kv_heads={n_kv_heads} must divide n_heads={n_heads}: each key/value head serves "
                             f"an equal group of query heads")
        self.n_heads, self.n_kv_heads, self.d_head = n_heads, n_kv_heads, d_model // n_heads
        self.fused = fused
        kv_width = n_kv_heads * self.d_head  # H_kv D
        self.qkv = nn.Linear(d_model, d_model + 2 * kv_width, bias=bias)  # rows: W_q, then W_k, then W_v
        self.out = nn.Linear(d_model, d_model, bias=bias)

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        return x.view(b, t, -1, self.d_head).transpose(1, 2)  # (B, T, H D) -> (B, H, T, D); H_kv heads for k, v

    @staticmethod
    def merge_heads(x: torch.Tensor) -> torch.Tensor:
        b, h, t, d = x.shape
        return x.transpose(1, 2).reshape(b, t, h * d)  # (B, H, T, D) -> (B, T, C)

    def heads(self, x: torch.Tensor, rope: Rope | None = None,
              cache: LayerCache | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, T, C) -> q (B, H, T, D) and k, v (B, H_kv, T_k, D): projected, split, rotated, and (with a cache)
        appended to the keys and values before them."""
        kv_width = self.n_kv_heads * self.d_head
        q, k, v = self.qkv(x).split([x.size(-1), kv_width, kv_width], dim=-1)  # (B, T, C), 2 x (B, T, H_kv D)
        q, k, v = self.split_heads(q), self.split_heads(k), self.split_heads(v)  # (B, H, T, D), 2 x (B, H_kv, T, D)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H_kv, T_past + T, D): the cache holds only the kv heads
        return q, k, v

    def forward(self, x: torch.Tensor, rope: Rope | None = None, cache: LayerCache | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C) -> (B, T, C). `mask`: see `padding_mask`; the weights themselves: `weights`."""
        q, k, v = self.heads(x, rope, cache)
        if self.fused:
            y = fused_attention(q, k, v, mask)  # the kv heads go in unrepeated (see fused_attention)
        else:
            n_rep = self.n_heads // self.n_kv_heads
            y, _ = attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)  # k, v as (B, H, T_k, D)
        return self.out(self.merge_heads(y))  # (B, H, T, D) -> (B, T, C)

    def weights(self, x: torch.Tensor, rope: Rope | None = None,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, T, C) -> the (B, H, T, T) attention weights that `forward` mixes the values with: to look at them
        (the fused kernel never forms them)."""
        q, k, v = self.heads(x, rope)
        n_rep = self.n_heads // self.n_kv_heads
        return attention(q, repeat_kv(k, n_rep), repeat_kv(v, n_rep), mask)[1]  # (B, H, T, T)
