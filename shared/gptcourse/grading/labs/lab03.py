"""Lab 03, multi-head attention and RoPE: `split_heads`, `merge_heads`, `rope_tables`, `apply_rope` and
`MultiHeadAttention(d_model, n_heads)`.

The student's `MultiHeadAttention` has `qkv`, nn.Linear(C, 3C) whose output holds q, k, v in that order (rows
W_q; W_k; W_v, like `gptcourse.MultiHeadAttention`), and `out`, nn.Linear(C, C); the cases load reference
weights into both and call `forward(x)` or `forward(x, rope=(cos, sin))`.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...model.causal_attention import MultiHeadAttention
from ...checks import (
    check_causal,
    check_close,
    check_shape,
    fail,
    merge_heads_mistakes,
    multi_head_mistakes,
    perturbed_copies,
    rope_mistakes,
    rope_table_mistakes,
    split_heads_mistakes,
)
from ...model.positions import RotaryEmbedding, apply_rope
from ..cases import case_family, Case, Inputs, Outputs, random_weights, register, sizes_rng, tensor_rng
from ..student import as_tensor, as_tensors, build_module, describe_error

_MHA = ("gptcourse.MultiHeadAttention",)
_ROPE = ("gptcourse.apply_rope", "gptcourse.rotate_half")
_WHOLE = ("gptcourse.DecoderBlock", "gptcourse.GPT")
# piece -> the gptcourse names a student must not import or call for it
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "split_heads": _MHA + _WHOLE,
    "merge_heads": _MHA + _WHOLE,
    "rope_tables": ("gptcourse.RotaryEmbedding", *_WHOLE),
    "apply_rope": _ROPE + _WHOLE,
    "mha": _MHA + _ROPE + _WHOLE,
}


def _head_sizes(b: int, t: int, h: int, d: int) -> dict[str, int]:
    return {"B": b, "T": t, "H": h, "D": d, "C": h * d}


def _hidden_sizes(seed: int, even_d: bool = False) -> tuple[int, int, int, int]:
    """(B, T, H, D) for a hidden case."""
    r = sizes_rng(seed)
    # An even D has at least two pairs: with one (D = 2) pairing (2i, 2i + 1) is pairing the halves, and an
    # interleaved RoPE would pass (hidden_single keeps that edge case on purpose).
    return r.randint(1, 3), r.randint(4, 9), r.choice([2, 4, 6]), r.choice([4, 6, 10] if even_d else [3, 5, 6])


# ---- split_heads(x, n_heads): (B, T, C) -> (B, H, T, D)


def _split_inputs(b: int, t: int, h: int, d: int, seed: int) -> Inputs:
    return {"x": torch.randn(b, t, h * d, generator=tensor_rng(seed)), "n_heads": h, "sizes": _head_sizes(b, t, h, d)}


def _split_run(fn: Any, inputs: Inputs) -> Outputs:
    what = f"split_heads(x {tuple(inputs['x'].shape)}, n_heads={inputs['n_heads']})"
    return {"heads": as_tensor(fn(inputs["x"].clone(), inputs["n_heads"]), what)}


def _split_reference(inputs: Inputs) -> Outputs:
    b, t, c = inputs["x"].shape
    h = inputs["n_heads"]
    return {"heads": inputs["x"].view(b, t, h, c // h).transpose(1, 2)}  # the layout MultiHeadAttention uses


def _split_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["heads"], "B H T D", inputs["sizes"], "split_heads output")
    check_close(got["heads"], expected["heads"], "split_heads output",
                mistakes=split_heads_mistakes(inputs["x"], inputs["n_heads"]))


_split_case = case_family(_split_run, _split_reference, _split_judge)


register(
    _split_case("03.split_heads.visible", "split_heads on x (B, T, C) = (2, 5, 12) into H=3 heads",
                lambda seed: _split_inputs(2, 5, 3, 4, seed)),
    _split_case("03.split_heads.hidden_single", "split_heads of one token into one head (B=1, T=1, H=1)",
                lambda seed: _split_inputs(1, 1, 1, 4, seed), hidden=True),
    _split_case("03.split_heads.hidden_sizes", "split_heads with other sizes",
                lambda seed: _split_inputs(*_hidden_sizes(seed), seed), hidden=True),
)

# ---- merge_heads(y): (B, H, T, D) -> (B, T, C)


def _merge_inputs(b: int, t: int, h: int, d: int, seed: int) -> Inputs:
    return {"y": torch.randn(b, h, t, d, generator=tensor_rng(seed)), "sizes": _head_sizes(b, t, h, d)}


def _merge_run(fn: Any, inputs: Inputs) -> Outputs:
    return {"merged": as_tensor(fn(inputs["y"].clone()), f"merge_heads(y {tuple(inputs['y'].shape)})")}


def _merge_reference(inputs: Inputs) -> Outputs:
    return {"merged": MultiHeadAttention.merge_heads(inputs["y"])}


def _merge_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["merged"], "B T C", inputs["sizes"], "merge_heads output")
    check_close(got["merged"], expected["merged"], "merge_heads output", mistakes=merge_heads_mistakes(inputs["y"]))


_merge_case = case_family(_merge_run, _merge_reference, _merge_judge)


register(
    _merge_case("03.merge_heads.visible", "merge_heads on y (B, H, T, D) = (2, 3, 5, 4)",
                lambda seed: _merge_inputs(2, 5, 3, 4, seed)),
    _merge_case("03.merge_heads.hidden_single", "merge_heads of one token (B=1, T=1)",
                lambda seed: _merge_inputs(1, 1, 2, 3, seed), hidden=True),
    _merge_case("03.merge_heads.hidden_sizes", "merge_heads with other sizes",
                lambda seed: _merge_inputs(*_hidden_sizes(seed), seed), hidden=True),
)

# ---- rope_tables(d_head, T, theta) -> (cos, sin), each (T, D), rotate-half layout


def _tables_run(fn: Any, inputs: Inputs) -> Outputs:
    what = f"rope_tables({inputs['d_head']}, {inputs['t']}, theta={inputs['theta']})"
    cos, sin = as_tensors(fn(inputs["d_head"], inputs["t"], theta=inputs["theta"]), ("cos", "sin"), what)
    return {"cos": cos, "sin": sin}


def _tables_reference(inputs: Inputs) -> Outputs:
    cos, sin = RotaryEmbedding(inputs["d_head"], inputs["t"], inputs["theta"])(torch.arange(inputs["t"]))
    return {"cos": cos, "sin": sin}


def _tables_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    sizes = {"T": inputs["t"], "D": inputs["d_head"], "D/2": inputs["d_head"] // 2}
    wrong_angles = rope_table_mistakes(inputs["d_head"], inputs["t"], inputs["theta"])
    for name, fn in (("cos", torch.cos), ("sin", torch.sin)):
        check_shape(got[name], "T D", sizes, f"the {name} table", causes={
            ("D", "D/2"): "one angle per pair gives D/2 columns: repeat them for both halves, cat([a, a], dim=-1)"})
        check_close(got[name], expected[name], f"the {name} table",
                    mistakes={what: fn(angles) for what, angles in wrong_angles.items()})


_tables_case = case_family(_tables_run, _tables_reference, _tables_judge)


def _tables_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return {"d_head": r.choice([6, 10, 12]), "t": r.randint(9, 20), "theta": r.choice([100.0, 500.0])}


register(
    _tables_case("03.rope_tables.visible", "rope_tables(d_head=8, T=6, theta=10000)",
                 lambda seed: {"d_head": 8, "t": 6, "theta": 10000.0}),
    _tables_case("03.rope_tables.hidden_single", "rope_tables for one position and one pair (T=1, D=2)",
                 lambda seed: {"d_head": 2, "t": 1, "theta": 10000.0}, hidden=True),
    _tables_case("03.rope_tables.hidden_sizes", "rope_tables with other sizes and another theta",
                 _tables_hidden, hidden=True),
)

# ---- apply_rope(x, cos, sin): rotate (B, H, T, D) by the (T, D) tables


def _rope_inputs(b: int, t: int, h: int, d: int, seed: int, start: int = 0) -> Inputs:
    """x (B, H, T, D) and the tables of positions start .. start + T - 1 (as with earlier tokens cached)."""
    cos, sin = RotaryEmbedding(d, start + t)(torch.arange(start, start + t))
    return {"x": torch.randn(b, h, t, d, generator=tensor_rng(seed)), "cos": cos, "sin": sin,
            "sizes": _head_sizes(b, t, h, d)}


def _rope_run(fn: Any, inputs: Inputs) -> Outputs:
    what = f"apply_rope(x {tuple(inputs['x'].shape)}, cos, sin {tuple(inputs['cos'].shape)})"
    return {"rotated": as_tensor(fn(inputs["x"].clone(), inputs["cos"].clone(), inputs["sin"].clone()), what)}


def _rope_reference(inputs: Inputs) -> Outputs:
    return {"rotated": apply_rope(inputs["x"], inputs["cos"], inputs["sin"])}


def _rope_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["rotated"], "B H T D", inputs["sizes"], "apply_rope output")
    check_close(got["rotated"], expected["rotated"], "apply_rope output",
                mistakes=rope_mistakes(inputs["x"], inputs["cos"], inputs["sin"]))


_rope_case = case_family(_rope_run, _rope_reference, _rope_judge)


def _rope_hidden(seed: int) -> Inputs:
    b, t, h, d = _hidden_sizes(seed, even_d=True)
    return _rope_inputs(b, t, h, d, seed, start=sizes_rng(seed + 1).randint(3, 20))


register(
    _rope_case("03.apply_rope.visible", "apply_rope on x (B, H, T, D) = (2, 3, 5, 8), positions 0..4",
               lambda seed: _rope_inputs(2, 5, 3, 8, seed)),
    _rope_case("03.apply_rope.hidden_single", "apply_rope on one position and one pair (T=1, D=2) at position 7",
               lambda seed: _rope_inputs(1, 1, 1, 2, seed, start=7), hidden=True),
    _rope_case("03.apply_rope.hidden_sizes", "apply_rope with other sizes, at later positions",
               _rope_hidden, hidden=True),
)

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


def _mha_call(module: Any, x: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    rope = "rope=(cos, sin)" if "cos" in inputs else ""
    what = f"{_mha_what(inputs)}(x {tuple(x.shape)}{', ' + rope if rope else ''})"
    try:
        y = module(x.clone(), rope=(inputs["cos"], inputs["sin"])) if rope else module(x.clone())
    except RuntimeError as err:
        c, d = inputs["sizes"]["C"], inputs["sizes"]["D"]
        if "cannot be multiplied" not in str(err) or f"x{d} and {c}x" not in str(err) or c == d:
            raise
        raise fail(f"{describe_error(err)}. A layer that expects width C = {c} got vectors of width D = {d}: "
                   "merge the heads back to (B, T, C) before `out`") from None
    return as_tensor(y, what)


def _mha_run(cls: Any, inputs: Inputs) -> Outputs:
    module = build_module(cls, _mha_what(inputs), inputs["init"], inputs["weights"])
    return {"y": _mha_call(module, inputs["x"], inputs)}


def _reference_module(inputs: Inputs) -> MultiHeadAttention:
    module = MultiHeadAttention(**inputs["init"], fused=False)
    module.load_state_dict(inputs["weights"])
    return module.eval()


def _reference_call(module: MultiHeadAttention, x: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    with torch.no_grad():
        return module(x, rope=(inputs["cos"], inputs["sin"]) if "cos" in inputs else None)


def _mha_reference(inputs: Inputs) -> Outputs:
    return {"y": _reference_call(_reference_module(inputs), inputs["x"], inputs)}


def _mha_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["y"], "B T C", inputs["sizes"], "attention output", causes={
        ("C", "D"): "only one head's width: merge the H heads back to C = H x D"})
    module = _reference_module(inputs)
    rope = (inputs["cos"], inputs["sin"]) if "cos" in inputs else None
    with torch.no_grad():
        mistakes = multi_head_mistakes(inputs["x"], module.qkv, module.out, inputs["init"]["n_heads"], rope)
    check_close(got["y"], expected["y"], "attention output", mistakes=mistakes)


_mha_case = case_family(_mha_run, _mha_reference, _mha_judge)


def _causal_run(cls: Any, inputs: Inputs) -> Outputs:
    module = build_module(cls, _mha_what(inputs), inputs["init"], inputs["weights"])
    return {"outputs": torch.stack([_mha_call(module, x, inputs) for x in perturbed_copies(inputs["x"])])}


def _causal_reference(inputs: Inputs) -> Outputs:
    module = _reference_module(inputs)
    return {"outputs": torch.stack([_reference_call(module, x, inputs) for x in perturbed_copies(inputs["x"])])}


def _causal_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["outputs"][0], "B T C", inputs["sizes"], "attention output")
    check_causal(got["outputs"], "MultiHeadAttention")


def _mha_hidden(seed: int) -> Inputs:
    return _mha_inputs(*_hidden_sizes(seed, even_d=True), seed)


register(
    _mha_case("03.mha.visible", "MultiHeadAttention(12, 3) on x (B, T, C) = (2, 5, 12), no RoPE",
              lambda seed: _mha_inputs(2, 5, 3, 4, seed, rope=False)),
    _mha_case("03.mha.rope", "MultiHeadAttention(16, 2) with RoPE on x (B, T, C) = (3, 6, 16)",
              lambda seed: _mha_inputs(3, 6, 2, 8, seed)),
    Case("03.mha.causal", "MultiHeadAttention with RoPE is causal: later inputs never change earlier outputs",
         lambda seed: _mha_inputs(2, 5, 2, 6, seed), _causal_run, _causal_reference, _causal_judge),
    _mha_case("03.mha.hidden_single", "MultiHeadAttention with RoPE on one token (B=1, T=1)",
              lambda seed: _mha_inputs(1, 1, 2, 4, seed), hidden=True),
    _mha_case("03.mha.hidden_one_head", "MultiHeadAttention with a single head (H=1, D=C)",
              lambda seed: _mha_inputs(2, 5, 1, 6, seed), hidden=True),
    _mha_case("03.mha.hidden_many_heads", "MultiHeadAttention with many narrow heads (D=2), no RoPE",
              lambda seed: _mha_inputs(2, 6, 5, 2, seed, rope=False), hidden=True),
    _mha_case("03.mha.hidden_sizes", "MultiHeadAttention with RoPE, other sizes", _mha_hidden, hidden=True),
)
