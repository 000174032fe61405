"""Lab 12, FlashAttention in PyTorch: `online_softmax(m, denom, o, scores, v)`, `flash_forward(q, k, v, causal,
block_q, block_k, on_tile=None)`, `flash_backward(q, k, v, out, lse, grad_out, causal, block_q, block_k)` and the
class `FlashAttention(torch.autograd.Function)`, called as `FlashAttention.apply(q, k, v, causal, block_q,
block_k)`.

q is (B, H, T, D); k and v are (B, H_kv, T, D) with H_kv dividing H (grouped-query attention, hidden cases only).
The forward calls `on_tile(q0, k0)` for every tile of scores it computes: the tiles a causal mask empties must
never be computed, and counting the calls shows it (the output alone cannot). The references are gptcourse's
`online_softmax`, `flash_forward` and `flash_backward` (the forward behind an adapter that reports its tiles) and
`flash_attention` for the class (`expected`: the student's class is called through `apply`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...checks import check_close, check_shape, fail, fmt_shape
from ...model.causal_attention import causal_mask
from ...model.tiled_attention import computed_tiles, flash_attention, flash_backward, flash_forward, online_softmax
from ..cases import Inputs, Outputs, sizes_rng, tensor_rng
from ..piece import Piece, Probe, declare
from ..student import as_tensor, as_tensors

_TILED = ("gptcourse.online_softmax", "gptcourse.flash_forward", "gptcourse.flash_backward",
          "gptcourse.FlashAttention", "gptcourse.flash_attention", "gptcourse.computed_tiles",
          "gptcourse.model.tiled_attention")
_ATTENTION = ("gptcourse.attention", "gptcourse.fused_attention", "gptcourse.MultiHeadAttention",
              "torch.nn.functional.scaled_dot_product_attention", "torch.nn.MultiheadAttention")
_FORBIDDEN = _TILED + _ATTENTION


def _sizes(b: int, h: int, h_kv: int, t: int, d: int) -> dict[str, int]:
    return {"B": b, "H": h, "H_kv": h_kv, "T": t, "D": d}


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


RESCALE_O = ("the running output o was not rescaled when the maximum moved: multiply the old o by exp(m_old - m_new) "
             "before adding this block's exp(s - m_new) @ v, or the earlier keys keep weights relative to the old max")
RESCALE_DENOM = ("the denominator was not rescaled when the maximum moved: denom_new = exp(m_old - m_new) * denom + "
                 "exp(scores - m_new).sum(-1)")
KEEP_DENOM = ("the denominator was not updated: add this block's exp(scores - m_new).sum(-1) to the rescaled old "
              "one")
DIVIDE_EARLY = ("o was divided by the denominator inside the merge: keep o unnormalised (a sum of exp(s - m) v) and "
                "divide by the denominator once, after the last block")


def _merge_parts(inputs: Inputs) -> dict[str, torch.Tensor]:
    m, denom, o, scores, v = (inputs[key] for key in ("m", "denom", "o", "scores", "v"))
    m_new = torch.maximum(m, scores.amax(dim=-1))
    rescale, p = torch.exp(m - m_new), torch.exp(scores - m_new[..., None])
    return {"m_new": m_new, "rescale": rescale, "p": p, "pv": p @ v, "denom": denom, "o": o}


def _merge_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes, parts = inputs["sizes"], _merge_parts(inputs)
    for key, shape in (("m", "B T_q"), ("denom", "B T_q"), ("o", "B T_q D")):
        check_shape(got[key], shape, sizes, f"the returned {key}")
    check_close(got["m"], expected["m"], "the running max m", atol=1e-6, mistakes={
        "m is this block's maximum only: the running max is torch.maximum(m, scores.amax(dim=-1))":
            inputs["scores"].amax(dim=-1)})
    p, pv = parts["p"], parts["pv"]
    check_close(got["denom"], expected["denom"], "the denominator", mistakes={
        RESCALE_DENOM: parts["denom"] + p.sum(dim=-1), KEEP_DENOM: parts["denom"]})
    check_close(got["o"], expected["o"], "the running output o", mistakes={
        RESCALE_O: parts["o"] + pv, DIVIDE_EARLY: expected["o"] / expected["denom"][..., None]})


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
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    out = fn(q.clone(), k.clone(), v.clone(), inputs["causal"], inputs["block_q"], inputs["block_k"])
    got = as_tensors(out, ("out", "lse"), f"flash_forward({_describe(inputs)})")
    return {"out": got[0], "lse": got[1]}


def _forward_with_tiles(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, block_q: int, block_k: int,
                        on_tile: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """gptcourse.flash_forward, reporting the tiles it computes (gptcourse.computed_tiles) to `on_tile`."""
    for q0, _, k0, _ in computed_tiles(q.size(2), k.size(2), block_q, block_k, causal):
        if on_tile is not None:
            on_tile(q0, k0)
    return flash_forward(q, k, v, causal, block_q, block_k)


def _slow_forward(inputs: Inputs, *, rescale: bool = True, divide_each: bool = False, scale: float | None = None,
                  keys_through_q0: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A tiled forward with one of the usual mistakes switched on, for recognising them; right with no flag."""
    q, k, v, causal = inputs["q"], inputs["k"], inputs["v"], inputs["causal"]
    (_, h, t, d), h_kv = q.shape, k.size(1)
    k, v = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)  # (B, H, T, D)
    scale = 1 / math.sqrt(d) if scale is None else scale
    allowed = causal_mask(t) if causal else torch.ones(t, t, dtype=torch.bool)
    out, lse = torch.zeros_like(q), q.new_zeros(q.shape[:3])
    for q0 in range(0, t, inputs["block_q"]):
        q1 = min(q0 + inputs["block_q"], t)
        m = q.new_full((*q.shape[:2], q1 - q0), float("-inf"))
        denom, o = torch.zeros_like(m), torch.zeros_like(q[:, :, q0:q1])
        last = q0 + 1 if keys_through_q0 and causal else t
        for k0 in range(0, last, inputs["block_k"]):
            k1 = min(k0 + inputs["block_k"], t)
            s = (q[:, :, q0:q1] @ k[:, :, k0:k1].transpose(-2, -1) * scale).masked_fill(
                ~allowed[q0:q1, k0:k1], float("-inf"))
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


NO_RESCALE = ("the running output and denominator were not rescaled by exp(m_old - m_new) when a later tile raised "
              "the maximum: the earlier tiles keep weights relative to the old maximum")
OFF_BY_ONE = ("the key tiles stop at k0 <= q0, the block's *first* query: with block_k smaller than block_q the "
              "later queries of the block never see their last keys. A key tile is needed while k0 <= q1 - 1, the "
              "block's last query (q1 = min(q0 + block_q, T))")


def _forward_mistakes(inputs: Inputs) -> dict[str, dict[str, torch.Tensor]]:
    d = inputs["q"].size(-1)
    variants = {
        NO_RESCALE: _slow_forward(inputs, rescale=False),
        "the output was divided by the denominator after every tile: keep o unnormalised inside the loop and divide "
        "once, after the last key tile (dividing early and carrying on weights the tiles wrongly)":
            _slow_forward(inputs, divide_each=True),
        "the scores were divided by D, not sqrt(D): scale = 1 / math.sqrt(D)": _slow_forward(inputs, scale=1 / d),
        "the scores were not scaled: multiply q @ k^T by 1 / math.sqrt(D)": _slow_forward(inputs, scale=1.0),
        OFF_BY_ONE: _slow_forward(inputs, keys_through_q0=True),
    }
    divided_each = next(why for why in variants if "every tile" in why)  # its denominator ends at 1: L = m
    return {"out": {why: wrong[0] for why, wrong in variants.items()},
            "lse": {why: wrong[1] for why, wrong in variants.items() if why != divided_each}}


def _forward_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes = inputs["sizes"]
    check_shape(got["out"], "B H T D", sizes, "the output")
    check_shape(got["lse"], "B H T", sizes, "L, the log-sum-exp of each query's scores")
    mistakes = _forward_mistakes(inputs)
    check_close(got["out"], expected["out"], "the output", mistakes=mistakes["out"])
    running_max = _running_max(inputs)
    check_close(got["lse"], expected["lse"], "L, the log-sum-exp of each query's scores", mistakes={
        **mistakes["lse"],
        "L is the running max m alone: return m + log(denom), the log of the softmax's full denominator":
            running_max,
        "L is log(denom) alone: add the running max, L = m + log(denom)": expected["lse"] - running_max})


def _running_max(inputs: Inputs) -> torch.Tensor:
    q, k = inputs["q"], inputs["k"]
    t = q.size(2)
    k = k.repeat_interleave(q.size(1) // k.size(1), dim=1)
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))  # (B, H, T, T)
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
    q, k, v, tiles = inputs["q"], inputs["k"], inputs["v"], []

    def on_tile(q0: Any, k0: Any) -> None:
        tiles.append((int(q0), int(k0)))

    fn(q.clone(), k.clone(), v.clone(), inputs["causal"], inputs["block_q"], inputs["block_k"], on_tile=on_tile)
    return {"tiles": torch.tensor(tiles, dtype=torch.long).view(-1, 2)}


def _tiles_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    got_tiles, want = [tuple(x) for x in got["tiles"].tolist()], [tuple(x) for x in expected["tiles"].tolist()]
    if sorted(got_tiles) == sorted(want):
        return
    t, block_q = inputs["q"].size(2), inputs["block_q"]
    what = f"flash_forward({_describe(inputs)}) computed {len(got_tiles)} tiles, expected {len(want)}"
    if not got_tiles:
        raise fail(f"{what}: on_tile was never called. Call on_tile(q0, k0) once for each (block_q, block_k) tile "
                   "of scores you compute, q0 and k0 its first query and first key")
    if len(set(got_tiles)) != len(got_tiles):
        raise fail(f"{what}: some tiles were reported twice; call on_tile(q0, k0) once per tile computed")
    extra, missing = sorted(set(got_tiles) - set(want)), sorted(set(want) - set(got_tiles))
    if extra and all(k0 > min(q0 + block_q, t) - 1 for q0, k0 in extra):
        raise fail(f"{what}: the tiles {extra[:4]} lie wholly above the diagonal (every key after every query of the "
                   "block). Skip them, do not compute and mask them: stop the key loop once k0 > q1 - 1, the last "
                   "query of the block" + (", not q1 (an off-by-one)" if all(k0 <= min(q0 + block_q, t)
                                                                          for q0, k0 in extra) else ""))
    if missing:
        raise fail(f"{what}: the tiles {missing[:4]} (q0, k0) hold keys the queries may see, and were skipped; with "
                   f"causal={inputs['causal']} a tile is needed when k0 <= q1 - 1 (q1 = min(q0 + block_q, T))")
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
    out = fn(*tensors, inputs["causal"], inputs["block_q"], inputs["block_k"])
    got = as_tensors(out, ("dq", "dk", "dv"), f"flash_backward({_describe(inputs)}, out, lse, grad_out)")
    return dict(zip(("dq", "dk", "dv"), got, strict=True))


def _explicit_grads(inputs: Inputs, *, delta: bool = True, scale_grads: bool = True) -> dict[str, torch.Tensor]:
    """dq, dk, dv from the whole (T, T) probabilities, with a mistake switched off or on; right by default."""
    q, k, v, grad_out = inputs["q"], inputs["k"], inputs["v"], inputs["grad_out"]
    (b, h, t, d), h_kv = q.shape, k.size(1)
    kr, vr = k.repeat_interleave(h // h_kv, dim=1), v.repeat_interleave(h // h_kv, dim=1)  # (B, H, T, D)
    scores = q @ kr.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
    if inputs["causal"]:
        scores = scores.masked_fill(~causal_mask(t), float("-inf"))
    p = scores.softmax(dim=-1)
    dp = grad_out @ vr.transpose(-2, -1)
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True)) if delta else p * dp
    s = 1 / math.sqrt(d) if scale_grads else 1.0
    group = (b, h_kv, h // h_kv, t, d)  # the G query heads of a kv head, summed
    return {"dq": ds @ kr * s, "dk": (ds.transpose(-2, -1) @ q * s).view(group).sum(2),
            "dv": (p.transpose(-2, -1) @ grad_out).view(group).sum(2)}


def _backward_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes = inputs["sizes"]
    for key, shape, label in (("dq", "B H T D", "dq"), ("dk", "B H_kv T D", "dk"), ("dv", "B H_kv T D", "dv")):
        check_shape(got[key], shape, sizes, label + (" (kv heads: sum the gradients of the G query heads that "
                                                     "share each one)" if key != "dq" else ""))
    no_delta, unscaled = _explicit_grads(inputs, delta=False), _explicit_grads(inputs, scale_grads=False)
    for key in ("dv", "dq", "dk"):
        check_close(got[key], expected[key], key, mistakes={
            "the softmax's backward lacks its row term: dS = P * (dP - delta), delta = (dO * O).sum(-1) for each "
            "query row (delta_i = sum_j P_ij dP_ij)": no_delta[key],
            "dq and dk lack the scale: the scores were q k^T / sqrt(D), so dq = dS k / sqrt(D) and "
            "dk = dS^T q / sqrt(D)": unscaled[key]})


def _backward_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    h_kv = r.choice([1, 2])
    return _backward_inputs(r.randint(1, 2), h_kv * r.choice([1, 2]), h_kv, r.randint(3, 11), r.randint(2, 5),
                            r.choice([2, 3, 4]), r.choice([2, 3, 4]), r.random() < 0.8, seed)


# ---- FlashAttention.apply(q, k, v, causal, block_q, block_k): outputs, gradients and what it saves


def _function_call(cls: Any, inputs: Inputs) -> Outputs:
    q, k, v = (inputs[key].clone().requires_grad_() for key in ("q", "k", "v"))
    saved: list[int] = []

    def keep(x: torch.Tensor) -> torch.Tensor:
        saved.append(x.numel())
        return x

    apply = getattr(cls, "apply", None)
    if apply is None:
        raise fail("FlashAttention has no apply: subclass torch.autograd.Function, with static forward and backward")
    with torch.autograd.graph.saved_tensors_hooks(keep, lambda x: x):
        result = apply(q, k, v, inputs["causal"], inputs["block_q"], inputs["block_k"])
    out = as_tensor(result, f"FlashAttention.apply({_describe(inputs)})")  # detached, for the payload
    if not result.requires_grad:
        raise fail("FlashAttention.apply returned an output without a gradient: call it through apply, and return "
                   "the output of flash_forward from forward (not a detached copy made outside autograd)")
    grads = torch.autograd.grad(result, (q, k, v), inputs["grad_out"])
    return {"out": out, "dq": grads[0], "dk": grads[1], "dv": grads[2],
            "largest_saved": torch.tensor(max(saved, default=0))}


def _function_expected(inputs: Inputs) -> Outputs:
    """gptcourse.flash_attention, whose FlashAttention.apply takes the scale, window and padding mask too: the
    student's class is called with six arguments, hence `expected`."""
    q, k, v = (inputs[key].clone().requires_grad_() for key in ("q", "k", "v"))
    out = flash_attention(q, k, v, inputs["causal"], inputs["block_q"], inputs["block_k"])
    grads = torch.autograd.grad(out, (q, k, v), inputs["grad_out"])
    b, h, t, d = q.shape
    return {"out": out.detach(), "dq": grads[0], "dk": grads[1], "dv": grads[2],
            "largest_saved": torch.tensor(b * h * t * d)}


def _function_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    b, h, t, _ = inputs["q"].shape
    if int(got["largest_saved"]) >= b * h * t * t > int(expected["largest_saved"]):
        raise fail(f"forward saved a tensor of {int(got['largest_saved'])} numbers for the backward, B H T T = "
                   f"{b * h * t * t}: the (T, T) probabilities (the softmax). Save L (B, H, T), the log-sum-exp "
                   "that flash_forward returns, and let the backward recompute each tile's probabilities, "
                   "exp(s - L): that is what keeps memory linear in T")
    check_shape(got["out"], "B H T D", inputs["sizes"], "the output of FlashAttention.apply")
    for key in ("out", "dq", "dk", "dv"):
        check_close(got[key], expected[key], "the output" if key == "out" else f"{key} (from your backward)")


# Visible cases: causal, T not a multiple of the blocks, and a max that moves from tile to tile (q scaled by 1.5).
CAUSAL = (2, 3, 3, 10, 4, 4, 3, True)  # (B, H, H_kv, T, D, block_q, block_k, causal)
UNEVEN = (1, 2, 2, 11, 3, 4, 3, True)
PIECES = declare(
    Piece("12", "online_softmax", online_softmax, _merge_call, judge=_merge_judge, forbidden=_FORBIDDEN,
          visible=[("visible", "online_softmax: the state after 6 keys (B=2, 3 query rows, D=4) and a block of 5",
                    lambda seed: _merge_inputs(2, 3, 6, 5, 4, seed)),
                   ("max_moves", "online_softmax with a block whose scores are larger (the maximum moves)",
                    lambda seed: _merge_inputs(2, 3, 6, 5, 4, seed, jump=4.0))],
          hidden=[("hidden_first", "online_softmax on the first block (m = -inf, denom = 0, o = 0)",
                   lambda seed: _merge_inputs(1, 2, 0, 4, 3, seed)),
                  ("hidden_sizes", "online_softmax with other sizes", _merge_hidden)]),
    Piece("12", "flash_forward", _forward_with_tiles, _forward_call, judge=_forward_judge, forbidden=_FORBIDDEN,
          visible=[("visible", "flash_forward, causal, q, k, v (2, 3, 10, 4), blocks of 4 queries and 3 keys",
                    lambda seed: _attention_inputs(*CAUSAL, seed)),
                   ("tiles", "flash_forward, causal, T=10, blocks of 4 queries and 3 keys: the tiles on_tile sees "
                    "(9 of the 12)",
                    lambda seed: _attention_inputs(*CAUSAL, seed), TILES)],
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
    Piece("12", "flash_backward", flash_backward, _backward_call, judge=_backward_judge, forbidden=_FORBIDDEN,
          visible=[("visible", "flash_backward, causal, q, k, v (1, 2, 11, 3), blocks of 4 and 3",
                    lambda seed: _backward_inputs(*UNEVEN, seed))],
          hidden=[("hidden_one", "flash_backward with T=1", lambda seed: _backward_inputs(1, 1, 1, 1, 3, 2, 2, True,
                                                                                        seed)),
                  ("hidden_gqa", "flash_backward with grouped-query shapes (4 query heads, 2 kv heads): dk, dv sum "
                   "their group", lambda seed: _backward_inputs(2, 4, 2, 6, 3, 4, 2, True, seed)),
                  ("hidden_sizes", "flash_backward with other sizes", _backward_hidden)]),
    Piece("12", "FlashAttention", None, _function_call, expected=_function_expected, judge=_function_judge,
          forbidden=_FORBIDDEN,
          visible=[("visible", "FlashAttention.apply, causal, q, k, v (1, 2, 11, 3): output, gradients, what it "
                    "saves", lambda seed: _backward_inputs(*UNEVEN, seed))],
          hidden=[("hidden_gqa", "FlashAttention with grouped-query shapes (4 query heads, 2 kv heads), blocks of 4 "
                   "queries and 3 keys", lambda seed: _backward_inputs(2, 4, 2, 9, 3, 4, 3, True, seed)),
                  ("hidden_sizes", "FlashAttention with other sizes", _backward_hidden)]),
)
