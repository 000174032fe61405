"""Lab 04, the decoder block: `RMSNorm(d, eps)`, `SwiGLU(d_model, d_ff)` and `DecoderBlock(d_model, n_heads,
d_ff)`.

Fixed parameter names: RMSNorm has `weight` (C,); SwiGLU has `w_in`, nn.Linear(C, 2 d_ff, bias=False) whose output
holds [gate; value], and `w_out`, nn.Linear(d_ff, C, bias=False); the block has `norm1`, `attn`
(gptcourse.MultiHeadAttention(C, H), with biases), `norm2` and `mlp`. The cases load reference weights into them.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ...model.block import DecoderBlock
from ...checks import (
    block_mistakes,
    check_block_parameter_count,
    check_causal,
    check_close,
    check_shape,
    fail,
    norm_mistakes,
    perturbed_copies,
    swiglu_mistakes,
)
from ...model.config import GPTConfig
from ...model.mlp import SwiGLU
from ...model.norms import RMSNorm
from ...model.params import block_breakdown
from ...model.positions import RotaryEmbedding
from ..cases import case_family, Case, Inputs, Outputs, random_weights, register, sizes_rng, tensor_rng
from ..student import as_tensor, build_module

_NORM = ("gptcourse.RMSNorm", "gptcourse.model.norms.make_norm")
_MLP = ("gptcourse.SwiGLU", "gptcourse.model.mlp.make_mlp")
_WHOLE = ("gptcourse.DecoderBlock", "gptcourse.GPT")
# piece -> the gptcourse names a student must not import or call for it (MultiHeadAttention is allowed)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "rmsnorm": _NORM + _WHOLE,
    "swiglu": _MLP + _WHOLE,
    "block": _NORM + _MLP + _WHOLE,
}

# ---- RMSNorm(d, eps): x / sqrt(mean(x^2) + eps) * weight


def _norm_inputs(b: int, t: int, c: int, seed: int, eps: float = 1e-6, scale: float = 1.0) -> Inputs:
    gen = tensor_rng(seed)
    x = (torch.randn(b, t, c, generator=gen) + 1.5) * scale  # a non-zero mean, so subtracting it shows
    return {"init": {"d": c, "eps": eps}, "weights": {"weight": 1 + 0.5 * torch.randn(c, generator=gen)}, "x": x,
            "sizes": {"B": b, "T": t, "C": c}}


def _norm_run(cls: Any, inputs: Inputs) -> Outputs:
    what = f"RMSNorm({inputs['init']['d']}, eps={inputs['init']['eps']})"
    module = build_module(cls, what, inputs["init"], inputs["weights"])
    return {"y": as_tensor(module(inputs["x"].clone()), f"{what} on x {tuple(inputs['x'].shape)}")}


def _norm_reference(inputs: Inputs) -> Outputs:
    module = RMSNorm(**inputs["init"])
    module.load_state_dict(inputs["weights"])
    with torch.no_grad():
        return {"y": module(inputs["x"])}


def _norm_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["y"], "B T C", inputs["sizes"], "RMSNorm output")
    check_close(got["y"], expected["y"], "RMSNorm output",
                mistakes=norm_mistakes(inputs["x"], inputs["weights"]["weight"], inputs["init"]["eps"]))


_norm_case = case_family(_norm_run, _norm_reference, _norm_judge)


def _norm_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _norm_inputs(r.randint(2, 4), r.randint(3, 9), r.choice([10, 16, 20]), seed, eps=r.choice([1e-5, 1e-4]))


register(
    _norm_case("04.rmsnorm.visible", "RMSNorm(8) on x (B, T, C) = (2, 5, 8)",
               lambda seed: _norm_inputs(2, 5, 8, seed)),
    _norm_case("04.rmsnorm.hidden_single", "RMSNorm on one token (B=1, T=1)",
               lambda seed: _norm_inputs(1, 1, 6, seed), hidden=True),
    _norm_case("04.rmsnorm.hidden_tiny", "RMSNorm on tiny inputs, where eps matters (x ~ 1e-3, eps=1e-6)",
               lambda seed: _norm_inputs(2, 3, 7, seed, scale=1e-3), hidden=True),
    _norm_case("04.rmsnorm.hidden_sizes", "RMSNorm with other sizes and eps", _norm_hidden, hidden=True),
)

# ---- SwiGLU(d_model, d_ff): w_out(silu(gate) * value), [gate; value] = w_in(x)


def _swiglu_inputs(b: int, t: int, c: int, f: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    return {"init": {"d_model": c, "d_ff": f}, "weights": random_weights(SwiGLU(c, f), gen, scale=1 / math.sqrt(c)),
            "x": torch.randn(b, t, c, generator=gen) * 2, "sizes": {"B": b, "T": t, "C": c, "F": f}}


def _swiglu_run(cls: Any, inputs: Inputs) -> Outputs:
    what = f"SwiGLU({inputs['init']['d_model']}, {inputs['init']['d_ff']})"
    module = build_module(cls, what, inputs["init"], inputs["weights"])
    return {"y": as_tensor(module(inputs["x"].clone()), f"{what} on x {tuple(inputs['x'].shape)}")}


def _swiglu_reference(inputs: Inputs) -> Outputs:
    module = SwiGLU(inputs["init"]["d_model"], inputs["init"]["d_ff"])
    module.load_state_dict(inputs["weights"])
    with torch.no_grad():
        return {"y": module(inputs["x"])}


def _swiglu_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    w = inputs["weights"]
    check_shape(got["y"], "B T C", inputs["sizes"], "SwiGLU output")
    check_close(got["y"], expected["y"], "SwiGLU output",
                mistakes=swiglu_mistakes(inputs["x"], w["w_in.weight"], w["w_out.weight"]))


_swiglu_case = case_family(_swiglu_run, _swiglu_reference, _swiglu_judge)


def _swiglu_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _swiglu_inputs(r.randint(1, 3), r.randint(4, 9), r.choice([10, 12, 14]), r.choice([6, 20, 28]), seed)


register(
    _swiglu_case("04.swiglu.visible", "SwiGLU(d_model=8, d_ff=12) on x (B, T, C) = (2, 5, 8)",
                 lambda seed: _swiglu_inputs(2, 5, 8, 12, seed)),
    _swiglu_case("04.swiglu.hidden_single", "SwiGLU on one token (B=1, T=1)",
                 lambda seed: _swiglu_inputs(1, 1, 6, 10, seed), hidden=True),
    _swiglu_case("04.swiglu.hidden_sizes", "SwiGLU with other sizes (d_ff smaller or larger than C)",
                 _swiglu_hidden, hidden=True),
)

# ---- DecoderBlock(d_model, n_heads, d_ff): x + attn(norm1(x)), then + mlp(norm2(.))


def _config(c: int, h: int, f: int) -> GPTConfig:
    """The block the lab describes, as a GPTConfig: RMSNorm (eps 1e-6), attention with biases, SwiGLU without."""
    return GPTConfig(d_model=c, n_heads=h, d_ff=f, position="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu",
                     attn_bias=True, mlp_bias=False)


def _block_inputs(b: int, t: int, h: int, d: int, f: int, seed: int, rope: bool = True) -> Inputs:
    gen = tensor_rng(seed)
    c = h * d
    weights = random_weights(DecoderBlock(_config(c, h, f)), gen, scale=1 / math.sqrt(c))
    for name in ("norm1.weight", "norm2.weight"):
        weights[name] = 1 + 0.5 * torch.randn(c, generator=gen)
    inputs = {"init": {"d_model": c, "n_heads": h, "d_ff": f}, "weights": weights,
              "x": torch.randn(b, t, c, generator=gen) + 0.5, "sizes": {"B": b, "T": t, "C": c, "H": h, "D": d}}
    if rope:
        inputs["cos"], inputs["sin"] = RotaryEmbedding(d, t)(torch.arange(t))
    return inputs


def _block_what(inputs: Inputs) -> str:
    init = inputs["init"]
    return f"DecoderBlock({init['d_model']}, {init['n_heads']}, {init['d_ff']})"


def _rope_of(inputs: Inputs) -> tuple[torch.Tensor, torch.Tensor] | None:
    return (inputs["cos"], inputs["sin"]) if "cos" in inputs else None


def _block_call(module: Any, x: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    rope = _rope_of(inputs)
    what = f"{_block_what(inputs)}(x {tuple(x.shape)}{', rope=(cos, sin)' if rope else ''})"
    return as_tensor(module(x.clone(), rope=rope) if rope else module(x.clone()), what)


def _block_run(cls: Any, inputs: Inputs) -> Outputs:
    module = build_module(cls, _block_what(inputs), inputs["init"], inputs["weights"])
    return {"y": _block_call(module, inputs["x"], inputs)}


def _reference_block(inputs: Inputs) -> DecoderBlock:
    init = inputs["init"]
    block = DecoderBlock(_config(init["d_model"], init["n_heads"], init["d_ff"]))
    block.load_state_dict(inputs["weights"])
    return block.eval()


def _block_reference(inputs: Inputs) -> Outputs:
    with torch.no_grad():
        return {"y": _reference_block(inputs)(inputs["x"], rope=_rope_of(inputs))}


def _block_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["y"], "B T C", inputs["sizes"], "block output")
    block, rope = _reference_block(inputs), _rope_of(inputs)
    with torch.no_grad():
        mistakes = block_mistakes(inputs["x"], lambda z: block.attn(z, rope=rope), block.mlp, block.norm1, block.norm2)
    check_close(got["y"], expected["y"], "block output", mistakes=mistakes)


_block_case = case_family(_block_run, _block_reference, _block_judge)


def _causal_run(cls: Any, inputs: Inputs) -> Outputs:
    module = build_module(cls, _block_what(inputs), inputs["init"], inputs["weights"])
    return {"outputs": torch.stack([_block_call(module, x, inputs) for x in perturbed_copies(inputs["x"])])}


def _causal_reference(inputs: Inputs) -> Outputs:
    block, rope = _reference_block(inputs), _rope_of(inputs)
    with torch.no_grad():
        return {"outputs": torch.stack([block(x, rope=rope) for x in perturbed_copies(inputs["x"])])}


def _causal_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["outputs"][0], "B T C", inputs["sizes"], "block output")
    check_causal(got["outputs"], "DecoderBlock")


_COMPONENTS = {"norm1.": "norms", "norm2.": "norms", "attn.": "attention", "mlp.": "mlp"}


def _params_run(cls: Any, inputs: Inputs) -> Outputs:
    """The student's parameters by component, counted on a freshly built block (no weights loaded)."""
    what = _block_what(inputs)
    if not (isinstance(cls, type) and issubclass(cls, torch.nn.Module)):
        raise fail(f"{what}: expected a class derived from nn.Module, got {type(cls).__name__} {cls!r}")
    counts = dict.fromkeys(("attention", "mlp", "norms"), 0)
    other = []
    for name, p in cls(**inputs["init"]).named_parameters():
        component = next((v for k, v in _COMPONENTS.items() if name.startswith(k)), None)
        if component is None:
            other.append(name)
        else:
            counts[component] += p.numel()
    return {**counts, "other": ", ".join(other)}


def _params_reference(inputs: Inputs) -> Outputs:
    init = inputs["init"]
    return {**block_breakdown(_config(init["d_model"], init["n_heads"], init["d_ff"])), "other": ""}


def _params_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    init = inputs["init"]
    if got["other"]:
        raise fail(f"decoder block: parameters {got['other']} belong to no sublayer; the block's parameters live "
                   "in norm1, attn, norm2 and mlp")
    check_block_parameter_count({k: int(got[k]) for k in ("attention", "mlp", "norms")},
                                _config(init["d_model"], init["n_heads"], init["d_ff"]))


def _block_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _block_inputs(r.randint(1, 3), r.randint(4, 8), r.choice([2, 4]), r.choice([4, 6]), r.choice([12, 20]),
                         seed)


register(
    _block_case("04.block.visible", "DecoderBlock(12, 3, 16) on x (B, T, C) = (2, 5, 12), no RoPE",
                lambda seed: _block_inputs(2, 5, 3, 4, 16, seed, rope=False)),
    _block_case("04.block.rope", "DecoderBlock(16, 2, 24) with RoPE on x (B, T, C) = (3, 6, 16)",
                lambda seed: _block_inputs(3, 6, 2, 8, 24, seed)),
    Case("04.block.causal", "DecoderBlock with RoPE is causal: later inputs never change earlier outputs",
         lambda seed: _block_inputs(2, 5, 2, 6, 20, seed), _causal_run, _causal_reference, _causal_judge),
    Case("04.block.params", "DecoderBlock(32, 4, 64)'s parameters by component (the seed-tiny block: 10,432)",
         lambda seed: {"init": {"d_model": 32, "n_heads": 4, "d_ff": 64}}, _params_run, _params_reference,
         _params_judge),
    _block_case("04.block.hidden_single", "DecoderBlock with RoPE on one token (B=1, T=1)",
                lambda seed: _block_inputs(1, 1, 2, 4, 12, seed), hidden=True),
    _block_case("04.block.hidden_one_head", "DecoderBlock with a single head (H=1)",
                lambda seed: _block_inputs(2, 5, 1, 6, 10, seed), hidden=True),
    _block_case("04.block.hidden_sizes", "DecoderBlock with RoPE, other sizes", _block_hidden, hidden=True),
)
