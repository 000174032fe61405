"""The attention-and-heads mistakes that labs 02, 03, 11 and 12 recognise, each worded once.

`attend_by_hand` is a right causal attention written by hand whose switches give each known mistake (as lab 11's
`_nucleus` does for top-p); `ROWS` is the catalogue, {why: switches}, which a piece lists whole or in part and
`wrong_attentions` turns into lazy rows (computed only when an answer is wrong: `checks.Mistakes`). Labs whose
attention is written another way (lab 12's tiles, lab 11's cache fed in chunks) keep their own by-hand version
and switches, and take the words from here.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from functools import partial
from typing import Any

import torch

from ..checks import Mistake

NO_SCALE = Mistake("attention.unscaled",
                   "the 1/sqrt(D) scaling is missing: divide the scores q k^T by sqrt(D) before the softmax")
SCALED_BY_D = Mistake("attention.scaled_by_d",
                      "the scores were divided by D, not sqrt(D) (or by sqrt(D) twice: q scaled and then its scores "
                      "again): scale the scores once, by 1 / math.sqrt(D)")
SOFTMAX_OVER_QUERIES = Mistake("attention.softmax_dim",
                               "softmax over the wrong axis, the queries' (dim=-2): each query's weights must sum to "
                               "1 over the keys, softmax(dim=-1)")
MASK_AFTER_SOFTMAX = Mistake("attention.mask_after",
                             "the mask is applied after the softmax: set future scores to -inf *before* it, so each "
                             "row still sums to 1")
KEYS_FOR_QUERIES = Mistake("attention.swapped",
                           "q and k are swapped: the scores are k q^T, the transpose of q k^T, whose row i holds "
                           "query i's dot products with the keys, q_i . k_j")
NOT_CAUSAL = Mistake("attention.not_causal",
                     "the attention is not causal: every position attends to later ones too. Mask the scores above "
                     "the diagonal, -inf where key j comes after query i (F.scaled_dot_product_attention masks "
                     "nothing unless told: is_causal=True or an attn_mask)")
TOP_LEFT = Mistake("attention.top_left",
                   "the causal mask is aligned top-left, so the new queries see only the first keys: with keys from "
                   "the cache the T new queries are the *last* T of T_k positions (a single new token sees all T_k), "
                   "so the mask is tril(ones(T, T_k), diagonal=T_k - T); is_causal=True and tril(ones(T, T_k)) align "
                   "it top-left")
TILED_KV_HEADS = Mistake("attention.tiled_kv_heads",
                         "the kv heads are tiled (x.repeat(1, G, 1, 1) gives kv heads 0, 1, 0, 1, ...), not repeated "
                         "in place (repeat_interleave: 0, 0, 1, 1, ...): query head i shares kv head i // G, G = H / "
                         "H_kv (repeat_kv's n_rep), so repeat each kv head in place, x.repeat_interleave(G, dim=1)")


def by_model_width(c: int, d: int) -> Mistake:
    """The message for scores divided by sqrt(C), the model's width, where a head's is D."""
    return Mistake("attention.scaled_by_c", f"the scores are divided by sqrt(C) = sqrt({c}), the model's width: "
                   f"divide by sqrt(D) = sqrt({d}), the width of q and k (d_head)")


# the catalogue: why -> the switches of `attend_by_hand` that make that mistake
ROWS: dict[str, dict[str, Any]] = {
    NO_SCALE: {"divide_by": "1"},
    SCALED_BY_D: {"divide_by": "D"},
    SOFTMAX_OVER_QUERIES: {"softmax_dim": -2},
    MASK_AFTER_SOFTMAX: {"mask_after": True},
    KEYS_FOR_QUERIES: {"swapped": True},
    NOT_CAUSAL: {"causal": False},
    TOP_LEFT: {"top_left": True},
    TILED_KV_HEADS: {"tiled": True},
}


_DIVISORS: dict[str, Callable[[int], float]] = {"sqrt(D)": math.sqrt, "D": float, "1": lambda d: 1.0}


def kv_heads_by_hand(x: torch.Tensor, n_rep: int, *, tiled: bool = False) -> torch.Tensor:
    """k or v (B, H_kv, T, D) -> (B, H_kv * n_rep, T, D): query head i reads kv head i // n_rep; `tiled`, the
    mistake, kv head i % H_kv."""
    return x.repeat(1, n_rep, 1, 1) if tiled else x.repeat_interleave(n_rep, dim=1)


def attend_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, divide_by: str | float = "sqrt(D)",
                   softmax_dim: int = -1, causal: bool = True, top_left: bool = False, mask_after: bool = False,
                   swapped: bool = False, tiled: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(output (..., T_q, D), weights (..., T_q, T_k)) of causal attention of q (..., [H,] T_q, D) over k, v
    (..., [H_kv,] T_k, D), written by hand: query i is position T_k - T_q + i (the last T_q of T_k, as with keys
    from a cache), H_kv kv heads each serve H / H_kv consecutive query heads. Right with no switch; each switch is
    a mistake of `ROWS`: the scores divided by "1" or "D" (or a number) instead of "sqrt(D)", a softmax over
    `softmax_dim`, no mask, a mask aligned `top_left`, the mask applied after the softmax, q and k `swapped`, the kv
    heads `tiled`."""
    (t_q, d), t_k = q.shape[-2:], k.size(-2)
    if k.dim() >= 4 and k.size(-3) != q.size(-3):
        k, v = (kv_heads_by_hand(z, q.size(-3) // z.size(-3), tiled=tiled) for z in (k, v))  # (..., H, T_k, D)
    scores = k @ q.transpose(-2, -1) if swapped else q @ k.transpose(-2, -1)  # (..., T_q, T_k)
    scores = scores / (_DIVISORS[divide_by](d) if isinstance(divide_by, str) else divide_by)
    offset = 0 if top_left else t_k - t_q
    allowed = torch.arange(t_k)[None, :] <= torch.arange(t_q)[:, None] + offset  # (T_q, T_k), True = may attend
    if not causal:
        weights = scores.softmax(softmax_dim)
    elif mask_after:
        weights = scores.softmax(-1).masked_fill(~allowed, 0.0)
    else:
        weights = scores.masked_fill(~allowed, float("-inf")).softmax(softmax_dim)
    return weights @ v, weights


def wrong_attentions(output: Callable[..., torch.Tensor], rows: Mapping[str, Mapping[str, Any]],
                     **given: Any) -> dict[str, Callable[[], torch.Tensor]]:
    """{why: a function computing what that mistake gives}: `output(**given, **switches)` for each row, called
    only when asked (`checks.check_known_mistakes` asks for a wrong answer, in order, until one matches)."""
    return {why: partial(output, **given, **switches) for why, switches in rows.items()}


def rows(*whys: str) -> dict[str, dict[str, Any]]:
    """The catalogue's rows for `whys`, in that order."""
    return {why: ROWS[why] for why in whys}
