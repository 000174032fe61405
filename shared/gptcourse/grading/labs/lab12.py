"""Lab 12, FlashAttention in PyTorch: `online_softmax(m, denom, o, scores, v)`, `flash_forward(q, k, v, causal,
block_q, block_k, on_tile=None)`, `flash_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k)` and the
class `FlashAttention(torch.autograd.Function)`, called as `FlashAttention.apply(q, k, v, causal, block_q,
block_k)`.

q is (B, H, T, D); k and v are (B, H_kv, T, D) with H_kv dividing H (grouped-query attention, visible too).
What makes these pieces FlashAttention is invisible in their outputs, so the kernel measures it while the student's
code runs (`_Work`, a dispatch mode): no tensor of (T, T) scores is made, the matrix products do no more
multiply-adds than the tiles a causal mask leaves something in (2 products per tile forward, 5 backward), and the
class keeps for the backward no more than q, k, v, the output and L, saved or on `ctx`. The forward also calls
`on_tile(q0, k0)` for every tile it computes. The references are gptcourse's `online_softmax`, `flash_forward` and
`flash_backward` (the forward behind an adapter that reports its tiles) and `flash_attention` for the class
(`expected`: the student's class is called through `apply`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch
from torch.utils._pytree import tree_leaves

from ...checks import Mistake, check_close, check_shape, fail, fmt_shape
from ...model.causal_attention import causal_mask
from ...model.tiled_attention import computed_tiles, flash_attention, flash_backward, flash_forward, online_softmax
from ..attention_mistakes import NO_SCALE, SCALED_BY_D, TILED_KV_HEADS, kv_heads_by_hand
from ..cases import Inputs, Outputs, sizes_rng, tensor_rng
from ..fixtures import part_of
from ..piece import Piece, Probe, declare
from ..student import TensorsMade, as_tensor, as_tensors

_TILED = ("gptcourse.online_softmax", "gptcourse.flash_forward", "gptcourse.flash_backward",
          "gptcourse.FlashAttention", "gptcourse.flash_attention", "gptcourse.computed_tiles",
          "gptcourse.model.tiled_attention")
# torch's attention under each of its names: the CPU flash kernel returns (O, L), flash_forward's outputs
_ATTENTION = ("gptcourse.attention", "gptcourse.fused_attention", "gptcourse.MultiHeadAttention",
              "torch.nn.functional.scaled_dot_product_attention", "torch._scaled_dot_product_attention_math",
              "torch._scaled_dot_product_flash_attention_for_cpu", "torch._scaled_dot_product_flash_attention",
              "torch._scaled_dot_product_efficient_attention", "torch._scaled_dot_product_cudnn_attention",
              "torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward",
              "torch._native_multi_head_attention")
# Each piece forbids its own references and those of the pieces it calls (flash_forward calls the student's
# online_softmax, FlashAttention their flash_forward and flash_backward): a student who imports the reference
# flash_backward loses it and FlashAttention, not the merge. The module defines every piece's reference, so it is
# FlashAttention's alone, which forbids them all.
_MERGE = ("gptcourse.online_softmax",)
_FORWARD = ("gptcourse.flash_forward", "gptcourse.computed_tiles", *_MERGE, *_ATTENTION)
_BACKWARD = ("gptcourse.flash_backward", "gptcourse.computed_tiles", *_ATTENTION)
_FUNCTION = _TILED + _ATTENTION


def _sizes(b: int, h: int, h_kv: int, t: int, d: int) -> dict[str, int]:
    return {"B": b, "H": h, "H_kv": h_kv, "T": t, "D": d}


# ---- what the student's code made and did, measured in the kernel


_PRODUCTS = {"bmm": 0, "mm": 0, "mv": 0, "dot": 0, "baddbmm": 1, "addmm": 1}  # aten op -> its left factor


class _Work(TensorsMade):
    """TensorsMade that also adds up the multiply-adds of the matrix products (the tiles a loop computed, whatever
    it reports to on_tile), keeps the largest matrix a product returned (a tile, or a row of scores against every
    key) and the first tensor whose last two axes are (t, t) (the whole score matrix, or a mask as large)."""

    def __init__(self, t: int) -> None:
        super().__init__()
        self.t, self.multiply_adds, self.square, self.square_is_mask = t, 0, (), False
        self.widest_product: tuple[int, ...] = (0, 0)  # the largest (rows, columns) a matrix product returned

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = super().__torch_dispatch__(func, types, args, kwargs)
        left = _PRODUCTS.get(func.overloadpacket.__name__)
        if left is not None:
            self.multiply_adds += out.numel() * args[left].shape[-1]
            if out.dim() >= 2 and out.shape[-2] * out.shape[-1] > math.prod(self.widest_product):
                self.widest_product = tuple(out.shape[-2:])
        for x in tree_leaves(out):
            if not self.square and isinstance(x, torch.Tensor) and tuple(x.shape[-2:]) == (self.t, self.t):
                self.square, self.square_is_mask = tuple(x.shape), not x.is_floating_point()
        return out

    def outputs(self) -> Outputs:
        return {"multiply_adds": self.multiply_adds, "largest_made": max(map(math.prod, self.shapes), default=0),
                "square": torch.tensor(self.square, dtype=torch.long), "square_is_mask": self.square_is_mask,
                "widest_product": torch.tensor(self.widest_product, dtype=torch.long)}


def _measured(fn: Any, reference: Any, t: int) -> contextlib.AbstractContextManager[_Work]:
    """_Work around the student's code; around the reference's (in the grader) an idle one, whose totals (zeros)
    only give its outputs the same keys: they are never judged, and measuring costs most of a case's time."""
    return contextlib.nullcontext(_Work(t)) if fn is reference else _Work(t)


def _tile_area(inputs: Inputs, reach: int = 0) -> int:
    """The (query, key) pairs of the tiles a loop computes when it keeps a key tile while k0 < q1 + reach: reach 0
    is right (causal: up to the block's last query), 1 stops one tile late, T computes every tile."""
    t, block_q, block_k = inputs["q"].size(2), inputs["block_q"], inputs["block_k"]
    if reach == 0:
        return sum((q1 - q0) * (k1 - k0) for q0, q1, k0, k1 in computed_tiles(t, t, block_q, block_k,
                                                                                inputs["causal"]))
    return sum((min(q0 + block_q, t) - q0) * (min(k0 + block_k, t) - k0) for q0 in range(0, t, block_q)
               for k0 in range(0, t, block_k) if k0 < min(q0 + block_q, t) + reach)


def _check_memory(got: Outputs, inputs: Inputs, what: str) -> None:
    """No tensor of the whole (T, T) scores, nor one as large: only tiles, and (T, D) per head."""
    (b, h, t, d), block_q, block_k = inputs["q"].shape, inputs["block_q"], inputs["block_k"]
    if t <= d or t <= min(block_q, block_k):
        return  # here a tile or a (T, D) input is as large as (T, T): the sizes cannot tell
    square = tuple(got["square"].tolist())
    if square and got["square_is_mask"]:
        raise fail(f"{what} made a mask of shape {fmt_shape(square)}: a mask over the whole (T, T) score matrix "
                   "holds T^2 entries too. Build each straddling tile's mask from its positions, "
                   "torch.arange(k0, k1)[None, :] > torch.arange(q0, q1)[:, None]", mistake="12.forward_square_mask")
    if square or int(got["largest_made"]) >= b * h * t * t:
        made = f"a tensor of shape {fmt_shape(square)}" if square else \
            f"a tensor of {int(got['largest_made'])} numbers, B H T T = {b * h * t * t}"
        raise fail(f"{what} made {made}: the whole score matrix (or as much memory), which is what FlashAttention "
                   "never holds. Compute each tile's scores from its own slices, q[:, :, q0:q1] @ k[:, :, "
                   "k0:k1].transpose(-2, -1), not all of them at once and then slices of that: the largest tensor "
                   f"may be one (block_q, block_k) tile, or (T, D), per head ({b * h * max(block_q * block_k, t * d)}"
                   " numbers here)", mistake="12.forward_whole_scores")


def _check_tile_products(got: Outputs, inputs: Inputs, what: str) -> None:
    """No matrix product returns more than a tile of scores, (block_q, block_k), or one of (block, D)."""
    _, _, t, d = inputs["q"].shape
    block_q, block_k = min(inputs["block_q"], t), min(inputs["block_k"], t)
    rows, columns = got["widest_product"].tolist()
    if rows * columns > max(block_q * block_k, block_q * d, block_k * d):
        raise fail(f"{what}: a matrix product returned a ({rows}, {columns}) block, more than one tile of scores "
                   f"({block_q}, {block_k}) at a time: a block of queries against every key it sees, with an "
                   "ordinary softmax? Tile the keys too, one (block_q, block_k) tile of scores at a time, and fold "
                   "each into the running (m, denom, o) with online_softmax", mistake="12.forward_untiled_keys")


def _check_work(got: Outputs, inputs: Inputs, what: str, products: int, names: str,
                hint: str = "the output recomputed, or autograd run through plain attention?") -> None:
    """The matrix products did no more multiply-adds than `products` products of D per (query, key) pair of the
    tiles needed: a tile wholly above the diagonal, computed and masked, shows here."""
    (b, h, _, d), causal = inputs["q"].shape, inputs["causal"]
    per_pair = products * b * h * d
    done, need = int(got["multiply_adds"]), per_pair * _tile_area(inputs)
    if done <= need:
        return
    header = (f"{what}: its matrix products did {done} multiply-adds where the tiles it needs take {need} "
              f"({products} products per tile, {names})")
    t = inputs["q"].size(2)
    if causal and done == per_pair * _tile_area(inputs, reach=t):
        raise fail(f"{header}: it computed every tile, also those wholly above the diagonal, and masked them. "
                   "Skip them: stop the key loop once k0 > q1 - 1, the block's last query (q1 = min(q0 + block_q, "
                   "T)); only the tiles that straddle the diagonal need a mask",
                   mistake="12.forward_masked_future_tiles")
    if causal and done == per_pair * _tile_area(inputs, reach=1):
        raise fail(f"{header}: the key loop stops one tile late, at k0 > q1: the tile that starts at k0 = q1 is "
                   "wholly in the future (q1 - 1 is the block's last query). Stop once k0 > q1 - 1",
                   mistake="12.forward_key_loop_one_late")
    raise fail(f"{header}: it computes tiles or products it does not need ({hint})" + (
        "; with causal=True skip the tiles whose first key comes after the block's last query" if causal else ""))


# ---- online_softmax(m, denom, o, scores, v) -> (m, denom, o)


def _merge_inputs(b: int, t_q: int, seen: int, t_blk: int, d: int, seed: int, jump: float = 0.0) -> Inputs:
    """A state after `seen` earlier keys (none: m = -inf, denom = 0, o = 0) and the next block of t_blk keys;
    `jump` raises the block's scores, so that its maximum overtakes the running one."""
    gen = tensor_rng(seed)
    m, denom, o = torch.full((b, t_q), float("-inf")), torch.zeros(b, t_q), torch.zeros(b, t_q, d)
    if seen:
        m, denom, o = online_softmax(m, denom, o, 2 * torch.randn(b, t_q, seen, generator=gen),
                                     torch.randn(b, seen, d, generator=gen))
    scores = 2 * torch.randn(b, t_q, t_blk, generator=gen) + jump  # (B, T_q, T_blk)
    return {"m": m, "denom": denom, "o": o, "scores": scores, "v": torch.randn(b, t_blk, d, generator=gen),
            "sizes": {"B": b, "T_q": t_q, "D": d}}


def _merge_call(fn: Any, inputs: Inputs) -> Outputs:
    m, denom, o, scores, v = (inputs[key] for key in ("m", "denom", "o", "scores", "v"))
    what = (f"online_softmax(m {fmt_shape(m.shape)}, denom, o {fmt_shape(o.shape)}, scores "
            f"{fmt_shape(scores.shape)}, v {fmt_shape(v.shape)})")
    out = as_tensors(fn(m.clone(), denom.clone(), o.clone(), scores.clone(), v.clone()), ("m", "denom", "o"), what)
    return dict(zip(("m", "denom", "o"), out, strict=True))


RESCALE_O = (Mistake("12.rescale_o",
               "the running output o was not rescaled when the maximum moved: multiply the old o by exp(m_old - m_new) "
             "before adding this block's exp(s - m_new) @ v, or the earlier keys keep weights relative to the old max"))
RESCALE_DENOM = (Mistake("12.rescale_denom",
                    "the denominator was not rescaled when the maximum moved: denom_new = exp(m_old - m_new) * denom + "
                    "exp(scores - m_new).sum(-1)"))
KEEP_DENOM = (Mistake("12.keep_denom",
                    "the denominator was not updated: add this block's exp(scores - m_new).sum(-1) to the rescaled old "
                    "one"))
DIVIDE_EARLY = (Mistake("12.divide_early",
                   "o was divided by the denominator inside the merge: keep o unnormalised (a sum of exp(s - m) v) and "
                   "divide by the denominator once, after the last block"))

INVERTED = (Mistake("12.rescale_inverted",
              "the rescale is upside down: the old sums are multiplied by exp(m - m_new), at most 1, since m_new >= m; "
              "exp(m_new - m) inflates them instead"))
OWN_MAX = (Mistake("12.own_max",
                 "this block's exponentials were shifted by the block's own max, not by the new running max m_new: the "
                 "old sums are relative to m_new after the rescale, so p = exp(scores - m_new[..., None])"))


def _merge_parts(inputs: Inputs) -> dict[str, torch.Tensor]:
    m, denom, o, scores, v = (inputs[key] for key in ("m", "denom", "o", "scores", "v"))
    m_new = torch.maximum(m, scores.amax(dim=-1))
    rescale, p = torch.exp(m - m_new), torch.exp(scores - m_new[..., None])
    p_own = torch.exp(scores - scores.amax(dim=-1, keepdim=True))  # shifted by the block's own max: a mistake
    inverted = torch.exp(m_new - m)  # the rescale upside down: a mistake
    return {"m_new": m_new, "rescale": rescale, "p": p, "pv": p @ v, "denom": denom, "o": o,
            "own_denom": rescale * denom + p_own.sum(dim=-1), "own_o": rescale[..., None] * o + p_own @ v,
            "inverted_denom": inverted * denom + p.sum(dim=-1), "inverted_o": inverted[..., None] * o + p @ v}


def _merge_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes, parts = inputs["sizes"], functools.cache(partial(_merge_parts, inputs))  # computed if a result is wrong
    for key, shape in (("m", "B T_q"), ("denom", "B T_q"), ("o", "B T_q D")):
        check_shape(got[key], shape, sizes, f"the returned {key}")
    check_close(got["m"], expected["m"], "the running max m", atol=1e-6, mistakes={
        Mistake("12.merge_max_block_only",
                "m is this block's maximum only: the running max is torch.maximum(m, scores.amax(dim=-1))"):
            lambda: inputs["scores"].amax(dim=-1)})
    for key in ("denom", "o"):
        if not bool(torch.isfinite(got[key]).all()) and not bool(torch.isfinite(parts()[f"inverted_{key}"]).all()):
            raise fail(f"the returned {key} holds inf or NaN: {INVERTED} (" + (
                "on the first block m = -inf, and exp(m_new - m) is inf)" if bool(torch.isinf(inputs["m"]).any())
                else "it overflows when the maximum jumps)"), mistake=INVERTED.key)
        if not bool(torch.isfinite(got[key]).all()) and float(inputs["scores"].max()) > 88:
            raise fail(f"the returned {key} holds inf or NaN where it should not: exp() overflowed. This block's "
                       f"scores reach {float(inputs['scores'].max()):.0f}, and exp of anything past 88 is inf in "
                       "float32: exponentiate only differences that are at most 0, exp(scores - m_new) and "
                       "exp(m - m_new), never a score or a max alone", mistake="12.merge_overflow")
    check_close(got["denom"], expected["denom"], "the denominator", mistakes=lambda: {
        RESCALE_DENOM: parts()["denom"] + parts()["p"].sum(dim=-1), KEEP_DENOM: parts()["denom"],
        OWN_MAX: parts()["own_denom"], INVERTED: parts()["inverted_denom"]})
    check_close(got["o"], expected["o"], "the running output o", mistakes=lambda: {
        RESCALE_O: parts()["o"] + parts()["pv"], DIVIDE_EARLY: expected["o"] / expected["denom"][..., None],
        OWN_MAX: parts()["own_o"], INVERTED: parts()["inverted_o"]})


def _merge_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _merge_inputs(r.randint(1, 3), r.randint(1, 5), r.randint(1, 7), r.randint(1, 7), r.randint(1, 6), seed,
                         jump=4.0)  # the maximum moves: a missing rescale shows


# ---- flash_forward(q, k, v, causal, block_q, block_k, on_tile=None) -> (out (B, H, T, D), lse (B, H, T))


def _attention_inputs(b: int, h: int, h_kv: int, t: int, d: int, block_q: int, block_k: int, causal: bool,
                      seed: int) -> Inputs:
    gen = tensor_rng(seed)
    q = 1.5 * torch.randn(b, h, t, d, generator=gen)  # spread scores, so that the running max moves
    k, v = torch.randn(b, h_kv, t, d, generator=gen), torch.randn(b, h_kv, t, d, generator=gen)
    return {"q": q, "k": k, "v": v, "causal": causal, "block_q": block_q, "block_k": block_k,
            "sizes": _sizes(b, h, h_kv, t, d)}


def _describe(inputs: Inputs) -> str:
    q, k = inputs["q"], inputs["k"]
    return (f"q {fmt_shape(q.shape)}, k, v {fmt_shape(k.shape)}, causal={inputs['causal']}, "
            f"block_q={inputs['block_q']}, block_k={inputs['block_k']}")


def _forward_call(fn: Any, inputs: Inputs) -> Outputs:
    q, k, v = (inputs[key].clone() for key in ("q", "k", "v"))
    with _measured(fn, _forward_with_tiles, q.size(2)) as work:
        out = fn(q, k, v, inputs["causal"], inputs["block_q"], inputs["block_k"])
    got = as_tensors(out, ("out", "lse"), f"flash_forward({_describe(inputs)})")
    return {"out": got[0], "lse": got[1], **work.outputs()}


def _forward_with_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_q: int, block_k: int,
                        on_tile: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """gptcourse.flash_forward, reporting the tiles it computes (gptcourse.computed_tiles) to `on_tile`."""
    for q0, _, k0, _ in computed_tiles(q.size(2), k.size(2), block_q, block_k, causal):
        if on_tile is not None:
            on_tile(q0, k0)
    return flash_forward(q, k, v, causal, block_q, block_k)


def _slow_forward(inputs: Inputs, *, rescale: bool = True, divide_each: bool = False, scale: float | str | None = None,
                  keys_through_q0: bool = False, tiled_heads: bool = False, mask_only_k0_q0: bool = False,
                  whole_blocks: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A tiled forward with one of the usual mistakes switched on, for recognising them; right with no flag."""
    q, k, v, causal = inputs["q"], inputs["k"], inputs["v"], inputs["causal"]
    (_, h, t, d), block_q, block_k = q.shape, inputs["block_q"], inputs["block_k"]
    k, v = (kv_heads_by_hand(z, h // z.size(1), tiled=tiled_heads) for z in (k, v))  # (B, H, T, D)
    scale = 1 / math.sqrt(d) if scale is None else 1 / d if scale == "1/D" else scale
    allowed = causal_mask(t) if causal else torch.ones(t, t, dtype=torch.bool)
    out, lse = torch.zeros_like(q), q.new_zeros(q.shape[:3])  # queries never visited stay 0
    for q0 in range(0, t - block_q + 1 if whole_blocks else t, block_q):
        q1 = min(q0 + block_q, t)
        m = q.new_full((*q.shape[:2], q1 - q0), float("-inf"))
        denom, o = torch.zeros_like(m), torch.zeros_like(q[:, :, q0:q1])
        last = q0 + 1 if keys_through_q0 and causal else q1 if causal else t
        for k0 in range(0, min(last, t - block_k + 1) if whole_blocks else last, block_k):
            k1 = min(k0 + block_k, t)
            tile_allowed = allowed[q0:q1, k0:k1] if not mask_only_k0_q0 or k0 == q0 else allowed.new_ones(())
            s = (q[:, :, q0:q1] @ k[:, :, k0:k1].transpose(-2, -1) * scale).masked_fill(~tile_allowed, float("-inf"))
            m_new = torch.maximum(m, s.amax(dim=-1))
            factor = torch.exp(m - m_new) if rescale else torch.ones_like(m)
            p = torch.exp(s - m_new[..., None])
            denom, o, m = factor * denom + p.sum(-1), factor[..., None] * o + p @ v[:, :, k0:k1], m_new
            if divide_each:
                o = o / denom[..., None]
                denom = torch.ones_like(denom)
        out[:, :, q0:q1] = o / denom[..., None]
        lse[:, :, q0:q1] = m + denom.log()
    return out, lse


TAIL_DROPPED = (Mistake("12.tail_dropped",
                       "the last, shorter block was left out: range(0, T - block + 1, block) visits whole blocks only. "
                       "When T is not a multiple of the block, loop over range(0, T, block) and end each block at "
                       "min(start + block, T)"))
NO_RESCALE = (Mistake("12.no_rescale",
                  "the running output and denominator were not rescaled by exp(m_old - m_new) when a later tile raised "
                  "the maximum: the earlier tiles keep weights relative to the old maximum"))
OFF_BY_ONE = (Mistake("12.keys_through_q0",
                    "the key tiles stop at k0 <= q0, the block's *first* query: with block_k smaller than block_q that "
                    "skips tiles that straddle the diagonal, whose keys the later queries of the block see. A key tile "
                    "is needed while k0 <= q1 - 1, the block's last query (q1 = min(q0 + block_q, T))"))


DIVIDED_EACH = (Mistake("12.divided_each",
                  "the output was divided by the denominator after every tile: keep o unnormalised inside the loop and "
                  "divide once, after the last key tile (dividing early and carrying on weights the tiles wrongly)"))
# why -> the switches of `_slow_forward` that make that mistake
_FORWARD_MISTAKES: dict[str, dict[str, Any]] = {
    NO_RESCALE: {"rescale": False},
    DIVIDED_EACH: {"divide_each": True},
    SCALED_BY_D: {"scale": "1/D"},
    NO_SCALE: {"scale": 1.0},
    OFF_BY_ONE: {"keys_through_q0": True},
    TILED_KV_HEADS: {"tiled_heads": True},
    Mistake("12.mask_only_k0_q0",
          "only the tile with k0 == q0 was masked: with block_q != block_k other tiles straddle the diagonal too. Mask "
          "every tile that holds a key after the block's first query (k1 - 1 > q0), -inf where key j > query i"):
        {"mask_only_k0_q0": True},
    TAIL_DROPPED: {"whole_blocks": True},
}


def _forward_mistakes(inputs: Inputs) -> dict[str, dict[str, Callable[[], torch.Tensor]]]:
    """{"out" or "lse": {why: a function computing what that mistake gives}}: each forward by hand runs once, and
    only when asked (for a wrong answer)."""
    variants = {why: functools.cache(partial(_slow_forward, inputs, **switches))
                for why, switches in _FORWARD_MISTAKES.items()}
    return {"out": {why: partial(part_of, wrong, 0) for why, wrong in variants.items()},
            "lse": {why: partial(part_of, wrong, 1) for why, wrong in variants.items()
                    if why not in (DIVIDED_EACH, TAIL_DROPPED)}}  # divided each: its denominator ends at 1, L = m


def _forward_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes = inputs["sizes"]
    check_shape(got["out"], "B H T D", sizes, "the output")
    check_shape(got["lse"], "B H T", sizes, "L, the log-sum-exp of each query's scores")
    mistakes = _forward_mistakes(inputs)
    check_close(got["out"], expected["out"], "the output", mistakes=mistakes["out"])
    check_close(got["lse"], expected["lse"], "L, the log-sum-exp of each query's scores", mistakes={
        **mistakes["lse"],
        Mistake("12.lse_max_only",
                "L is the running max m alone: return m + log(denom), the log of the softmax's full denominator"):
            partial(_running_max, inputs),
        Mistake("12.lse_no_max",
                "L is log(denom) alone: add the running max, L = m + log(denom)"):
            lambda: expected["lse"] - _running_max(inputs)})
    _check_memory(got, inputs, f"flash_forward({_describe(inputs)})")
    _check_tile_products(got, inputs, f"flash_forward({_describe(inputs)})")
    _check_work(got, inputs, f"flash_forward({_describe(inputs)})", 2, "q k^T and p v")


def _running_max(inputs: Inputs) -> torch.Tensor:
    q, k = inputs["q"], inputs["k"]
    t = q.size(2)
    scores = q @ kv_heads_by_hand(k, q.size(1) // k.size(1)).transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, T)
    if inputs["causal"]:
        scores = scores.masked_fill(~causal_mask(t), float("-inf"))
    return scores.amax(dim=-1)  # (B, H, T)


def _forward_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    h_kv = r.choice([1, 2])
    block_q, block_k = r.choice([2, 3, 4]), r.choice([2, 3, 4])
    t = r.randint(5, 13)
    return _attention_inputs(r.randint(1, 2), h_kv * r.choice([1, 2, 3]), h_kv, t, r.randint(2, 6), block_q, block_k,
                             r.random() < 0.8, seed)


# ---- the tiles the forward computes: on_tile(q0, k0) for each


def _tiles_call(fn: Any, inputs: Inputs) -> Outputs:
    (q, k, v), tiles = (inputs[key].clone() for key in ("q", "k", "v")), []

    def on_tile(q0: Any, k0: Any) -> None:
        tiles.append((int(q0), int(k0)))

    with _measured(fn, _forward_with_tiles, q.size(2)) as work:
        fn(q, k, v, inputs["causal"], inputs["block_q"], inputs["block_k"], on_tile=on_tile)
    return {"tiles": torch.tensor(tiles, dtype=torch.long).view(-1, 2), **work.outputs()}


def _tiles_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    _check_reported_tiles(got, expected, inputs)
    _check_memory(got, inputs, f"flash_forward({_describe(inputs)})")
    _check_tile_products(got, inputs, f"flash_forward({_describe(inputs)})")
    _check_work(got, inputs, f"flash_forward({_describe(inputs)})", 2, "q k^T and p v")


def _check_reported_tiles(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    got_tiles, want = [tuple(x) for x in got["tiles"].tolist()], [tuple(x) for x in expected["tiles"].tolist()]
    if sorted(got_tiles) == sorted(want):
        return
    t, block_q = inputs["q"].size(2), inputs["block_q"]
    what = f"flash_forward({_describe(inputs)}) computed {len(got_tiles)} tiles, expected {len(want)}"
    if not got_tiles:
        raise fail(f"{what}: on_tile was never called. Call on_tile(q0, k0) once for each (block_q, block_k) tile "
                   "of scores you compute, q0 and k0 its first query and first key", mistake="12.tiles_not_reported")
    if len(set(got_tiles)) != len(got_tiles):
        raise fail(f"{what}: some tiles were reported twice; call on_tile(q0, k0) once per tile computed",
                   mistake="12.tiles_reported_twice")
    extra, missing = sorted(set(got_tiles) - set(want)), sorted(set(want) - set(got_tiles))
    if extra and all(k0 > min(q0 + block_q, t) - 1 for q0, k0 in extra):
        raise fail(f"{what}: the tiles {extra[:4]} lie wholly above the diagonal (every key after every query of the "
                   "block). Skip them, do not compute and mask them: stop the key loop once k0 > q1 - 1, the last "
                   "query of the block" + (", not q1 (an off-by-one)" if all(k0 <= min(q0 + block_q, t)
                                                                          for q0, k0 in extra) else ""),
                   mistake="12.tiles_above_diagonal")
    if missing and all(q0 + block_q > t or k0 + inputs["block_k"] > t for q0, k0 in missing):
        raise fail(f"{what}: the tiles {missing[:4]} (q0, k0) were skipped: {TAIL_DROPPED}", mistake=TAIL_DROPPED.key)
    if missing:
        raise fail(f"{what}: the tiles {missing[:4]} (q0, k0) hold keys the queries may see, and were skipped; with "
                   f"causal={inputs['causal']} a tile is needed when k0 <= q1 - 1 (q1 = min(q0 + block_q, T))",
                   mistake="12.tiles_needed_skipped")
    raise fail(f"{what}: it reported tiles {extra[:4]} that are not (q0, k0) tile starts: q0 in range(0, T, block_q), "
               "k0 in range(0, T, block_k)")


TILES = Probe(_tiles_call, _tiles_judge)


# ---- flash_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k) -> (dq, dk, dv)


def _backward_inputs(b: int, h: int, h_kv: int, t: int, d: int, block_q: int, block_k: int, causal: bool,
                     seed: int) -> Inputs:
    inputs = _attention_inputs(b, h, h_kv, t, d, block_q, block_k, causal, seed)
    out, lse = flash_forward(inputs["q"], inputs["k"], inputs["v"], causal, block_q, block_k)
    grad_out = torch.randn(out.shape, generator=tensor_rng(seed + 1))
    return inputs | {"out": out, "lse": lse, "grad_out": grad_out}


def _backward_call(fn: Any, inputs: Inputs) -> Outputs:
    tensors = [inputs[key].clone() for key in ("q", "k", "v", "out", "lse", "grad_out")]
    with _measured(fn, flash_backward, tensors[0].size(2)) as work:
        out = fn(*tensors, inputs["causal"], inputs["block_q"], inputs["block_k"])
    got = as_tensors(out, ("dq", "dk", "dv"), f"flash_backward({_describe(inputs)}, out, lse, grad_out)")
    return {**dict(zip(("dq", "dk", "dv"), got, strict=True)), **work.outputs()}


def _explicit_grads(inputs: Inputs, *, delta: bool = True, scale_grads: bool = True, scale_scores: bool = True,
                    mask_inside: bool = True, expand: str = "interleave", reduce: str = "interleave"
                    ) -> dict[str, torch.Tensor]:
    """dq, dk, dv from the whole (T, T) probabilities recomputed from the given L, delta from the given output (as
    a backward has them), with a mistake switched on; right by default. `mask_inside=False`: the tiles above the
    diagonal skipped, the ones that straddle it not masked; `expand`, `reduce`: how the kv heads were repeated
    for the query heads and their gradients summed back ("interleave", or "tile" as x.repeat does)."""
    q, k, v, out, lse, grad_out = (inputs[key] for key in ("q", "k", "v", "out", "lse", "grad_out"))
    (b, h, t, d), h_kv = q.shape, k.size(1)
    kr, vr = (kv_heads_by_hand(z, h // h_kv, tiled=expand == "tile") for z in (k, v))  # (B, H, T, D)
    scores = q @ kr.transpose(-2, -1) / (math.sqrt(d) if scale_scores else 1.0)  # (B, H, T, T)
    allowed = causal_mask(t) if inputs["causal"] else torch.ones(t, t, dtype=torch.bool)
    if not mask_inside:
        allowed = torch.zeros(t, t, dtype=torch.bool)
        for q0, q1, k0, k1 in computed_tiles(t, t, inputs["block_q"], inputs["block_k"], inputs["causal"]):
            allowed[q0:q1, k0:k1] = True
    p = torch.exp(scores - lse[..., None]).masked_fill(~allowed, 0.0)
    dp = grad_out @ vr.transpose(-2, -1)
    ds = p * (dp - (grad_out * out).sum(dim=-1, keepdim=True)) if delta else p * dp
    s = 1 / math.sqrt(d) if scale_grads else 1.0
    # the G query heads of a kv head, summed: heads j G .. j G + G - 1 (tiled: j, j + H_kv, ...)
    group, axis = ((b, h // h_kv, h_kv, t, d), 1) if reduce == "tile" else ((b, h_kv, h // h_kv, t, d), 2)
    return {"dq": ds @ kr * s, "dk": (ds.transpose(-2, -1) @ q * s).view(group).sum(axis),
            "dv": (p.transpose(-2, -1) @ grad_out).view(group).sum(axis)}


# why -> the switches of `_explicit_grads` that make that mistake
_BACKWARD_MISTAKES: dict[str, dict[str, Any]] = {
    Mistake("12.backward_no_delta",
            "the softmax's backward lacks its row term: dS = P * (dP - delta), delta = (dO * O).sum(-1) for each query "
            "row (delta_i = sum_j P_ij dP_ij)"):
        {"delta": False},
    Mistake("12.backward_grads_unscaled",
            "dq and dk lack the scale: the scores were q k^T / sqrt(D), so dq = dS k / sqrt(D) and dk = dS^T q / "
            "sqrt(D)"):
        {"scale_grads": False},
    Mistake("12.backward_scores_unscaled",
            "the scores recomputed in the backward lack the forward's 1/sqrt(D): P = exp(q k^T / sqrt(D) - L), the "
            "scores L was computed from"):
        {"scale_scores": False},
    Mistake("12.backward_not_masked",
            "the recomputed probabilities were not masked inside the tiles that straddle the diagonal: P = exp(S - L) "
            "must be 0 where key j > query i, as the forward masked it, or the future keys get gradient"):
        {"mask_inside": False},
    Mistake(TILED_KV_HEADS.key,
            TILED_KV_HEADS + ", and dk, dv sum the G query heads of each kv head, .view(B, H_kv, G, T, D).sum(2)"):
        {"expand": "tile", "reduce": "tile"},
    Mistake("12.backward_wrong_groups",
            "dk and dv were summed over the wrong query heads: after repeat_interleave kv head j serves query heads "
    "j G .. j G + G - 1, so .view(B, H_kv, G, T, D).sum(2); .view(B, G, H_kv, T, D).sum(1) is repeat's layout"):
        {"reduce": "tile"},
    Mistake("12.backward_tiled_expand",
            "the kv heads were expanded with repeat (tiled) and their gradients summed as repeat_interleave's groups, "
            ".view(B, H_kv, G, T, D).sum(2): expand with k.repeat_interleave(G, dim=1) as well, so that query head i "
            "uses kv head i // G in both"):
        {"expand": "tile"},
}


def _backward_mistakes(inputs: Inputs) -> dict[str, Callable[[], dict[str, torch.Tensor]]]:
    """{why: a function computing the (dq, dk, dv) that mistake gives, once, when asked}."""
    return {why: functools.cache(partial(_explicit_grads, inputs, **switches))
            for why, switches in _BACKWARD_MISTAKES.items()}


def _backward_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes = inputs["sizes"]
    for key, shape, label in (("dq", "B H T D", "dq"), ("dk", "B H_kv T D", "dk"), ("dv", "B H_kv T D", "dv")):
        check_shape(got[key], shape, sizes, label + (" (kv heads: sum the gradients of the G query heads that "
                                                     "share each one)" if key != "dq" else ""))
    mistakes = _backward_mistakes(inputs)
    for key in ("dv", "dq", "dk"):
        check_close(got[key], expected[key], key, mistakes={why: partial(part_of, wrong, key)
                                                            for why, wrong in mistakes.items()})
    what = f"flash_backward({_describe(inputs)}, out, lse, grad_out)"
    _check_memory(got, inputs, what)
    _check_tile_products(got, inputs, what)
    _check_work(got, inputs, what, 5, "q k^T, p^T dO, dO v^T, dS k and dS^T q")


def _backward_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    h_kv = r.choice([1, 2])
    return _backward_inputs(r.randint(1, 2), h_kv * r.choice([1, 2]), h_kv, r.randint(3, 11), r.randint(2, 5),
                            r.choice([2, 3, 4]), r.choice([2, 3, 4]), r.random() < 0.8, seed)


# ---- FlashAttention.apply(q, k, v, causal, block_q, block_k): outputs, gradients and what it saves


def _ctx_tensors(value: Any, depth: int = 3) -> list[torch.Tensor]:
    """The tensors in an attribute of ctx, also inside lists, tuples, sets and dicts."""
    if isinstance(value, torch.Tensor):
        return [value]
    items = value.values() if isinstance(value, dict) else value if isinstance(value, (list, tuple, set)) else ()
    return [x for item in items for x in _ctx_tensors(item, depth - 1)] if depth else []


def _function_call(cls: Any, inputs: Inputs) -> Outputs:
    q, k, v = (inputs[key].clone().requires_grad_() for key in ("q", "k", "v"))
    saved: list[torch.Tensor] = []
    apply = getattr(cls, "apply", None)
    if apply is None:
        raise fail("FlashAttention has no apply: subclass torch.autograd.Function, with static forward and backward",
                   mistake="12.function_no_apply")
    with _measured(cls, _Reference, q.size(2)) as work:
        with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x):
            result = apply(q, k, v, inputs["causal"], inputs["block_q"], inputs["block_k"])
        out = as_tensor(result, f"FlashAttention.apply({_describe(inputs)})")  # detached, for the payload
        if not result.requires_grad:
            raise fail("FlashAttention.apply returned an output without a gradient: call it through apply, and "
                       "return the output of flash_forward from forward (not a detached copy made outside autograd)",
                       mistake="12.function_detached")
        on_ctx = [x for value in vars(result.grad_fn).values() for x in _ctx_tensors(value)]
        grads = torch.autograd.grad(result, (q, k, v), inputs["grad_out"])
    kept = {(x.data_ptr(), tuple(x.shape), tuple(x.stride())): x.numel() for x in saved + on_ctx}  # each once
    return {"out": out, "dq": grads[0], "dk": grads[1], "dv": grads[2], "kept": sum(kept.values()),
            "largest_kept": max(kept.values(), default=0), "largest_on_ctx": max(map(torch.numel, on_ctx), default=0),
            **work.outputs()}


class _Reference:
    """gptcourse.flash_attention as a class with the student's `apply(q, k, v, causal, block_q, block_k)`: the
    package's FlashAttention.apply takes the scale, window and padding mask too, hence `expected`."""

    apply = staticmethod(flash_attention)


def _function_expected(inputs: Inputs) -> Outputs:
    return _function_call(_Reference, inputs)


def _function_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    b, h, t, d = inputs["q"].shape
    allowed = sum(inputs[key].numel() for key in ("q", "k", "v", "out", "lse"))
    kept, largest, on_ctx = int(got["kept"]), int(got["largest_kept"]), int(got["largest_on_ctx"])
    where = "on ctx, outside save_for_backward" if on_ctx == largest else "with save_for_backward"
    if t > d and largest >= b * h * t * t:  # more than any input holds
        raise fail(f"forward kept a tensor of {largest} numbers for the backward ({where}), B H T T = "
                   f"{b * h * t * t}: the (T, T) probabilities (the softmax) or scores. Keep only L (B, H, T), the "
                   "log-sum-exp that flash_forward returns, and let the backward recompute each tile's "
                   "probabilities, exp(s - L): that is what keeps memory linear in T",
                   mistake="12.backward_keeps_scores")
    if kept > allowed:
        raise fail(f"forward keeps {kept} numbers for the backward (saved, and on ctx: {on_ctx} in its largest "
                   f"attribute tensor), more than q, k, v, the output and L hold together, {allowed}: save exactly "
                   "those five with ctx.save_for_backward(q, k, v, out, lse), k and v as given (B, H_kv, T, D), and "
                   "let the backward recompute everything else tile by tile", mistake="12.backward_keeps_too_much")
    what = f"FlashAttention.apply({_describe(inputs)}) and its backward"
    _check_memory(got, inputs, what)
    _check_work(got, inputs, what, 7, "2 in flash_forward, 5 in flash_backward", "does backward differentiate through "
                                                                                 "the forward with autograd, which "
                                                                                 "recomputes it and keeps every tile's "
                                                                                 "P in autograd's graph, instead of "
                                                                                 "calling flash_backward on what "
                                                                                 "forward saved?")
    check_shape(got["out"], "B H T D", inputs["sizes"], "the output of FlashAttention.apply")
    check_close(got["out"], expected["out"], "the output (your forward runs your flash_forward: if its tests pass, "
                                             "check what forward returns)")
    for key in ("dq", "dk", "dv"):
        check_close(got[key], expected[key], f"{key} (your backward runs your flash_backward on what forward saved: "
                    "if flash_forward's and flash_backward's tests pass, check that forward saves its own output and "
                    "L, and that backward returns dq, dk, dv in that order)")


# Visible cases: causal, grouped (2 query heads per kv head), T not a multiple of the blocks, a max that moves from
# tile to tile (q scaled by 1.5), and D < T, so that a (T, T) tensor is larger than any other the code needs.
CAUSAL = (2, 6, 3, 10, 5, 4, 3, True)  # (B, H, H_kv, T, D, block_q, block_k, causal): the diagonal inside tiles
EDGES = (1, 2, 1, 10, 3, 4, 2, True)  # key tiles that start at q1 = 4 and 8, just past a block's last query
UNEVEN = (1, 4, 2, 11, 3, 4, 3, True)
PIECES = declare(
    Piece("12", "online_softmax", online_softmax, _merge_call, judge=_merge_judge, forbidden=_MERGE,
          visible=[("visible", "online_softmax: the state after 6 keys (B=2, 3 query rows, D=4) and a block of 5",
                    lambda seed: _merge_inputs(2, 3, 6, 5, 4, seed)),
                   ("max_moves", "online_softmax with a block whose scores are about 100 larger (the maximum "
                    "moves, and exp of a score alone overflows)",
                    lambda seed: _merge_inputs(2, 3, 6, 5, 4, seed, jump=100.0))],
          hidden=[("hidden_first", "online_softmax on the first block (m = -inf, denom = 0, o = 0)",
                   lambda seed: _merge_inputs(1, 2, 0, 4, 3, seed)),
                  ("hidden_sizes", "online_softmax with other sizes", _merge_hidden)]),
    Piece("12", "flash_forward", _forward_with_tiles, _forward_call, judge=_forward_judge, forbidden=_FORWARD,
          visible=[("visible", "flash_forward, causal, q (2, 6, 10, 5), k, v (2, 3, 10, 5), blocks of 4 queries and 3 "
                               "keys: the output, L, and the tensors and products it makes",
                    lambda seed: _attention_inputs(*CAUSAL, seed)),
                   ("tiles", "flash_forward, causal, T=10, blocks of 4 queries and 2 keys: the tiles on_tile sees "
                    "(9 of the 15) and the products it computes",
                    lambda seed: _attention_inputs(*EDGES, seed), TILES)],
          hidden=[("hidden_one", "flash_forward with T=1 and a batch of one",
                   lambda seed: _attention_inputs(1, 2, 2, 1, 4, 4, 4, True, seed)),
                  ("hidden_big_block", "flash_forward with blocks larger than T (one tile)",
                   lambda seed: _attention_inputs(2, 2, 2, 5, 3, 8, 16, True, seed)),
                  ("hidden_not_causal", "flash_forward without the causal mask, blocks of 3 and 4",
                   lambda seed: _attention_inputs(1, 2, 2, 9, 4, 3, 4, False, seed)),
                  ("hidden_gqa", "flash_forward with grouped-query shapes (6 query heads, 2 kv heads)",
                   lambda seed: _attention_inputs(1, 6, 2, 7, 4, 3, 2, True, seed)),
                  ("hidden_sizes", "flash_forward with other sizes", _forward_hidden),
                  ("hidden_tiles", "the tiles on_tile sees, blocks of 3 and 2 (T=11)",
                   lambda seed: _attention_inputs(1, 1, 1, 11, 2, 3, 2, True, seed), TILES)]),
    Piece("12", "flash_backward", flash_backward, _backward_call, judge=_backward_judge, forbidden=_BACKWARD,
          visible=[("visible", "flash_backward, causal, q (1, 4, 11, 3), k, v (1, 2, 11, 3), blocks of 4 and 3: the "
                               "gradients, and the tensors and products it makes",
                    lambda seed: _backward_inputs(*UNEVEN, seed))],
          hidden=[("hidden_one", "flash_backward with T=1", lambda seed: _backward_inputs(1, 1, 1, 1, 3, 2, 2, True,
                                                                                        seed)),
                  ("hidden_gqa", "flash_backward with grouped-query shapes (4 query heads, 2 kv heads): dk, dv sum "
                                 "their group", lambda seed: _backward_inputs(2, 4, 2, 6, 3, 4, 2, True, seed)),
                  ("hidden_sizes", "flash_backward with other sizes", _backward_hidden)]),
    Piece("12", "FlashAttention", None, _function_call, expected=_function_expected, judge=_function_judge,
          forbidden=_FUNCTION,
          visible=[("visible", "FlashAttention.apply, causal, q (1, 4, 11, 3), k, v (1, 2, 11, 3): output, gradients, "
                               "what it keeps for the backward", lambda seed: _backward_inputs(*UNEVEN, seed))],
          hidden=[("hidden_gqa", "FlashAttention with grouped-query shapes (4 query heads, 2 kv heads), blocks of 4 "
                                 "queries and 2 keys (key tiles start at q1 = 4 and 8)",
                   lambda seed: _backward_inputs(2, 4, 2, 9, 3, 4, 2, True, seed)),
                  ("hidden_sizes", "FlashAttention with other sizes", _backward_hidden)]),
)
