"""Lab 03, multi-head attention and RoPE: `split_heads`, `merge_heads`, `rope_tables`, `apply_rope` and
`MultiHeadAttention(d_model, n_heads)`.

The student's `MultiHeadAttention` has `qkv`, nn.Linear(C, 3C) whose output holds q, k, v in that order (rows
W_q; W_k; W_v, like `gptcourse.MultiHeadAttention`), and `out`, nn.Linear(C, C); the cases load reference
weights into both and call `forward(x)` or `forward(x, rope=(cos, sin))`. The references are gptcourse's; three
have another interface there (each says so at its `expected`).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from functools import cache, partial
from typing import Any

import torch
from torch import nn

from ...checks import Mistake, check_close, check_shape, fail
from ...model.causal_attention import MultiHeadAttention
from ...model.positions import RotaryEmbedding, apply_rope
from ..attention_mistakes import KEYS_FOR_QUERIES, NOT_CAUSAL, ROWS, attend_by_hand, by_model_width, rows
from ..cases import Inputs, Outputs, random_weights, sized, sizes_rng, tensor_rng
from ..fixtures import causal_probe
from ..piece import Piece, Rows, declare
from ..student import as_tensor, build_module, describe_error, returns

_MHA = ("gptcourse.MultiHeadAttention",)
_ROPE = ("gptcourse.apply_rope", "gptcourse.rotate_half")
_WHOLE = ("gptcourse.DecoderBlock", "gptcourse.GPT")


def _head_sizes(b: int, t: int, h: int, d: int) -> dict[str, int]:
    return {"B": b, "T": t, "H": h, "D": d, "C": h * d}


def _hidden_sizes(seed: int, even_d: bool = False) -> tuple[int, int, int, int]:
    """(B, T, H, D) for a hidden case."""
    r = sizes_rng(seed)
    # An even D has at least two pairs: with one (D = 2) pairing (2i, 2i + 1) is pairing the halves, and an
    # interleaved RoPE would pass (hidden_single keeps that edge case on purpose).
    return r.randint(1, 3), r.randint(4, 9), r.choice([2, 4, 6]), r.choice([4, 6, 10] if even_d else [3, 5, 6])


# ---- what the common mistakes of the pieces compute: {description: that mistake's output}


def split_heads_mistakes(x: torch.Tensor, n_heads: int) -> dict[str, torch.Tensor]:
    """Wrong ways to split x (B, T, C) into heads (B, H, T, D)."""
    b, t, c = x.shape
    d = c // n_heads
    return {
        Mistake("03.split_view_bhtd",
                "the heads are cut with view(B, H, T, D) straight from (B, T, C), which mixes positions into heads: "
                "view as (B, T, H, D), then transpose(1, 2)"): x.reshape(b, n_heads, t, d),
        Mistake("03.split_strided",
                "each head took every H-th feature: head h owns the D consecutive features h*D ... (h+1)*D - 1, so "
        "view as (B, T, H, D), not (B, T, D, H)"): x.reshape(b, t, d, n_heads).permute(0, 3, 1, 2),
    }


def merge_heads_mistakes(y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wrong ways to merge y (B, H, T, D) back into (B, T, C)."""
    b, h, t, d = y.shape
    return {
        Mistake("03.merge_no_transpose",
                "the heads are reshaped to (B, T, C) without transpose(1, 2) first, which mixes positions and heads: "
                "(B, H, T, D) -> transpose(1, 2) -> (B, T, H, D) -> reshape (B, T, C)"): y.reshape(b, t, h * d),
        Mistake("03.merge_interleaved",
                "the heads' features are interleaved (the order (B, T, D, H)): head h's D features must stay together, "
                "at h*D ... (h+1)*D - 1"): y.permute(0, 2, 3, 1).reshape(b, t, h * d),
    }


def _rotate_pairs(x: torch.Tensor) -> torch.Tensor:
    """The interleaved layout's rotate: (x0, x1, x2, x3, ...) -> (-x1, x0, -x3, x2, ...)."""
    return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)


def _rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Pairs (2i, 2i+1) of x (..., D) turned by the angles of cos, sin (T, D/2)."""
    even, odd = x[..., 0::2], x[..., 1::2]  # each (..., T, D/2)
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)


def rope_mistakes(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wrong RoPEs of x (..., T, D) with rotate-half cos/sin tables (T, D)."""
    (t, d), half = x.shape[-2:], x.size(-1) // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)  # rotate_half(x)
    cos_0, sin_0 = RotaryEmbedding(d, t)(torch.arange(t))  # (T, D) each: the tables of positions 0..T-1
    return ({} if torch.equal(cos, cos_0) else {
        Mistake("03.rope_tables_ignored",
             "the cos and sin passed in were not used: x is turned by the angles of positions 0..T-1, the tables given "
             "are for later positions. Rotate by the tables apply_rope receives, which may be for any positions (a "
             "cache's later tokens)"): x * cos_0 + rotated * sin_0,
    }) | {
        Mistake("03.rope_interleaved",
                "the pairs are interleaved, feature 2i with 2i+1 (the RoPE paper's and Meta's layout): this course "
        "uses the rotate-half layout of GPT-NeoX and Hugging Face Llama, feature i paired with i + D/2, "
        "rotate_half(x) = cat(-x2, x1)"): x * cos + _rotate_pairs(x) * sin,
        Mistake("03.rope_interleaved_pair_angle",
                "the pairs are interleaved, feature 2i with 2i+1, each turned by pair i's angle (the layout of Meta's "
                "complex-number code): this course uses the rotate-half layout of GPT-NeoX and Hugging Face Llama, "
                "feature i paired with i + D/2"): _rotate_interleaved(x, cos[..., :half], sin[..., :half]),
        Mistake("03.rope_wrong_direction",
          "the rotation goes the wrong way: rotate_half(x) is cat(-x2, x1), not cat(x2, -x1)"): x * cos - rotated * sin,
        Mistake("03.rope_cos_sin_swapped",
                "cos and sin are swapped: x * cos + rotate_half(x) * sin"): x * sin + rotated * cos,
        Mistake("03.rope_no_rotate_half",
                "rotate_half is missing: the sin term multiplies rotate_half(x), not x"): x * cos + x * sin,
    }


def rope_table_mistakes(d_head: int, t: int, theta: float) -> dict[str, torch.Tensor]:
    """Wrong RoPE angle tables (T, D): compare their .cos() with a cos table, their .sin() with a sin table."""
    positions = torch.arange(t, dtype=torch.float64)
    pair_freq = theta ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head)  # (D/2,)
    angles = torch.outer(positions, pair_freq)  # (T, D/2)
    slow = torch.outer(positions, theta ** (-torch.arange(d_head // 2, dtype=torch.float64) / d_head))
    base = inspect.signature(RotaryEmbedding).parameters["theta"].default  # 10000, RoPE's (a stub's has none)
    default = torch.outer(positions, base ** (-torch.arange(0, d_head, 2, dtype=torch.float64) / d_head))
    return ({} if theta == base else {
        Mistake("03.tables_default_theta",
                f"the angles use theta = {base:g} whatever theta is passed (here {theta:g}): pair i turns at "
        "theta^(-2i/D) with the theta argument (Llama 3's is 500000)"): torch.cat([default, default], dim=-1),
    }) | {
        Mistake("03.tables_interleaved",
                "the angles are in the interleaved layout (repeat_interleave): for rotate-half, the D/2 pair angles "
                "appear twice in a row, cat([angles, angles], dim=-1)"): angles.repeat_interleave(2, dim=-1),
        Mistake("03.tables_slow_frequencies",
                "the frequencies use theta^(-i/D) for i = 0 .. D/2-1: pair i turns at theta^(-2i/D), "
        "torch.arange(0, D, 2) / D"): torch.cat([slow, slow], dim=-1),
        Mistake("03.tables_per_feature_frequency",
                "every feature has its own frequency theta^(-i/D), i = 0 .. D-1: features i and i + D/2 form a pair "
        "and share one angle"): torch.outer(positions, theta ** (-torch.arange(d_head, dtype=torch.float64)
                                                                 / d_head)),
        Mistake("03.tables_positions_from_one",
                "the positions start at 1: the first token is at position 0 (angle 0, cos 1)"):
            torch.cat([angles + pair_freq, angles + pair_freq], dim=-1),
    }


class _MultiHeadByHand(nn.Module):
    """MultiHeadAttention written by hand (the lab's `qkv` and `out`), whose switches give each known mistake: how
    qkv's output is split into heads (`split`: "BTHD" right, "BHTD" a view straight from (B, T, C), "per head"
    GPT-NeoX's fused layout, "none" one head of width C without RoPE), which of q, k, v RoPE turns (`rotate`), the
    heads merged without a transpose (`transpose`), no output projection (`project`); `attention`: the switches
    of `attend_by_hand`."""

    def __init__(self, d_model: int, n_heads: int, *, split: str = "BTHD", rotate: str = "qk", transpose: bool = True,
                 project: bool = True, **attention: Any) -> None:
        super().__init__()
        self.n_heads, self.split, self.rotate, self.transpose, self.project = n_heads, split, rotate, transpose, project
        self.attention = attention
        self.qkv = nn.Linear(d_model, 3 * d_model)  # rows W_q; W_k; W_v
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        (b, t, c), h = x.shape, self.n_heads
        d = c // h
        fused = self.qkv(x)  # (B, T, 3C)
        q, k, v = fused.chunk(3, dim=-1)  # each (B, T, C); "none" keeps them so, one head of width C
        if self.split == "BTHD":
            q, k, v = (z.view(b, t, h, d).transpose(1, 2) for z in (q, k, v))  # (B, T, C) -> (B, H, T, D)
        elif self.split == "BHTD":
            q, k, v = (z.reshape(b, h, t, d) for z in (q, k, v))  # (B, T, C) -> (B, H, T, D), positions mixed in
        elif self.split == "per head":
            per_head = fused.view(b, t, h, 3, d)  # (B, T, H, 3, D): GPT-NeoX's layout of a fused qkv
            q, k, v = (per_head[:, :, :, i].transpose(1, 2) for i in range(3))  # each (B, H, T, D)
        if rope is not None and self.split != "none":
            q, k, v = (apply_rope(z, *rope) if name in self.rotate else z
                       for name, z in zip("qkv", (q, k, v), strict=True))
        y = attend_by_hand(q, k, v, **self.attention)[0]  # (B, H, T, D), or (B, T, C) for one wide head
        if self.split != "none":
            y = (y.transpose(1, 2) if self.transpose else y).reshape(b, t, c)  # (B, H, T, D) -> (B, T, C)
        return self.out(y) if self.project else y


def _mha_rows(inputs: Inputs) -> Rows:
    """The known mistakes of a MultiHeadAttention case, {why: switches of `_MultiHeadByHand`}: one head's mistake
    only with several heads, RoPE's only with RoPE."""
    c, h = inputs["init"]["d_model"], inputs["init"]["n_heads"]
    mistakes = {
        Mistake("03.mha_merge_no_transpose",
                "the heads are merged without transpose(1, 2): (B, H, T, D) -> transpose(1, 2) -> reshape (B, T, C)"):
            {"transpose": False},
        Mistake("03.mha_split_view_bhtd",
                "the heads are split with view(B, H, T, D) straight from (B, T, C): view as (B, T, H, D), then "
                "transpose(1, 2)"):
            {"split": "BHTD"},
        Mistake("03.mha_q_k_swapped",
                "q and k are swapped: qkv's output holds q, then k, then v (rows W_q; W_k; W_v of its weight)"):
            ROWS[KEYS_FOR_QUERIES],
        Mistake("03.mha_no_out_projection", "the output projection `out` is not applied to the merged heads"):
            {"project": False},
        by_model_width(c, c // h):
            {"divide_by": math.sqrt(c)},
        **rows(NOT_CAUSAL),
        Mistake("03.mha_neox_qkv_layout",
                "qkv's output was read per head, as (B, T, H, 3, D) (GPT-NeoX's fused layout): here it holds all of q, "
                "then k, then v, each of width C (rows W_q; W_k; W_v), so chunk(3, dim=-1) first, then split each into "
                "heads"):
            {"split": "per head"},
    }
    if h > 1:
        mistakes[Mistake("03.mha_no_heads",
                         "q, k and v are never split into heads: one head of width C attends (scaled by 1/sqrt(C), "
                         "without RoPE, whose tables are D wide); split each into H heads of width D = C/H "
                         "(split_heads), attend in each, then merge_heads")] = {"split": "none"}
    if "cos" in inputs:
        mistakes |= {
            Mistake("03.mha_rope_on_v",
                    "RoPE is applied to v as well: rotate only q and k (the rotation is there to make the scores "
                    "depend on relative position; v is what gets mixed)"):
                {"rotate": "qkv"},
            Mistake("03.mha_no_rope", "RoPE is missing: rotate q and k with rope = (cos, sin) after split_heads"):
                {"rotate": ""},
            Mistake("03.mha_rope_q_only",
                    "RoPE is applied to q only: rotate k too, so that the score depends on the distance between "
                    "positions"):
                {"rotate": "q"},
        }
    return mistakes


# ---- split_heads(x, n_heads): (B, T, C) -> (B, H, T, D)


def _split_inputs(b: int, t: int, h: int, d: int, seed: int) -> Inputs:
    return {"x": torch.randn(b, t, h * d, generator=tensor_rng(seed)), "n_heads": h, "sizes": _head_sizes(b, t, h, d)}


def _split_expected(inputs: Inputs) -> Outputs:
    """gptcourse.MultiHeadAttention.split_heads: a method there, which reads H from its layer."""
    x, h = inputs["x"], inputs["n_heads"]
    return {"heads": MultiHeadAttention(x.size(-1), h).split_heads(x)}


# ---- merge_heads(y): (B, H, T, D) -> (B, T, C)


def _merge_inputs(b: int, t: int, h: int, d: int, seed: int) -> Inputs:
    return {"y": torch.randn(b, h, t, d, generator=tensor_rng(seed)), "sizes": _head_sizes(b, t, h, d)}


def _merge_expected(inputs: Inputs) -> Outputs:
    """gptcourse.MultiHeadAttention.merge_heads: a static method of the layer there."""
    return {"merged": MultiHeadAttention.merge_heads(inputs["y"])}


# ---- rope_tables(d_head, T, theta) -> (cos, sin), each (T, D), rotate-half layout


def _tables_expected(inputs: Inputs) -> Outputs:
    """gptcourse.RotaryEmbedding's tables at positions 0 .. T-1: a module there, built for a context length."""
    cos, sin = RotaryEmbedding(inputs["d_head"], inputs["t"], inputs["theta"])(torch.arange(inputs["t"]))
    return {"cos": cos, "sin": sin}


def _tables_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes = {"T": inputs["t"], "D": inputs["d_head"], "D/2": inputs["d_head"] // 2}
    wrong_angles = cache(partial(rope_table_mistakes, inputs["d_head"], inputs["t"], inputs["theta"]))  # once
    for name, fn in (("cos", torch.cos), ("sin", torch.sin)):
        check_shape(got[name], "T D", sizes, f"the {name} table", causes={
            ("D", "D/2"): Mistake("03.tables_one_angle_per_pair",
                             "one angle per pair gives D/2 columns: repeat them for both halves, cat([a, a], dim=-1)")})
        check_close(got[name], expected[name], f"the {name} table", mistakes=partial(_tables_of, wrong_angles, fn))


def _tables_of(wrong_angles: Callable[[], dict[str, torch.Tensor]],
               fn: Callable[[torch.Tensor], torch.Tensor]) -> dict[str, torch.Tensor]:
    """{why: the cos or sin table (`fn`) of the angles that mistake gives}, for a table that is wrong."""
    return {what: fn(angles) for what, angles in wrong_angles().items()}


# ---- apply_rope(x, cos, sin): rotate (B, H, T, D) by the (T, D) tables


def _rope_inputs(b: int, t: int, h: int, d: int, seed: int, start: int = 0) -> Inputs:
    """x (B, H, T, D) and the tables of positions start .. start + T - 1 (as with earlier tokens cached)."""
    cos, sin = RotaryEmbedding(d, start + t)(torch.arange(start, start + t))
    return {"x": torch.randn(b, h, t, d, generator=tensor_rng(seed)), "cos": cos, "sin": sin,
            "sizes": _head_sizes(b, t, h, d)}


# ---- MultiHeadAttention(d_model, n_heads): qkv, split, (RoPE), attend, merge, out


def _mha_inputs(b: int, t: int, h: int, d: int, seed: int, rope: bool = True) -> Inputs:
    gen = tensor_rng(seed)
    c = h * d
    inputs = {
        "init": {"d_model": c, "n_heads": h},
        "weights": random_weights(MultiHeadAttention(c, h), gen, scale=1 / math.sqrt(c)),
        "x": torch.randn(b, t, c, generator=gen),
        "sizes": _head_sizes(b, t, h, d),
    }
    if rope:
        inputs["cos"], inputs["sin"] = RotaryEmbedding(d, t)(torch.arange(t))
    return inputs


def _mha_what(inputs: Inputs) -> str:
    return f"MultiHeadAttention({inputs['init']['d_model']}, {inputs['init']['n_heads']})"


def _mha_forward(module: Any, x: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    rope = "rope=(cos, sin)" if "cos" in inputs else ""
    what = f"{_mha_what(inputs)}(x {tuple(x.shape)}{', ' + rope if rope else ''})"
    try:
        y = module(x.clone(), rope=(inputs["cos"], inputs["sin"])) if rope else module(x.clone())
    except RuntimeError as err:
        c, d = inputs["sizes"]["C"], inputs["sizes"]["D"]
        if "cannot be multiplied" not in str(err) or f"x{d} and {c}x" not in str(err) or c == d:
            raise
        raise fail(f"{describe_error(err)}. A layer that expects width C = {c} got vectors of width D = {d}: "
                   "merge the heads back to (B, T, C) before `out`", mistake="03.heads_not_merged_before_out") from None
    return as_tensor(y, what)


def _mha_call(cls: Any, inputs: Inputs) -> Outputs:
    module = build_module(cls, _mha_what(inputs), inputs["init"], inputs["weights"])
    return {"y": _mha_forward(module, inputs["x"], inputs)}


_CAUSAL = causal_probe(_mha_what, _mha_forward, "attention output", "MultiHeadAttention")

PIECES = declare(
    Piece("03", "split_heads", MultiHeadAttention,
          returns("heads", lambda i: f"split_heads(x {tuple(i['x'].shape)}, n_heads={i['n_heads']})", "x", "n_heads"),
          expected=_split_expected, label="split_heads output", shape="B H T D", forbidden=_MHA + _WHOLE,
          mistakes=lambda i: split_heads_mistakes(i["x"], i["n_heads"]),
          visible=[("visible", "split_heads on x (B, T, C) = (2, 5, 12) into H=3 heads",
                    lambda seed: _split_inputs(2, 5, 3, 4, seed))],
          hidden=[("hidden_single", "split_heads of one token into one head (B=1, T=1, H=1)",
                   lambda seed: _split_inputs(1, 1, 1, 4, seed)),
                  ("hidden_sizes", "split_heads with other sizes",
                   lambda seed: _split_inputs(*_hidden_sizes(seed), seed))]),
    Piece("03", "merge_heads", MultiHeadAttention,
          returns("merged", lambda i: f"merge_heads(y {tuple(i['y'].shape)})", "y"), expected=_merge_expected,
          label="merge_heads output", shape="B T C", forbidden=_MHA + _WHOLE,
          mistakes=lambda i: merge_heads_mistakes(i["y"]),
          visible=[("visible", "merge_heads on y (B, H, T, D) = (2, 3, 5, 4)",
                    lambda seed: _merge_inputs(2, 5, 3, 4, seed))],
          hidden=[("hidden_single", "merge_heads of one token (B=1, T=1)", partial(_merge_inputs, 1, 1, 2, 3)),
                  ("hidden_sizes", "merge_heads with other sizes",
                   lambda seed: _merge_inputs(*_hidden_sizes(seed), seed))]),
    Piece("03", "rope_tables", RotaryEmbedding,
          returns(("cos", "sin"), lambda i: "rope_tables({d_head}, {t}, theta={theta})".format(**i), "d_head", "t",
                  theta="theta"), expected=_tables_expected, judge=_tables_judge,
          forbidden=("gptcourse.RotaryEmbedding", *_WHOLE),
          visible=[("visible", "rope_tables(d_head=8, T=6, theta=10000)",
                    lambda seed: {"d_head": 8, "t": 6, "theta": 10000.0})],
          hidden=[("hidden_single", "rope_tables for one position and one pair (T=1, D=2)",
                   lambda seed: {"d_head": 2, "t": 1, "theta": 10000.0}),
                  ("hidden_sizes", "rope_tables with other sizes and another theta",
                   sized(lambda r, seed: {"d_head": r.choice([6, 10, 12]), "t": r.randint(9, 20),
                                          "theta": r.choice([100.0, 500.0])}))]),
    Piece("03", "apply_rope", apply_rope,
          returns("rotated", lambda i: f"apply_rope(x {tuple(i['x'].shape)}, cos, sin {tuple(i['cos'].shape)})",
                  "x", "cos", "sin"),
          label="apply_rope output", shape="B H T D", forbidden=_ROPE + _WHOLE,
          mistakes=lambda i: rope_mistakes(i["x"], i["cos"], i["sin"]),
          visible=[("visible", "apply_rope on x (B, H, T, D) = (2, 3, 5, 8), positions 3..7",
                    lambda seed: _rope_inputs(2, 5, 3, 8, seed, start=3))],
          hidden=[("hidden_single", "apply_rope on one position and one pair (T=1, D=2) at position 7",
                   lambda seed: _rope_inputs(1, 1, 1, 2, seed, start=7)),
                  ("hidden_sizes", "apply_rope with other sizes, at later positions",
                   lambda seed: _rope_inputs(*_hidden_sizes(seed, even_d=True), seed,
                                             start=sizes_rng(seed + 1).randint(3, 20)))]),
    Piece("03", "MultiHeadAttention", MultiHeadAttention, _mha_call, label="attention output", shape="B T C",
          causes={("C", "D"): "only one head's width: merge the H heads back to C = H x D"},
          mistakes=_mha_rows, by_hand=_MultiHeadByHand, forbidden=_MHA + _ROPE + _WHOLE,
          visible=[("visible", "MultiHeadAttention(12, 3) on x (B, T, C) = (2, 5, 12), no RoPE",
                    lambda seed: _mha_inputs(2, 5, 3, 4, seed, rope=False)),
                   ("rope", "MultiHeadAttention(16, 2) with RoPE on x (B, T, C) = (3, 6, 16)",
                    lambda seed: _mha_inputs(3, 6, 2, 8, seed)),
                   ("causal", "MultiHeadAttention with RoPE is causal: later inputs never change earlier outputs",
                    lambda seed: _mha_inputs(2, 5, 2, 6, seed), _CAUSAL)],
          hidden=[("hidden_single", "MultiHeadAttention with RoPE on one token (B=1, T=1)",
                   lambda seed: _mha_inputs(1, 1, 2, 4, seed)),
                  ("hidden_one_head", "MultiHeadAttention with a single head (H=1, D=C)",
                   lambda seed: _mha_inputs(2, 5, 1, 6, seed)),
                  ("hidden_many_heads", "MultiHeadAttention with many narrow heads (D=2), no RoPE",
                   lambda seed: _mha_inputs(2, 6, 5, 2, seed, rope=False)),
                  ("hidden_sizes", "MultiHeadAttention with RoPE, other sizes",
                   lambda seed: _mha_inputs(*_hidden_sizes(seed, even_d=True), seed))]),
)
