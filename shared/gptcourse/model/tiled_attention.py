"""Attention computed tile by tile (FlashAttention, in plain PyTorch): the (T, T) scores are never held at once.

The keys are read in blocks. For each block of queries, `online_softmax` folds the keys in one block at a time
into a running state: the row's largest score so far m, the softmax's denominator so far (a sum of exp(s - m)),
and the unnormalised output o (a sum of exp(s - m) v). When a later block raises the maximum, the old sum and o are
rescaled by exp(m_old - m_new), so the end result is the exact softmax, whatever the split. Dividing o by the sum
once, at the end, gives the output; m + log(sum), the row's log-sum-exp L, is all the backward needs to recompute any
tile's probabilities, exp(s - L), so nothing of size (T, T) is saved either.

Tiles that a mask would zero entirely are skipped, not masked: with causality, those above the diagonal; with a
sliding window of W keys, also those wholly before it (`computed_tiles`). Keys and values may have fewer heads
than the queries (grouped-query attention): each kv head serves its H / H_kv query heads, and k and v are never
repeated as whole tensors (matmul's broadcast copies each tile for the group).
A padding mask (B, T) (1 real, 0 pad) works as `padding_mask` does: no query sees a pad key, a pad sees itself.
Whatever the inputs' dtype, each tile is computed, and m, the denominator, o, L and the gradients' sums are kept,
in float32 at least (bfloat16 inputs are read a tile at a time and upcast); the output and gradients are cast back.
"""

from __future__ import annotations

import math
from itertools import groupby
from typing import Any

import torch

Tile = tuple[int, int, int, int]  # query rows q0:q1 and key columns k0:k1


def online_softmax(m: torch.Tensor, denom: torch.Tensor, o: torch.Tensor, scores: torch.Tensor,
                   v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Fold one block of keys into the running state of each query row.

    m, denom (..., T_q): the largest score so far and sum(exp(s - m)), the softmax's denominator; o (..., T_q, D):
    sum(exp(s - m) v), not yet divided by it. scores (..., T_q, T_blk) (-inf where masked) and v (..., T_blk, D)
    are the block's. Start from m = -inf, denom = 0, o = 0; after the last block, o / denom is
    softmax(scores) @ v and m + log(denom) the log-sum-exp.
    """
    m_new = torch.maximum(m, scores.amax(dim=-1))  # (..., T_q)
    shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)  # a row masked so far stays at 0
    rescale = torch.exp(m - shift)  # (..., T_q): the old terms were relative to m, now to m_new
    p = torch.exp(scores - shift[..., None])  # (..., T_q, T_blk), 0 where masked
    return m_new, rescale * denom + p.sum(dim=-1), rescale[..., None] * o + p @ v


def computed_tiles(t_q: int, t_k: int, block_q: int, block_k: int, causal: bool = True,
                   window: int | None = None) -> list[Tile]:
    """The (q0, q1, k0, k1) tiles a mask leaves something in, row-block by row-block.

    Query i sits at position i + t_k - t_q (the last t_q of t_k positions, as in `causal_mask`); causally it sees
    keys j <= that position, and with a window only the W latest of them, j > position - W. A tile whose first key
    comes after its last query's position, or whose last key is before its first query's window, is skipped.
    """
    offset = t_k - t_q
    tiles = []
    for q0 in range(0, t_q, block_q):
        q1 = min(q0 + block_q, t_q)
        for k0 in range(0, t_k, block_k):
            k1 = min(k0 + block_k, t_k)
            if causal and k0 > q1 - 1 + offset:
                break  # this tile and every later one in the row-block are in the future
            if window is not None and k1 - 1 <= q0 + offset - window:
                continue  # wholly before the window of the first query, so of every query in the block
            tiles.append((q0, q1, k0, k1))
    return tiles


def _allowed(tile: Tile, offset: int, causal: bool, window: int | None,
             attention_mask: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """Boolean mask of one tile, broadcastable to (B, H_kv, G, q1 - q0, k1 - k0); None where all is allowed."""
    q0, q1, k0, k1 = tile
    position = torch.arange(q0, q1, device=device)[:, None] + offset  # (Tq_blk, 1): each query's position
    key = torch.arange(k0, k1, device=device)[None, :]  # (1, Tk_blk)
    allowed = None
    if causal and k1 - 1 > q0 + offset:  # some key is after some query
        allowed = key <= position
    if window is not None and k0 <= q1 - 1 + offset - window:  # some key is outside some query's window
        inside = key > position - window
        allowed = inside if allowed is None else allowed & inside
    if attention_mask is not None:
        real = attention_mask[:, k0:k1].bool()[:, None, None, None, :] | (key == position)  # (B, 1, 1, Tq, Tk)
        allowed = real if allowed is None else allowed & real
    return allowed


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, block_q: int, block_k: int, causal: bool,
           window: int | None, attention_mask: torch.Tensor | None) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be (B, H, T, D) tensors, got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
                         f"{tuple(v.shape)}")
    (b, h, t_q, d), (b_k, h_kv, t_k, d_k) = q.shape, k.shape
    if (b_k, d_k) != (b, d) or v.shape[:3] != k.shape[:3]:
        raise ValueError(f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}: the batch and head width "
                         "must agree, and k and v must have the same heads and positions")
    if h_kv < 1 or h % h_kv:
        raise ValueError(f"q has {h} heads and k, v have {h_kv}: H_kv must divide H (grouped-query attention)")
    if not (isinstance(block_q, int) and isinstance(block_k, int)) or block_q < 1 or block_k < 1:
        raise ValueError(f"block_q and block_k must be positive ints, got {block_q!r} and {block_k!r}")
    if causal and t_q > t_k:
        raise ValueError(f"more queries than keys: t_q={t_q} > t_k={t_k}")
    if window is not None and (not causal or not isinstance(window, int) or window < 1):
        raise ValueError(f"window={window!r}: a sliding window is a positive int of keys, and needs causal=True")
    if attention_mask is not None and (tuple(attention_mask.shape) != (b, t_k) or t_q != t_k):
        raise ValueError(f"attention_mask must have shape (B, T) = ({b}, {t_k}) and q as many positions as k, "
                         f"got {tuple(attention_mask.shape)} with t_q={t_q}")


def _accumulator(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the running state, L and the gradients' sums: float32 for bfloat16 or float16 inputs (as GPU
    kernels keep them: rounding m, the denominator or L to 8 bits of mantissa would cost the backward's P most of
    its precision), float64 for float64."""
    return torch.promote_types(dtype, torch.float32)


def _grouped(x: torch.Tensor, h_kv: int) -> torch.Tensor:
    """x (B, H, T, D) -> (B, H_kv, G, T, D): the G = H / H_kv query heads that share a kv head side by side."""
    b, h, t, d = x.shape
    return x.reshape(b, h_kv, h // h_kv, t, d)


def flash_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_q: int = 64,
                  block_k: int = 64, scale: float | None = None, window: int | None = None,
                  attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The tiled forward: q (B, H, T_q, D), k, v (B, H_kv, T_k, D) -> output (B, H, T_q, D) in q's dtype and the
    log-sum-exp L (B, H, T_q) of each query's scores, in float32 at least. At most one (block_q, block_k) tile of
    scores exists at a time."""
    _check(q, k, v, block_q, block_k, causal, window, attention_mask)
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    acc = _accumulator(q.dtype)
    qg = _grouped(q, k.size(1))  # (B, H_kv, G, T_q, D)
    kg, vg = k[:, :, None], v[:, :, None]  # (B, H_kv, 1, T_k, D): shared by the G query heads
    out = torch.empty_like(qg)  # (B, H_kv, G, T_q, D), in the input's dtype
    lse = qg.new_empty(qg.shape[:-1], dtype=acc)  # (B, H_kv, G, T_q)
    offset = k.size(2) - q.size(2)
    for (q0, q1), row in groupby(computed_tiles(q.size(2), k.size(2), block_q, block_k, causal, window),
                                 key=lambda tile: tile[:2]):
        qt = qg[..., q0:q1, :].to(acc)  # (B, H_kv, G, Tq_blk, D)
        m = qt.new_full(qt.shape[:-1], float("-inf"))  # (B, H_kv, G, Tq_blk)
        denom, o = torch.zeros_like(m), torch.zeros_like(qt)
        for tile in row:
            k0, k1 = tile[2:]
            scores = qt @ kg[..., k0:k1, :].to(acc).transpose(-2, -1) * scale  # (B, H_kv, G, Tq_blk, Tk_blk)
            allowed = _allowed(tile, offset, causal, window, attention_mask, q.device)
            if allowed is not None:
                scores = scores.masked_fill(~allowed, float("-inf"))
            m, denom, o = online_softmax(m, denom, o, scores, vg[..., k0:k1, :].to(acc))
        out[..., q0:q1, :] = o / denom[..., None]  # divided once, at the end (each row has a key: itself); cast back
        lse[..., q0:q1] = m + torch.log(denom)
    return out.reshape(q.shape), lse.reshape(q.shape[:3])


def flash_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                   grad_out: torch.Tensor, causal: bool = True, block_q: int = 64, block_k: int = 64,
                   scale: float | None = None, window: int | None = None,
                   attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv from the inputs, the output, its log-sum-exp L and the output's gradient, tile by tile.

    Each tile's probabilities are recomputed, p = exp(s - L); with dp = dO v^T, the softmax's backward is
    ds = p * (dp - rowsum(dO * O)), then dq += ds k, dk += ds^T q (both times the scale) and dv += p^T dO.
    """
    scale = 1 / math.sqrt(q.size(-1)) if scale is None else scale
    acc = _accumulator(q.dtype)
    qg, dog = _grouped(q, k.size(1)), _grouped(grad_out, k.size(1))  # (B, H_kv, G, T_q, D)
    lseg = lse.to(acc).reshape(*qg.shape[:-1], 1)  # (B, H_kv, G, T_q, 1)
    delta = (dog.to(acc) * _grouped(out, k.size(1)).to(acc)).sum(dim=-1, keepdim=True)  # (.., T_q, 1): rowsum(dO O)
    kg, vg = k[:, :, None], v[:, :, None]  # (B, H_kv, 1, T_k, D)
    dq = torch.zeros_like(qg, dtype=acc)  # (B, H_kv, G, T_q, D): the sums are kept in float32 at least
    dk, dv = torch.zeros_like(kg, dtype=acc), torch.zeros_like(vg, dtype=acc)  # (B, H_kv, 1, T_k, D)
    offset = k.size(2) - q.size(2)
    for tile in computed_tiles(q.size(2), k.size(2), block_q, block_k, causal, window):
        q0, q1, k0, k1 = tile
        qt, kt, vt, dot = (x.to(acc) for x in (qg[..., q0:q1, :], kg[..., k0:k1, :], vg[..., k0:k1, :],
                                               dog[..., q0:q1, :]))
        p = torch.exp(qt @ kt.transpose(-2, -1) * scale - lseg[..., q0:q1, :])  # (B, H_kv, G, Tq_blk, Tk_blk)
        allowed = _allowed(tile, offset, causal, window, attention_mask, q.device)
        if allowed is not None:
            p = p.masked_fill(~allowed, 0.0)
        ds = p * (dot @ vt.transpose(-2, -1) - delta[..., q0:q1, :])  # (B, H_kv, G, Tq_blk, Tk_blk)
        dq[..., q0:q1, :] += ds @ kt * scale
        dk[..., k0:k1, :] += (ds.transpose(-2, -1) @ qt * scale).sum(dim=2, keepdim=True)  # the G heads' sum
        dv[..., k0:k1, :] += (p.transpose(-2, -1) @ dot).sum(dim=2, keepdim=True)
    return dq.reshape(q.shape).to(q.dtype), dk.reshape(k.shape).to(k.dtype), dv.reshape(v.shape).to(v.dtype)


class FlashAttention(torch.autograd.Function):
    """`flash_forward` with `flash_backward` as its gradient: saves q, k, v, the output and L (B, H, T), never
    the (T, T) probabilities, and recomputes them tile by tile in the backward."""

    @staticmethod
    def forward(ctx: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_q: int,
                block_k: int, scale: float | None, window: int | None,
                attention_mask: torch.Tensor | None) -> torch.Tensor:
        out, lse = flash_forward(q, k, v, causal, block_q, block_k, scale, window, attention_mask)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.options = (causal, block_q, block_k, scale, window, attention_mask)
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = flash_backward(q, k, v, out, lse, grad_out, *ctx.options)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = True, block_q: int = 64,
                    block_k: int = 64, scale: float | None = None, window: int | None = None,
                    attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """softmax(q k^T * scale, masked) v on q (B, H, T_q, D), k, v (B, H_kv, T_k, D) -> (B, H, T_q, D), tile by
    tile, differentiable (through `FlashAttention`). `window`: each query sees its W latest keys (itself
    included); `attention_mask` (B, T): 1 real, 0 pad, as for `padding_mask`."""
    return FlashAttention.apply(q, k, v, causal, block_q, block_k, scale, window, attention_mask)
