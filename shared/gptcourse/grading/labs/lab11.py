"""Lab 11, inference: `LayerCache(capacity)` with `append(k, v)`, `attend_new_token(q, k, v)`,
`top_p_filter(logits, top_p)`, `repeat_kv(x, n_rep)`, `GroupedQueryAttention(d_model, n_heads, n_kv_heads)`,
`new_positions(past, t)` and `generate_cached(model, prompt, max_new_tokens)`.

Fixed names: the cache has `length` and `append(k, v)`, which returns every cached key and value (B, H, T_past + T,
D); the attention layer has `q_proj` (C -> C), `k_proj` and `v_proj` (C -> H_kv D) and `o_proj` (C -> C), all
nn.Linear without bias (Llama's names), and `forward(x, cache=None)`; `generate_cached` drives a model called as
`model(tokens, positions, caches)` and returns the tokens and each new token's logits. The references are
gptcourse's, except top-p's, the layer's and the generation's (each says why at its `expected`).
"""

from __future__ import annotations

import math
import random
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

from ...checks import CheckFailed, Mistake, check_close, check_dtype, check_shape, fail, fmt_shape, mistake_key
from ...inference.sampling import generate
from ...model.causal_attention import MultiHeadAttention, attention, repeat_kv
from ...model.config import GPTConfig
from ...model.gpt import GPT
from ...model.kv_cache import LayerCache
from ...model.mlp import make_mlp
from ...model.norms import make_norm
from ...model.positions import LearnedPositions, RotaryEmbedding, apply_rope
from ..attention_mistakes import (
    NO_SCALE,
    NOT_CAUSAL,
    ROWS,
    SOFTMAX_OVER_QUERIES,
    TILED_KV_HEADS,
    TOP_LEFT,
    attend_by_hand,
    kv_heads_by_hand,
    rows,
)
from ..cases import Inputs, Outputs, sized, tensor_rng
from ..fixtures import TILED_ATTENTION, gpt_with_tokens, load_gpt_weights, reference_gpt
from ..piece import Piece, Rows, declare
from ..student import as_tensor, as_tensors, build_module, returns

_CACHE = ("gptcourse.LayerCache", "gptcourse.KVCache", "gptcourse.model.kv_cache")
_ATTENTION = ("gptcourse.attention", "gptcourse.fused_attention", "gptcourse.MultiHeadAttention",
              "gptcourse.model.causal_attention", *TILED_ATTENTION)
_SAMPLING = ("gptcourse.filter_logits", "gptcourse.generate", "gptcourse.inference.sampling")
_WHOLE = ("gptcourse.DecoderBlock", "gptcourse.GPT")


def _sizes(b: int, h: int, t: int, d: int) -> dict[str, int]:
    return {"B": b, "H": h, "T": t, "D": d}


# ---- LayerCache(capacity).append(k, v) -> (all keys, all values), each (B, H, T_past + T, D)


def _cache_inputs(b: int, h: int, d: int, chunks: list[int], capacity: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    steps = [(torch.randn(b, h, t, d, generator=gen), torch.randn(b, h, t, d, generator=gen)) for t in chunks]
    return {"capacity": capacity, "steps": steps, "sizes": {"B": b, "H": h, "D": d}}


def _cache_call(cls: Any, inputs: Inputs) -> Outputs:
    cache = cls(inputs["capacity"])
    keys, values, lengths = [], [], []
    buffers = set()  # (part, where its storage starts, whether it holds `capacity` positions) of each returned tensor
    for k, v in inputs["steps"]:
        what = f"LayerCache({inputs['capacity']}).append(k, v) with k, v {fmt_shape(k.shape)} (call {len(keys) + 1})"
        got_k, got_v = as_tensors(cache.append(k.clone(), v.clone()), ("keys", "values"), what)
        full = k.numel() // k.size(2) * inputs["capacity"] * k.element_size()  # bytes of a (B, H, capacity, D) buffer
        buffers |= {(part, got.untyped_storage().data_ptr(), got.untyped_storage().nbytes() >= full)
                    for part, got in (("keys", got_k), ("values", got_v))}
        keys.append(got_k.clone())  # a copy now: a buffer the cache writes into later must not change it
        values.append(got_v.clone())
        length = getattr(cache, "length", None)
        if not isinstance(length, int):
            raise fail(f"the cache's `length` is {length!r} after call {len(keys)}, expected an int: how many "
                       "positions it holds")
        lengths.append(length)
    one_buffer = len(buffers) == 2 and all(holds_capacity for _, _, holds_capacity in buffers)
    return _pack({"keys": keys, "values": values, "lengths": lengths}) | {"one_buffer": one_buffer}


def _pack(steps: Outputs) -> Outputs:
    """Per-append lists as plain tensors (a case's outputs cross to the grader as tensors): each part flattened
    and concatenated, with the shapes to cut it apart again."""
    packed = {"lengths": torch.tensor(steps["lengths"])}
    for part in ("keys", "values"):
        packed[part] = torch.cat([t.flatten() for t in steps[part]])
        packed[f"{part}_shapes"] = torch.tensor([list(t.shape) if t.dim() == 4 else [-1] * 4 for t in steps[part]])
    return packed


def _unpack(packed: Outputs, part: str) -> list[torch.Tensor]:
    shapes = [tuple(s) for s in packed[f"{part}_shapes"].tolist()]
    if any(s[0] < 0 for s in shapes):
        raise fail(f"append returned {part} that are not 4-dimensional: expected (B, H, length, D) tensors")
    sizes = [math.prod(s) for s in shapes]
    return [flat.view(s) for flat, s in zip(packed[part].split(sizes), shapes, strict=True)]


def _cached(steps: list[tuple[torch.Tensor, torch.Tensor]], *, only_new: bool = False,
            swapped: bool = False) -> Outputs:
    """What the cache returns after each append, right or with one of the usual mistakes."""
    keys, values, lengths = [], [], []
    all_k, all_v = steps[0][0][:, :, :0], steps[0][1][:, :, :0]  # (B, H, 0, D)
    for k, v in steps:
        all_k, all_v = torch.cat([all_k, k], dim=2), torch.cat([all_v, v], dim=2)  # (B, H, T_past + T, D)
        got_k, got_v = (k, v) if only_new else (all_k, all_v)
        keys.append(got_v if swapped else got_k)
        values.append(got_k if swapped else got_v)
        lengths.append(all_k.size(2))
    return {"keys": keys, "values": values, "lengths": lengths}


AT_ZERO = (Mistake("11.cache_at_zero",
                   "the cache is written at position 0 every step: write the new positions after the cached ones, "
                   "buffer[:, :, length : length + T] = k, then advance length by T"))
CACHE_MISTAKES = {
    Mistake("11.cache_only_new",
            "append returns only the new keys and values: return every cached position, buffer[:, :, :length] after "
            "writing, so attention sees the whole prefix"): {"only_new": True},
    Mistake("11.cache_keys_values_swapped",
            "keys and values are swapped: return (keys, values) in that order"): {"swapped": True},
}


def _cache_mistakes(steps: list[tuple[torch.Tensor, torch.Tensor]], part: str, i: int,
                    shape: torch.Size) -> dict[str, torch.Tensor]:
    """{why: the `part` that append call i + 1 returns with that mistake}, those of the right `shape`: for a wrong
    one."""
    variants = {what: _cached(steps, **flags)[part][i] for what, flags in CACHE_MISTAKES.items()}
    return {what: v for what, v in variants.items() if v.shape == shape}


def _cache_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    if not torch.equal(got["lengths"], expected["lengths"]):
        raise fail(f"cache.length after each append is {got['lengths'].tolist()}, expected "
                   f"{expected['lengths'].tolist()}: it counts every position appended so far",
                   mistake="11.cache_length_wrong")
    one_buffer = got["one_buffer"]
    got = {part: _unpack(got, part) for part in ("keys", "values")}
    expected = _cached(inputs["steps"])
    sizes = inputs["sizes"]
    for i, length in enumerate(expected["lengths"]):
        for part in ("keys", "values"):
            name = f"the {part} returned by append call {i + 1}"
            if got[part][i].dim() == 4 and got[part][i].size(2) == inputs["capacity"] != length:
                raise fail(f"{name}: all {inputs['capacity']} positions of the buffer, expected the {length} written: "
                           "return buffer[:, :, :length], or attention reads the empty slots as keys",
                           mistake="11.cache_whole_buffer")
            new = inputs["steps"][i][0 if part == "keys" else 1]  # (B, H, T, D), what this call appended
            t = new.size(2)
            if t != length and torch.equal(got[part][i], new):
                raise fail(f"{name}: only the {t} position(s) just appended, expected all {length} cached so far: "
                           + next(iter(CACHE_MISTAKES)), mistake=next(iter(CACHE_MISTAKES)).key)
            check_shape(got[part][i], "B H T D", sizes | {"T": length}, name)
            if i and torch.equal(got[part][i][:, :, :t], new) and not torch.equal(expected[part][i][:, :, :t], new):
                raise fail(f"{name}: its first {t} position(s) are the ones just appended. {AT_ZERO}",
                           mistake=AT_ZERO.key)
            check_close(got[part][i], expected[part][i], name, atol=0, rtol=0,
                        mistakes=partial(_cache_mistakes, inputs["steps"], part, i, expected[part][i].shape))
    if not one_buffer:
        raise fail(f"the keys and values are right, but they are not views of one buffer of capacity = "
                   f"{inputs['capacity']} positions per part: each append made new tensors (torch.cat, or a copy of "
                   "the cache), which copies every cached position at every token. Allocate k.new_zeros(B, H, "
                   "capacity, D) once, at the first append, write only the new positions into it and return "
                   "buffer[:, :, :length]", mistake="11.cache_not_one_buffer")


@sized
def _cache_hidden(r: random.Random, seed: int) -> Inputs:
    chunks = [r.randint(1, 5)] + [1] * r.randint(2, 5) + [r.randint(2, 3)]
    return _cache_inputs(r.randint(1, 3), r.choice([1, 2, 4]), r.choice([2, 4, 6]), chunks, sum(chunks) + 3, seed)


# ---- attend_new_token(q (B, H, 1, D), k, v (B, H, T, D)) -> (B, H, 1, D)


def _one_token_inputs(b: int, h: int, t: int, d: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=gen) for n in (1, t, t))
    return {"q": 1.5 * q, "k": k, "v": v, "sizes": _sizes(b, h, 1, d)}  # the sizes of the output


def _one_token_large(b: int, h: int, t: int, seed: int) -> Inputs:
    """Scores in the hundreds, where exp() overflows float32 (past 88): whole numbers, and D = 4 so sqrt(D) = 2,
    so that every order of the products and the scaling gives the same scores exactly."""
    gen = tensor_rng(seed)
    q, k = torch.randint(-100, 101, (b, h, 1, 4), generator=gen), torch.randint(-3, 4, (b, h, t, 4), generator=gen)
    return {"q": q.float(), "k": k.float(), "v": torch.randn(b, h, t, 4, generator=gen), "sizes": _sizes(b, h, 1, 4)}


def _new_token_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """gptcourse's attention, which also returns the weights: only its output is the piece's."""
    return attention(q, k, v)[0]


def _new_token_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, only_itself: bool = False,
                       **switches: Any) -> torch.Tensor:
    """The new token's attention (B, H, 1, D) by hand: `attend_by_hand` with its switches, or (`only_itself`) the
    new token's own value alone."""
    return v[:, :, -1:] if only_itself else attend_by_hand(q, k, v, **switches)[0]


_ONE_TOKEN_MISTAKES = {
    TOP_LEFT: {"top_left": True},
    Mistake("11.one_token_sees_itself",
            "the new token sees only itself: it attends over every cached key and its own, not just the newest"):
        {"only_itself": True},
    **rows(NO_SCALE),
    Mistake(SOFTMAX_OVER_QUERIES.key, f"{SOFTMAX_OVER_QUERIES}: with one query every weight is then 1"):
        ROWS[SOFTMAX_OVER_QUERIES],
}


def _one_token_overflow(inputs: Inputs) -> str:
    top = float((inputs["q"] @ inputs["k"].transpose(-2, -1)).abs().max()) / math.sqrt(inputs["q"].size(-1))
    return Mistake("11.one_token_overflow",
                   f"attend_new_token output has NaN or inf for scores as large as {top:.0f}: exp() overflows float32 "
                   "past 88. Subtract each row's largest score before exp (the softmax is unchanged by a shift), as "
                   "torch.softmax does")


# ---- top_p_filter(logits (B, V), top_p) -> logits with -inf outside the nucleus


def _top_p_inputs(b: int, v: int, top_p: float, spread: float, seed: int) -> Inputs:
    logits = torch.randn(b, v, generator=tensor_rng(seed)) * spread  # continuous: no ties at the boundary
    return {"logits": logits, "top_p": top_p, "sizes": {"B": b, "V": v}}


def _top_p_large(b: int, v: int, top_p: float, seed: int) -> Inputs:
    """Every other row shifted into the hundreds, where exp() overflows float32 (past 88); a shift by the row's
    largest logit is exact there (each row's logits are within a factor 2 of each other), so a stable softmax
    gives those rows the probabilities of an ordinary row."""
    inputs = _top_p_inputs(b, v, top_p, 1.5, seed)
    inputs["logits"][1::2] += torch.randint(100, 1000, (b // 2, 1), generator=tensor_rng(seed + 1))
    return inputs


def _nucleus(logits: torch.Tensor, top_p: float, *, before: bool = True, ascending: bool = False,
             of_logits: bool = False, sort: bool = True, scatter: bool = True, first: bool = False,
             alone: bool = False, complement: bool = False) -> torch.Tensor:
    """Which tokens (B, V) the nucleus keeps: sorted by probability, a token stays while the mass of the tokens
    *before* it is still below top_p (so the token that reaches top_p stays too). Each switch is a known mistake:
    kept while the mass up to it is <= top_p (`before` False), sorted least likely first, the logits added up, no
    sort, no scatter back, the most likely token kept anyway (`first`), each token's own probability compared with
    top_p (`alone`), the threshold 1 - top_p (`complement`)."""
    top_p = 1 - top_p if complement else top_p
    if sort:
        ordered, order = logits.sort(dim=-1, descending=not ascending)
    else:
        ordered, order = logits, torch.arange(logits.size(-1)).expand_as(logits)
    mass = ordered if of_logits else ordered.softmax(dim=-1)
    cumulative = mass.cumsum(dim=-1)  # (B, V)
    if alone:
        keep = mass >= top_p
    else:
        keep = (cumulative - mass < top_p) if before else (cumulative <= top_p)
    keep[..., 0] |= first  # the most likely token kept whatever the rule says
    return keep.scatter(-1, order, keep) if scatter else keep  # back to vocabulary order


def _top_p_expected(inputs: Inputs) -> Outputs:
    """The nucleus summed most likely first, as the lab asks: gptcourse.filter_logits sums from the least likely
    end (Hugging Face's order), whose rounding can decide a token at the boundary the other way."""
    logits = inputs["logits"]
    return {"filtered": logits.masked_fill(~_nucleus(logits, inputs["top_p"]), float("-inf"))}


def _above_threshold(key: str, aside: str = "") -> Mistake:
    """A nucleus of the tokens whose mass reaches top_p without the one that crosses it, `aside` what else."""
    return Mistake(key, f"top-p keeps the tokens *above* the threshold{aside}: the smallest set of the most likely "
                   "tokens whose mass reaches p; the token that crosses p stays (keep a token while the mass before "
                   "it is < p)")


def _top_p_rows(p: float) -> Rows:
    """The known mistakes of a top-p filter, {why: switches of `_nucleus`}."""
    return {
        _above_threshold("11.top_p_above_threshold"):
            {"before": False},
        _above_threshold("11.top_p_above_threshold_first_kept",
                         " (keeping the most likely token anyway does not make up for it)"):
            {"before": False, "first": True},
        Mistake("11.top_p_ascending",
                "the tokens are sorted least likely first: sort by descending probability, the nucleus is the head"):
            {"ascending": True},
        Mistake("11.top_p_ascending_kept_le_p",
                "the tokens are sorted least likely first and kept while their mass is <= p, so the least likely "
                "tokens are kept: sort by descending probability and keep the head, or (Hugging Face's order, "
                "ascending) mask the tokens whose cumulative mass is <= 1 - top_p"):
            {"ascending": True, "before": False},
        Mistake("11.top_p_cumsum_of_logits",
                "the cumulative sum runs over the logits: take it over the probabilities, softmax(sorted logits)"):
            {"of_logits": True},
        Mistake("11.top_p_unsorted",
                "the probabilities were added up in vocabulary order, unsorted: the nucleus is the most likely tokens, "
                "so sort them by descending probability first (logits.sort(dim=-1, descending=True)), add up, and "
                "scatter the decision back to vocabulary order"):
            {"sort": False},
        Mistake("11.top_p_not_scattered_back",
                "the tokens kept are in sorted order: the decision was made on the sorted logits and never scattered "
                "back, so token i is no longer at index i. Put it back in vocabulary order, keep.scatter(-1, order, "
                "keep) (or scatter the sorted logits back with the sort's indices)"):
            {"scatter": False},
        Mistake("11.top_p_own_probability",
                "each token's own probability was compared with p: top-p adds the probabilities up, most likely first"):
            {"alone": True, "sort": False},
        Mistake("11.top_p_threshold_one_minus_p",
                "the threshold is 1 - top_p: the nucleus is the most likely tokens whose mass reaches top_p itself "
                f"(top_p={p} keeps {p:.0%} of the probability), so keep a token while the mass before it is < top_p"):
            {"complement": True},
    }


def _top_p_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    logits, p, filtered = inputs["logits"], inputs["top_p"], got["filtered"]
    check_shape(filtered, "B V", inputs["sizes"], "top_p_filter output")
    kept, want = ~torch.isneginf(filtered), ~torch.isneginf(expected["filtered"])
    nuclei = {why: partial(_nucleus, logits, p, **switches) for why, switches in _top_p_rows(p).items()}
    if bool(want.logical_not().any()) and bool(kept.all()):
        known = next((why for why, nucleus in nuclei.items() if torch.equal(nucleus(), kept)), None)
        if known and torch.equal(filtered, logits):  # -inf used right, but every token kept
            raise fail(f"top_p_filter kept every token, {kept.numel()} of them, where the nucleus leaves out "
                       f"{int(want.logical_not().sum())}: {known}", mistake=mistake_key(known))
        raise fail("top_p_filter set no logit to -inf: the tokens outside the nucleus must become -inf (not 0, "
                   "which exp() turns into probability), so that the softmax gives them nothing",
                   mistake="11.top_p_no_neg_inf")
    wrong = (kept != want).any(dim=-1)  # (B,): the rows with a token decided the other way
    whole = kept.all(dim=-1) | ~kept.any(dim=-1)  # (B,): the rows kept or masked entirely
    if bool(wrong.any()) and bool((~wrong | (torch.isinf(logits.exp()).any(dim=-1) & whole)).all()):
        raise fail(f"top_p_filter {'kept' if bool(kept[wrong].all()) else 'masked'} every token of the rows with "
                   f"logits as large as {float(logits[wrong].max()):.0f}, and is right on the others: exp() overflows "
                   "float32 past 88, so exp(logits) / exp(logits).sum() is inf / inf = NaN there. Subtract each "
                   "row's largest logit before exp (the softmax is unchanged by a shift), or use torch.softmax",
                   mistake="11.top_p_overflow")
    if not bool(kept.any(dim=-1).all()):
        known = next((why for why, nucleus in nuclei.items() if torch.equal(nucleus(), kept)), None)
        raise fail("top_p_filter masked every token of a row: the most likely token always stays (its mass alone "
                   "may already reach top_p)" + (f". {known}" if known else ""), mistake=mistake_key(known))
    check_close(kept, want, "which tokens are kept (1) and masked to -inf (0)", atol=0, rtol=0, mistakes=nuclei)
    if not torch.equal(filtered[kept], logits[kept]):
        raise fail("the kept logits changed: top_p_filter only masks the others with -inf and returns logits, not "
                   "probabilities (the sampler applies the softmax)", mistake="11.top_p_logits_changed")


# ---- repeat_kv(x (B, H_kv, T, D), n_rep) -> (B, H_kv * n_rep, T, D)


def _repeat_inputs(b: int, h_kv: int, t: int, d: int, n_rep: int, seed: int) -> Inputs:
    return {"x": torch.randn(b, h_kv, t, d, generator=tensor_rng(seed)), "n_rep": n_rep,
            "sizes": _sizes(b, h_kv * n_rep, t, d)}


# ---- GroupedQueryAttention(d_model, n_heads, n_kv_heads): forward(x, cache=None), x (B, T, C) -> (B, T, C)


def _gqa_inputs(b: int, t: int, h: int, h_kv: int, d: int, seed: int, chunks: list[int] | None = None) -> Inputs:
    gen = tensor_rng(seed)
    c = h * d
    shapes = {"q_proj.weight": (c, c), "k_proj.weight": (h_kv * d, c), "v_proj.weight": (h_kv * d, c),
              "o_proj.weight": (c, c)}
    weights = {name: 1.5 * torch.randn(shape, generator=gen) / math.sqrt(c) for name, shape in shapes.items()}
    return {"init": {"d_model": c, "n_heads": h, "n_kv_heads": h_kv}, "weights": weights,
            "x": torch.randn(b, t, c, generator=gen), "chunks": chunks, "sizes": {"B": b, "T": t, "C": c}}


def _gqa_what(inputs: Inputs) -> str:
    i = inputs["init"]
    return f"GroupedQueryAttention({i['d_model']}, n_heads={i['n_heads']}, n_kv_heads={i['n_kv_heads']})"


class _Tape:
    """The cache `_gqa_run` hands the student's module: keys and values concatenated, nothing more. Not
    gptcourse.LayerCache, which a graded kernel does not have (the lab forbids it: `package_view.py`); without
    a capacity or a `length`, it is no answer to the cache piece either."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        self.k = k if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = v if self.v is None else torch.cat([self.v, v], dim=-2)
        return self.k, self.v


def _gqa_call(cls: Any, inputs: Inputs) -> Outputs:
    module, x = build_module(cls, _gqa_what(inputs), inputs["init"], inputs["weights"]), inputs["x"]
    what = f"{_gqa_what(inputs)} on x {fmt_shape(x.shape)}"
    with torch.no_grad():
        if inputs["chunks"] is None:
            return {"y": as_tensor(module(x.clone()), what)}
        cache, outputs, start = _Tape(), [], 0
        for t in inputs["chunks"]:  # a prefill, then one token at a time, each reading and extending the cache
            outputs.append(as_tensor(module(x[:, start : start + t].clone(), cache=cache), f"{what}, cached"))
            start += t
    cached_heads = cache.k.size(1) if cache.k is not None else 0
    return {"y": torch.cat(outputs, dim=1), "cached_heads": cached_heads}


def _gqa_expected(inputs: Inputs) -> Outputs:
    """gptcourse.MultiHeadAttention with the same weights: it has one stacked `qkv` projection where the lab's
    layer has Llama's q_proj, k_proj and v_proj."""
    i, w = inputs["init"], inputs["weights"]
    mha = MultiHeadAttention(i["d_model"], i["n_heads"], bias=False, n_kv_heads=i["n_kv_heads"])
    mha.load_state_dict({"qkv.weight": torch.cat([w["q_proj.weight"], w["k_proj.weight"], w["v_proj.weight"]]),
                         "out.weight": w["o_proj.weight"]})
    with torch.no_grad():
        y = mha(inputs["x"])
    return {"y": y} if inputs["chunks"] is None else {"y": y, "cached_heads": i["n_kv_heads"]}


def _gqa_variant(inputs: Inputs, *, tiled: bool = False, causal: bool = True, scale: bool = True,
                 top_left: bool = False, transpose: bool = True) -> torch.Tensor:
    """The layer's output computed by hand, right or with one of the usual mistakes; `top_left` aligns each
    chunk's causal mask with the first cached key instead of its own positions; without `causal` each query sees
    every key fed so far, its chunk's included; without `transpose` each chunk fed is viewed straight as
    (B, H, T, D) and back."""
    i, w, x = inputs["init"], inputs["weights"], inputs["x"]
    b, t, c = x.shape
    h, h_kv = i["n_heads"], i["n_kv_heads"]
    d = c // h
    chunks = inputs["chunks"] or [t]

    def heads(z: torch.Tensor, n: int) -> torch.Tensor:  # (B, T, n * D) -> (B, n, T, D)
        if transpose:
            return z.view(b, t, n, d).transpose(1, 2)
        return torch.cat([piece.reshape(b, n, piece.size(1), d) for piece in z.split(chunks, dim=1)], dim=2)

    q = heads(x @ w["q_proj.weight"].T, h)  # (B, H, T, D)
    k, v = (heads(x @ w[f"{n}_proj.weight"].T, h_kv) for n in "kv")  # (B, H_kv, T, D)
    k, v = (kv_heads_by_hand(z, h // h_kv, tiled=tiled) for z in (k, v))  # (B, H, T, D)
    scores = q @ k.transpose(-2, -1) / (math.sqrt(d) if scale else 1.0)  # (B, H, T, T)
    starts = torch.cat([torch.full((n,), sum(chunks[:j])) for j, n in enumerate(chunks)])  # (T,) chunk start
    ends = torch.cat([torch.full((n,), sum(chunks[: j + 1])) for j, n in enumerate(chunks)])  # (T,) chunk end
    # (T,): the last key each query may see; without the causal mask, every key fed so far (its chunk's included)
    last_seen = torch.arange(t) - (starts if top_left else 0) if causal else ends - 1
    scores = scores.masked_fill(torch.arange(t)[None, :] > last_seen[:, None], float("-inf"))
    y = scores.softmax(dim=-1) @ v  # (B, H, T, D)
    if transpose:
        y = y.transpose(1, 2).reshape(b, t, c)  # (B, T, C)
    else:
        y = torch.cat([piece.reshape(b, piece.size(2), c) for piece in y.split(chunks, dim=2)], dim=1)
    return y @ w["o_proj.weight"].T


def _gqa_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["y"], "B T C", inputs["sizes"], "GroupedQueryAttention output")
    h, h_kv = inputs["init"]["n_heads"], inputs["init"]["n_kv_heads"]
    cached = inputs["chunks"] is not None
    mistakes = {NOT_CAUSAL: partial(_gqa_variant, inputs, causal=False),
                NO_SCALE: partial(_gqa_variant, inputs, scale=False),
                Mistake("11.gqa_split_view",
                   "the heads were split by a view straight to (B, H, T, D): a (B, T, C) projection is (B, T, H, D) in "
                   "memory, so each such head mixes positions. Split with .view(B, T, H, D).transpose(1, 2), and merge "
                   "back with .transpose(1, 2).reshape(B, T, C)"): partial(_gqa_variant, inputs, transpose=False)}
    if h_kv < h:
        tiled = Mistake(TILED_KV_HEADS.key, f"{TILED_KV_HEADS} (here G = {h // h_kv})")
        mistakes[tiled] = partial(_gqa_variant, inputs, tiled=True)
    if cached:
        mistakes[TOP_LEFT] = partial(_gqa_variant, inputs, top_left=True)
    name = "GroupedQueryAttention output" + (" (a prefill, then one token at a time with the cache)" if cached else "")
    check_close(got["y"], expected["y"], name, mistakes=mistakes)
    if cached and got["cached_heads"] != h_kv:
        raise fail(f"the cache holds {got['cached_heads']} heads, expected H_kv = {h_kv}: append k and v *before* "
                   "repeat_kv, so the cache stores only the kv heads (that is what GQA saves)",
                   mistake="11.gqa_cache_after_repeat")


@sized
def _gqa_hidden(r: random.Random, seed: int) -> Inputs:
    h_kv, t = 2, r.randint(3, 9)  # groups of 2 or 3 query heads (one kv head is hidden_mqa's)
    prefill = r.randint(1, t - 1)
    return _gqa_inputs(r.randint(1, 3), t, h_kv * r.choice([2, 3]), h_kv, r.choice([2, 4]), seed,
                       chunks=[prefill] + [1] * (t - prefill) if r.random() < 0.5 else None)


# ---- new_positions(past, t) -> the positions (T,) of t new tokens after `past` cached ones


def _positions_inputs(past: int, t: int) -> Inputs:
    return {"past": past, "t": t, "sizes": {"T": t}}


def _gpt_positions(past: int, t: int) -> torch.Tensor:
    """The positions gptcourse.GPT gives t new tokens when its cache holds `past`: a learned-position model is
    prefilled with `past` tokens and its position table's lookup of the next t is recorded."""
    config = GPTConfig(vocab_size=2, context_length=past + t, d_model=4, n_heads=1, n_layers=1)
    with torch.random.fork_rng(devices=[]), torch.no_grad():  # its random init must not move the caller's state
        model, seen = GPT(config).eval(), []
        cache = model.new_cache()
        if past:
            model(torch.zeros(1, past, dtype=torch.long), cache=cache)
        hook = model.pos_emb.register_forward_hook(lambda module, args, out: seen.append(args[0]))
        model(torch.zeros(1, t, dtype=torch.long), cache=cache)
        hook.remove()
    return seen[0]  # (T,)


POSITIONS_FROM_ZERO = (Mistake("11.positions_from_zero",
                            "the positions start at 0 in every call: the new tokens come after the `past` cached ones, "
                            "so they are at torch.arange(past, past + t)"))
POSITIONS_PAST_PLUS_ONE = (Mistake("11.positions_past_plus_one",
                           "the positions start at past + 1: positions count from 0, so the cache holds 0 ... past - 1 "
                           "and the first new token is at position past"))
PROMPT_COUNTED_TWICE = (Mistake("11.prompt_counted_twice",
                              "the prompt was counted twice: the prefill already moved the offset to P, and adding the "
                              "prompt's length again puts the first new token at 2P; after the prefill each call "
                              "advances it by the tokens it fed"))


def _positions_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    past, t, positions = inputs["past"], inputs["t"], got["positions"]
    if past and tuple(positions.shape) == (past + t,):
        raise fail(f"new_positions(past={past}, t={t}) returned {past + t} positions, those of the whole sequence: "
                   "return only the t new tokens', torch.arange(past, past + t) (the cached ones already have theirs)",
                   mistake="11.positions_whole_sequence")
    check_shape(positions, "T", inputs["sizes"], "the positions")
    check_dtype(positions, torch.int64, "the positions", "they index the position table and the RoPE angles: "
                                                         "torch.long, as torch.arange(past, past + t) gives")
    check_close(positions, expected["positions"], f"the positions of {t} new token(s) after {past} cached", atol=0,
                rtol=0, mistakes={
                    POSITIONS_FROM_ZERO: lambda: torch.arange(t),
                    POSITIONS_PAST_PLUS_ONE: lambda: torch.arange(t) + past + 1,
                    Mistake("11.positions_all_past",
                        "every new token got position past: the t new tokens are at past, past + 1, ..., past + t - 1"):
                        lambda: torch.full((t,), past)})


# ---- generate_cached(model, prompt (B, P), max_new_tokens) -> (tokens (B, P + N), logits (B, N, V)), greedy


class _CachedGPT(nn.Module):
    """The model `generate_cached` drives: gptcourse.GPT's computation (same parameter names, so the same weights
    load), but each call is handed its tokens' positions and one cache per layer, model(tokens, positions, caches)
    -> logits (B, T, V), and records what it was fed for the judge. Not gptcourse.GPT, which a graded kernel of
    this lab does not have (`package_view.py`); it attends with the mask the lab's section 5 states."""

    def __init__(self, config: GPTConfig, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        c = config
        self.n_layers, self.context_length, self.n_heads, self.position = (c.n_layers, c.context_length, c.n_heads,
                                                                           c.position)
        self.tok_emb = nn.Embedding(c.vocab_size, c.d_model)
        self.pos_emb = LearnedPositions(c.context_length, c.d_model) if c.position == "learned" else None
        self.rope = RotaryEmbedding(c.d_head, c.context_length, c.rope_theta) if c.position == "rope" else None
        self.blocks = nn.ModuleList(nn.ModuleDict({
            "norm1": make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias),
            "attn": nn.ModuleDict({"qkv": nn.Linear(c.d_model, 3 * c.d_model, bias=c.attn_bias),
                                   "out": nn.Linear(c.d_model, c.d_model, bias=c.attn_bias)}),
            "norm2": make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias),
            "mlp": make_mlp(c.mlp, c.d_model, c.hidden_width, c.mlp_bias)}) for _ in range(c.n_layers))
        self.final_norm = make_norm(c.norm, c.d_model, c.norm_eps, c.norm_bias)
        self.lm_head = nn.Linear(c.d_model, c.vocab_size, bias=c.lm_head_bias)
        if c.tie_weights:
            self.lm_head.weight = self.tok_emb.weight
        load_gpt_weights(self, c, weights, "the lab's model")
        self.fed: list[torch.Tensor] = []  # the tokens (B, T) of each call
        self.positions: list[torch.Tensor] = []  # the positions (T,) of each call

    def forward(self, tokens: torch.Tensor, positions: torch.Tensor, caches: Any) -> torch.Tensor:
        what = "model(tokens, positions, caches)"
        if not isinstance(caches, (list, tuple)) or len(caches) != self.n_layers:
            raise fail(f"{what}: caches must be a list of model.n_layers = {self.n_layers} caches, one per layer "
                       f"(your LayerCache(model.context_length)), got {type(caches).__name__}")
        if not isinstance(positions, torch.Tensor) or tuple(positions.shape) != (tokens.size(1),) or \
                positions.is_floating_point():
            got = fmt_shape(positions.shape) if isinstance(positions, torch.Tensor) else type(positions).__name__
            raise fail(f"{what}: positions must be a (T,) tensor of ints, one per token fed ({tokens.size(1)}), got "
                       f"{got}: new_positions(cache.length, T)")
        positions = positions.long()
        if bool((positions < 0).any()) or bool((positions >= self.context_length).any()):
            raise fail(f"{what}: positions {positions.tolist()} fall outside 0 ... context_length - 1 = "
                       f"{self.context_length - 1}; after the prefill, feed only the newest token, at position "
                       "cache.length (the cache holds the others)")
        self.fed.append(tokens.detach().clone())
        self.positions.append(positions.clone())
        x = self.tok_emb(tokens)  # (B, T, C)
        if self.pos_emb is not None:
            x = x + self.pos_emb(positions)
        rope = self.rope(positions) if self.rope is not None else None  # cos, sin, each (T, D)
        for block, cache in zip(self.blocks, caches, strict=True):
            x = x + self._attention(block["attn"], block["norm1"](x), rope, cache)
            x = x + block["mlp"](block["norm2"](x))
        return self.lm_head(self.final_norm(x))  # (B, T, V)

    def _attention(self, attn: nn.ModuleDict, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None,
                cache: Any) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = attn["qkv"](x).view(b, t, 3, self.n_heads, c // self.n_heads).permute(2, 0, 3, 1, 4)  # (B, H, T, D)
        if rope is not None:
            q, k = apply_rope(q, *rope), apply_rope(k, *rope)
        k, v = as_tensors(cache.append(k, v), ("keys", "values"), "cache.append(k, v)")  # (B, H, T_k, D)
        t_k = k.size(2)
        mask = torch.ones(t, t_k, dtype=torch.bool).tril(diagonal=t_k - t)  # the new queries are the last rows
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # (B, H, T, D)
        return attn["out"](y.transpose(1, 2).reshape(b, t, c))


def _generate_call(fn: Any, inputs: Inputs) -> Outputs:
    model, prompt, n = _CachedGPT(inputs["config"], inputs["weights"]).eval(), inputs["prompt"], inputs["new"]
    with torch.no_grad():
        out = fn(model, prompt.clone(), n)
    tokens, logits = as_tensors(out, ("tokens", "logits"),
                                f"generate_cached(model, prompt {fmt_shape(prompt.shape)}, max_new_tokens={n})")
    return {"tokens": tokens, "logits": logits, "fed": torch.tensor([f.size(1) for f in model.fed], dtype=torch.long),
            "fed_tokens": torch.cat([prompt[:, :0], *model.fed], dim=1), "positions": torch.cat(
                [torch.zeros(0, dtype=torch.long), *model.positions])}


def _generate_expected(inputs: Inputs) -> Outputs:
    """Recomputation: gptcourse.generate without the cache runs the whole sequence at every step, and each new
    token's logits are the model's at the position before it. The lab's interface (a model handed positions and
    caches, returning the logits too) is not generate's, hence `expected`."""
    model, prompt, n = reference_gpt(inputs["config"], inputs["weights"]), inputs["prompt"], inputs["new"]
    tokens = generate(model, prompt, n, temperature=0, use_cache=False)  # (B, P + N)
    with torch.no_grad():
        logits = model(tokens[:, :-1])[:, prompt.size(1) - 1 :]  # (B, N, V)
    p = prompt.size(1)  # the calls: a prefill of the prompt, then each new token but the last, once
    return {"tokens": tokens, "logits": logits, "fed": torch.tensor([p] + [1] * (n - 1)),
            "fed_tokens": tokens[:, :-1], "positions": torch.arange(p + n - 1)}


def _generate_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    prompt, n, config = inputs["prompt"], inputs["new"], inputs["config"]
    (b, p), fed = prompt.shape, got["fed"].tolist()
    tokens, logits = got["tokens"], got["logits"]
    check_shape(tokens, "B T", {"B": b, "T": p + n}, "the returned tokens (the prompt and the new tokens)")
    check_dtype(tokens, torch.int64, "the returned tokens", "token ids are torch.long")
    if not torch.equal(tokens[:, :p], prompt):
        raise fail("the returned tokens do not begin with the prompt: return torch.cat([prompt, new tokens], dim=1)",
                   mistake="11.generate_no_prompt")
    if not fed or fed[0] != p:
        raise fail(f"the first call fed {fed[0] if fed else 'nothing'} token(s), expected the whole prompt, P = {p}: "
                   "the prefill caches the prompt's keys and values, and its last logits give the first new token",
                   mistake="11.generate_no_prefill")
    if any(t != 1 for t in fed[1:]):
        i = next(i for i, t in enumerate(fed) if i and t != 1)
        whole = fed[i] == sum(fed[:i]) + 1
        raise fail(f"call {i + 1} fed {fed[i]} tokens" + (", the whole sequence again" if whole else "") + ": after "
                   "the prefill feed only the newest token, tokens[:, -1:]; the cache already holds the others, and "
                   "feeding them again appends their keys and values a second time",
                   mistake="11.generate_refeeds_sequence")
    starts = [sum(fed[:i]) for i in range(len(fed))]  # each call's first position: the cache's length
    stream = got["fed_tokens"]  # (B, total): every token fed, in order
    if not torch.equal(stream, tokens[:, : stream.size(1)]):
        refed = torch.cat([prompt, prompt[:, -1:], tokens[:, p:]], dim=1)[:, : stream.size(1)]
        if torch.equal(stream, refed):
            raise fail("the last prompt token was fed again after the prefill, so the cache holds it twice: the "
                       "prefill's logits[:, -1] already predict the first new token; feed that one next",
                       mistake="11.generate_last_prompt_token_refed")
        i = next(i for i, (s, t) in enumerate(zip(starts, fed, strict=True))
                 if not torch.equal(stream[:, s : s + t], tokens[:, s : s + t]))
        raise fail(f"call {i + 1} fed a token that is not the sequence's next one: feed each new token once, the one "
                   "just chosen (a token fed twice is appended to the cache twice)",
                   mistake="11.generate_token_fed_twice")
    for i, (start, positions) in enumerate(zip(starts, got["positions"].split(fed), strict=True)):
        right = torch.arange(start, start + fed[i])  # (T,)
        if not torch.equal(positions, right):
            if torch.equal(positions, right - start):
                which = Mistake(POSITIONS_FROM_ZERO.key, f"{POSITIONS_FROM_ZERO}; " + (
                    "with RoPE its query and key are rotated as if it were first, so its angle to every cached key "
                    "is wrong" if config.position == "rope" else "it gets row 0 of the learned position table"))
            elif torch.equal(positions, right + 1):
                which = POSITIONS_PAST_PLUS_ONE
            elif i and torch.equal(positions, right + p):
                which = PROMPT_COUNTED_TWICE
            else:
                which = "each token's position is its index in the sequence"
            raise fail(f"call {i + 1}, with {start} cached, gave its token(s) the positions {positions.tolist()}, "
                       f"expected {right.tolist()}: {which}. Pass new_positions(cache.length, T), the cache's length "
                       "before the call", mistake=mistake_key(which))
    check_shape(logits, "B N V", {"B": b, "N": n, "V": config.vocab_size},
                "the returned logits (each new token's, the row its argmax came from)")
    with torch.no_grad():  # the prefill's logits[:, 0]: the prediction after the first prompt token
        after_first = reference_gpt(config, inputs["weights"])(prompt[:, :1])[:, 0]  # (B, V)
    if p > 1 and torch.allclose(logits[:, 0], after_first, atol=1e-4):
        raise fail("the first new token's logits are the prefill's logits[:, 0], the prediction after the first "
                   "prompt token: the prefill returns one row per prompt position, and the one that predicts the "
                   "next token is the last, logits[:, -1]", mistake="11.generate_prefill_first_logits")
    try:
        check_close(logits, expected["logits"], "the logits of each new token (cached vs recomputed)", atol=1e-4)
    except CheckFailed as wrong:
        raise fail(f"{wrong} The calls were right (the prompt, then one token each, at the cache's positions): "
                   "does the cache (your LayerCache) return every key and value appended so far?") from None
    if not torch.equal(tokens, expected["tokens"]):
        raise fail("the new tokens are not the argmax of their logits: greedy decoding takes "
                   "logits[:, -1].argmax(dim=-1, keepdim=True) at every step", mistake="11.generate_not_argmax")


@sized
def _generate_hidden(r: random.Random, seed: int) -> Inputs:
    h = r.choice([1, 2])
    position = r.choice(["learned", "rope"])
    config = GPTConfig(vocab_size=r.randint(20, 40), context_length=48, d_model=8 * h, n_heads=h,
                       n_layers=r.randint(1, 2), position=position, tie_weights=False)
    return gpt_with_tokens(config, seed, (r.randint(1, 3), r.randint(1, 6)), "prompt", new=r.randint(2, 6))


# Untied heads: with a tied one a token's own embedding dominates its logits, so the model tends to repeat its
# input, and a loop that feeds the wrong token could produce the right one.
LLAMA = GPTConfig(vocab_size=32, context_length=48, d_model=16, n_heads=2, n_layers=2, position="rope",
                  norm="rmsnorm", mlp="swiglu", attn_bias=False, mlp_bias=False, tie_weights=False)
GPT2 = GPTConfig(vocab_size=29, context_length=48, d_model=12, n_heads=3, n_layers=2, tie_weights=False)


PIECES = declare(
    Piece("11", "LayerCache", LayerCache, _cache_call, judge=_cache_judge, forbidden=_CACHE + _WHOLE,
          visible=[("visible", "LayerCache(12): a prefill of 4 positions, then 3 single tokens (B=2, H=2, D=4)",
                    lambda seed: _cache_inputs(2, 2, 4, [4, 1, 1, 1], 12, seed))],
          hidden=[("hidden_full", "LayerCache filled one token at a time up to its capacity, batch 1",
                   lambda seed: _cache_inputs(1, 3, 2, [1] * 6, 6, seed)),
                  ("hidden_sizes", "LayerCache with other sizes and chunks", _cache_hidden)]),
    Piece("11", "attend_new_token", _new_token_attention,
          returns("y", lambda i: f"attend_new_token(q {fmt_shape(i['q'].shape)}, k, v {fmt_shape(i['k'].shape)})",
                  "q", "k", "v"), label="attend_new_token output", shape="B H T D", mistakes=_ONE_TOKEN_MISTAKES,
          by_hand=_new_token_by_hand,
          finite=_one_token_overflow, forbidden=_ATTENTION + _WHOLE,
          visible=[("visible", "attend_new_token with q (2, 3, 1, 4) against 7 cached keys",
                    lambda seed: _one_token_inputs(2, 3, 7, 4, seed)),
                   ("large", "attend_new_token with scores in the hundreds (exp() overflows: a stable softmax needed)",
                    lambda seed: _one_token_large(2, 2, 6, seed))],
          hidden=[("hidden_first", "attend_new_token on the first token (T=1: it sees only itself)",
                   lambda seed: _one_token_inputs(1, 2, 1, 4, seed)),
                  ("hidden_sizes", "attend_new_token with other sizes",
                   sized(lambda r, seed: _one_token_inputs(r.randint(1, 3), r.choice([1, 3, 4]), r.randint(2, 12),
                                                           r.choice([4, 6, 8]), seed)))]),
    Piece("11", "top_p_filter", None,
          returns("filtered", lambda i: f"top_p_filter(logits {fmt_shape(i['logits'].shape)}, top_p={i['top_p']})",
                  "logits", "top_p"), expected=_top_p_expected, judge=_top_p_judge,
          forbidden=_SAMPLING,
          visible=[("visible", "top_p_filter of logits (4, 20) with top_p=0.9",
                    lambda seed: _top_p_inputs(4, 20, 0.9, 1.5, seed)),
                   ("skewed", "top_p_filter of a skewed distribution (4, 30) with top_p=0.5",
                    lambda seed: _top_p_inputs(4, 30, 0.5, 4.0, seed)),
                   ("large", "top_p_filter of logits (4, 16) with top_p=0.8, two rows in the hundreds (exp() "
                    "overflows: a stable softmax needed)", lambda seed: _top_p_large(4, 16, 0.8, seed))],
          hidden=[("hidden_all", "top_p_filter with top_p=1.0 (nothing is filtered)",
                   lambda seed: _top_p_inputs(2, 9, 1.0, 1.0, seed)),
                  ("hidden_sizes", "top_p_filter with other sizes, spreads and p",
                   sized(lambda r, seed: _top_p_inputs(r.randint(2, 6), r.randint(10, 80),
                                                       round(r.uniform(0.2, 0.95), 2), r.uniform(0.5, 3.0), seed)))]),
    Piece("11", "repeat_kv", repeat_kv,
          returns("y", lambda i: f"repeat_kv(x {fmt_shape(i['x'].shape)}, n_rep={i['n_rep']})", "x", "n_rep"),
          mistakes=rows(TILED_KV_HEADS), by_hand=kv_heads_by_hand, label="repeat_kv output",
          shape="B H T D", atol=0, rtol=0, forbidden=("gptcourse.repeat_kv", *_ATTENTION, *_WHOLE),
          visible=[("visible", "repeat_kv of x (2, 2, 5, 3) with n_rep=3 (2 kv heads for 6 query heads)",
                    lambda seed: _repeat_inputs(2, 2, 5, 3, 3, seed))],
          hidden=[("hidden_mha", "repeat_kv with n_rep=1 (plain multi-head attention: unchanged)",
                   lambda seed: _repeat_inputs(1, 4, 3, 2, 1, seed)),
                  ("hidden_sizes", "repeat_kv with other sizes",
                   sized(lambda r, seed: _repeat_inputs(r.randint(1, 3), r.choice([2, 3]), r.randint(1, 6),
                                                        r.choice([2, 4]), r.choice([2, 3, 4]), seed)))]),
    Piece("11", "GroupedQueryAttention", MultiHeadAttention, _gqa_call, expected=_gqa_expected, judge=_gqa_judge,
          forbidden=("gptcourse.repeat_kv", *_ATTENTION, *_CACHE, *_WHOLE),
          visible=[("visible", "GroupedQueryAttention(24, n_heads=6, n_kv_heads=2) on x (2, 7, 24)",
                    lambda seed: _gqa_inputs(2, 7, 6, 2, 4, seed)),
                   ("cached", "GroupedQueryAttention(16, n_heads=4, n_kv_heads=2): a prefill of 3 positions, then 4 "
                              "tokens one at a time with the cache", lambda seed: _gqa_inputs(2, 7, 4, 2, 4, seed,
                                                                                    chunks=[3, 1, 1, 1, 1]))],
          hidden=[("hidden_mqa", "multi-query attention (n_kv_heads=1), cached one token at a time",
                   lambda seed: _gqa_inputs(1, 5, 4, 1, 2, seed, chunks=[1] * 5)),
                  ("hidden_sizes", "GroupedQueryAttention with other sizes", _gqa_hidden)]),
    Piece("11", "new_positions", _gpt_positions,
          returns("positions", lambda i: f"new_positions(past={i['past']}, t={i['t']})", "past", "t"),
          judge=_positions_judge,
          forbidden=(*_SAMPLING, *_WHOLE),
          visible=[("visible", "new_positions(past=6, t=3): three tokens after six cached",
                    lambda seed: _positions_inputs(6, 3))],
          hidden=[("hidden_prefill", "new_positions(past=0, t=5): the prefill, nothing cached yet",
                   lambda seed: _positions_inputs(0, 5)),
                  ("hidden_decode", "new_positions(past=37, t=1): one decode step",
                   lambda seed: _positions_inputs(37, 1)),
                  ("hidden_sizes", "new_positions with other past and t",
                   sized(lambda r, seed: _positions_inputs(r.randint(1, 40), r.randint(1, 6))))]),
    Piece("11", "generate_cached", generate, _generate_call, expected=_generate_expected, judge=_generate_judge,
          forbidden=(*_SAMPLING, *_CACHE, *_ATTENTION, *_WHOLE),
          visible=[("visible", "generate_cached: 6 greedy tokens after prompts (2, 5), a 2-layer RoPE model (Llama's "
                               "norm and MLP), equal to recomputing the whole sequence at each step",
                    lambda seed: gpt_with_tokens(LLAMA, seed, (2, 5), "prompt", new=6))],
          hidden=[("hidden_learned", "generate_cached with learned positions (GPT-2's layout), a one-token prompt",
                   lambda seed: gpt_with_tokens(GPT2, seed, (1, 1), "prompt", new=5)),
                  ("hidden_sizes", "generate_cached with other sizes and positions", _generate_hidden)]),
)
