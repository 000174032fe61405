"""Lab 02, causal attention: `causal_mask(T)`, `attention(q, k, v)` and `AttentionHead(d_model, d_head)`.

The student's `AttentionHead` has `query`, `key` and `value`: nn.Linear(d_model, d_head) with bias; the cases
load reference weights into them and call `forward(x)`, which returns (output (B, T, D), weights (B, T, T)).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from ...checks import (
    CheckFailed,
    Mistake,
    check_attention_weights,
    check_causal,
    check_causal_mask,
    check_close,
    check_known_mistakes,
    check_no_future_weight,
    check_shape,
    fail,
    perturbed_copies,
)
from ...model.causal_attention import AttentionHead, attention, causal_mask
from ..attention_mistakes import (
    KEYS_FOR_QUERIES,
    MASK_AFTER_SOFTMAX,
    NO_SCALE,
    SCALED_BY_D,
    SOFTMAX_OVER_QUERIES,
    attend_by_hand,
    by_model_width,
    rows,
    wrong_attentions,
)
from ..cases import Inputs, Outputs, random_weights, sized, sizes_rng, tensor_rng
from ..fixtures import TILED_ATTENTION
from ..piece import Piece, Probe, declare
from ..student import describe_error, module_returns, returns

_ATTENTION_ROWS = rows(NO_SCALE, SCALED_BY_D, SOFTMAX_OVER_QUERIES, MASK_AFTER_SOFTMAX, KEYS_FOR_QUERIES)

# torch's attention under each of its names: F.scaled_dot_product_attention and the kernels behind it (the math one
# returns the weights too: a whole `attention` in one call)
_ATTENTION = ("gptcourse.attention", "gptcourse.fused_attention",
              "torch.nn.functional.scaled_dot_product_attention", "torch._scaled_dot_product_attention_math",
              "torch._scaled_dot_product_flash_attention_for_cpu", "torch._scaled_dot_product_flash_attention",
              "torch._scaled_dot_product_efficient_attention", "torch._scaled_dot_product_cudnn_attention",
              *TILED_ATTENTION)


def _mask_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_causal_mask(got["mask"], expected["mask"], f"causal_mask({inputs['t']})")


# ---- attention(q, k, v) -> (output, weights), on (..., T, D)


def _qkv_inputs(lead: tuple[int, ...], t: int, d: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    q, k, v = (torch.randn(*lead, t, d, generator=gen) for _ in range(3))
    sizes = dict(zip("BH", lead, strict=False)) | {"T": t, "D": d}
    return {"q": q, "k": k, "v": v, "sizes": sizes}


_attention_returns = returns(("output", "weights"), lambda i: f"attention(q, k, v) on {tuple(i['q'].shape)}",
                             "q", "k", "v")


def _attention_call(fn: Any, inputs: Inputs) -> Outputs:
    """The student's attention on the case's q, k, v; a shape error on (B, H, T, D) inputs, where (B, T, D) ones
    work, is named: k transposed on fixed axes (1, 2) swaps H and T there."""
    try:
        return _attention_returns(fn, inputs)
    except RuntimeError as err:
        if inputs["q"].dim() < 4:
            raise
        raise fail(f"{describe_error(err)}. On (B, H, T, D) inputs (several heads at once): is k transposed on "
                   "fixed axes? k.transpose(1, 2) swaps H and T there: transpose the last two, k.transpose(-2, -1), "
                   "so that any leading axes work") from None


def _weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **switches: Any) -> torch.Tensor:
    return attend_by_hand(q, k, v, **switches)[1]


def wrong_weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                  d_model: int | None = None) -> dict[str, Callable[[], torch.Tensor]]:
    """The weights of common wrong attentions, each computed only when asked: description -> weights; with
    `d_model` (a head's C), the scores scaled by the model's width too."""
    wrong = wrong_attentions(_weights, _ATTENTION_ROWS, q=q, k=k, v=v)
    if d_model is not None and d_model != q.size(-1):
        wrong[by_model_width(d_model, q.size(-1))] = partial(_weights, q, k, v, divide_by=math.sqrt(d_model))
    return wrong


def _judge_attention_outputs(got: Outputs, expected: Outputs, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             sizes: dict[str, int], lead: str) -> None:
    check_shape(got["weights"], f"{lead} T T", sizes, "attention weights")
    check_shape(got["output"], f"{lead} T D", sizes, "attention output")
    check_known_mistakes(got["weights"], expected["weights"], wrong_weights(q, k, v, sizes.get("C")),
                         "attention weights")
    check_attention_weights(got["weights"], "attention weights")
    check_close(got["weights"], expected["weights"], "attention weights")
    check_close(got["output"], expected["output"], "attention output (weights @ v)",
                mistakes={Mistake("02.output_from_scores", "the output is the scores times v, not the softmax "
                                  "weights times v"): lambda: q @ k.transpose(-2, -1) @ v / math.sqrt(q.size(-1))})


def _attention_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    lead = " ".join(s for s in "BH" if s in inputs["sizes"])
    _judge_attention_outputs(got, expected, inputs["q"], inputs["k"], inputs["v"], inputs["sizes"], lead)


def _causal_call(fn: Any, inputs: Inputs) -> Outputs:
    copies = [perturbed_copies(inputs[name], dim=-2) for name in ("q", "k", "v")]  # each (T + 1, B, T, D)
    runs = [_attention_call(fn, {"q": q, "k": k, "v": v}) for q, k, v in zip(*copies, strict=True)]
    return {"outputs": torch.stack([run["output"] for run in runs]), "weights": runs[0]["weights"]}


def _causal_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["weights"], "B T T", inputs["sizes"], "attention weights")
    check_no_future_weight(got["weights"])
    try:
        check_causal(got["outputs"], "attention", dim=-2)
    except CheckFailed:  # the future leaks in with no weight on it: through the softmax's sum, if a known mistake
        check_known_mistakes(got["weights"], expected["weights"], wrong_weights(inputs["q"], inputs["k"], inputs["v"]),
                             "attention weights")
        raise


# ---- AttentionHead(d_model, d_head): project x to q, k, v, then attend


def _head_inputs(b: int, t: int, c: int, d: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    return {
        "init": {"d_model": c, "d_head": d},
        "weights": random_weights(AttentionHead(c, d, bias=True), gen, scale=1 / math.sqrt(c)),
        "x": torch.randn(b, t, c, generator=gen),
        "sizes": {"B": b, "T": t, "C": c, "D": d},
    }


def _head_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    w, x = inputs["weights"], inputs["x"]
    check_shape(got["output"], "B T D", inputs["sizes"], "head output", causes={
        ("D", "C"): Mistake("02.no_value_projection", "the value projection is missing: the output is a mix of v = "
                                                      "value(x), of width D")})
    q, k, v = (x @ w[f"{n}.weight"].T + w[f"{n}.bias"] for n in ("query", "key", "value"))  # each (B, T, D)
    _judge_attention_outputs(got, expected, q, k, v, inputs["sizes"], "B")


PIECES = declare(
    Piece("02", "causal_mask", causal_mask, returns("mask", lambda i: f"causal_mask({i['t']})", "t"),
          judge=_mask_judge,
          forbidden=("gptcourse.causal_mask", *TILED_ATTENTION),
          visible=[("visible", "causal_mask(4)", lambda seed: {"t": 4})],
          hidden=[("hidden_single", "causal_mask(1)", lambda seed: {"t": 1}),
                  ("hidden_sizes", "causal_mask(T) for a longer T",
                   lambda seed: {"t": sizes_rng(seed).randint(6, 12)})]),
    Piece("02", "attention", attention, _attention_call, judge=_attention_judge, forbidden=_ATTENTION,
          visible=[("visible", "attention with q, k, v of shape (B, T, D) = (2, 5, 8)",
                    lambda seed: _qkv_inputs((2,), 5, 8, seed)),
                   ("causal", "attention is causal: later q, k, v never change earlier outputs",
                    lambda seed: _qkv_inputs((2,), 6, 4, seed), Probe(_causal_call, _causal_judge))],
          hidden=[("hidden_single", "attention on one position (B=1, T=1)",
                   lambda seed: _qkv_inputs((1,), 1, 4, seed)),
                  ("hidden_heads", "attention on (B, H, T, D) inputs (several heads at once)",
                   sized(lambda r, seed: _qkv_inputs((r.randint(2, 3), r.randint(2, 4)), r.randint(5, 9),
                                                     r.choice([4, 6, 10]), seed)))]),
    Piece("02", "AttentionHead", AttentionHead,
          module_returns(("output", "weights"), lambda i: "AttentionHead({d_model}, {d_head})".format(**i["init"])),
          judge=_head_judge,
          forbidden=(*_ATTENTION, "gptcourse.AttentionHead", "gptcourse.MultiHeadAttention",
                     "torch.nn.MultiheadAttention", "torch.nn.functional.multi_head_attention_forward",
                     "torch._native_multi_head_attention"),
          visible=[("visible", "AttentionHead(d_model=12, d_head=8) on x (B, T, C) = (2, 5, 12)",
                    lambda seed: _head_inputs(2, 5, 12, 8, seed))],
          hidden=[("hidden_single", "AttentionHead on one token (B=1, T=1)",
                   lambda seed: _head_inputs(1, 1, 6, 3, seed)),
                  ("hidden_square", "AttentionHead with d_head = d_model", lambda seed: _head_inputs(2, 4, 6, 6, seed)),
                  ("hidden_sizes", "AttentionHead with other sizes",
                   sized(lambda r, seed: _head_inputs(r.randint(2, 3), r.randint(4, 9), r.choice([16, 20, 24]),
                                                      r.choice([4, 6, 8]), seed)))]),
)
