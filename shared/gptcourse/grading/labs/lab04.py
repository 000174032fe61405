"""Lab 04, the decoder block: `RMSNorm(d, eps)`, `SwiGLU(d_model, d_ff)` and `DecoderBlock(d_model, n_heads,
d_ff)`.

Fixed parameter names: RMSNorm has `weight` (C,); SwiGLU has `w_in`, nn.Linear(C, 2 d_ff, bias=False) whose output
holds [gate; value], and `w_out`, nn.Linear(d_ff, C, bias=False); the block has `norm1`, `attn`
(gptcourse.MultiHeadAttention(C, H), with biases), `norm2` and `mlp`. The cases load reference weights into them.
The references are gptcourse's RMSNorm, SwiGLU and DecoderBlock, which take other arguments than the lab's (each
says how at its `expected` or class).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...checks import Mistake, fail, mistake_key
from ...model.block import DecoderBlock
from ...model.config import GPTConfig
from ...model.mlp import SwiGLU
from ...model.norms import RMSNorm
from ...model.params import block_breakdown
from ...model.positions import RotaryEmbedding
from ..cases import Inputs, Outputs, random_weights, sized, tensor_rng
from ..fixtures import causal_probe
from ..piece import Piece, Probe, declare
from ..student import as_tensor, build_module, module_class, module_returns

# torch's RMSNorm in its four forms: the module, the functional form and the ops behind it; the block forbids them
# too (it wraps the student's RMSNorm)
_NORM = ("gptcourse.RMSNorm", "gptcourse.model.norms.make_norm", "torch.nn.RMSNorm", "torch.nn.functional.rms_norm",
         "torch.rms_norm", "torch._fused_rms_norm")
# torch's other norms, each an RMSNorm of [x, -x] (whose mean is 0): layer_norm(cat([x, -x]), (2C,))[..., :C]; the
# RMSNorm's alone: a block that normalises with one of them still wires the block (and fails on its bias or values)
_OTHER_NORMS = ("torch.nn.LayerNorm", "torch.nn.functional.layer_norm", "torch.layer_norm", "torch.native_layer_norm",
                "torch.nn.GroupNorm", "torch.nn.functional.group_norm", "torch.group_norm",
                "torch.nn.functional.instance_norm", "torch.instance_norm", "torch.nn.functional.batch_norm",
                "torch.batch_norm")
_MLP = ("gptcourse.SwiGLU", "gptcourse.model.mlp.make_mlp")
_WHOLE = ("gptcourse.DecoderBlock", "gptcourse.GPT")


# ---- what the common mistakes of the pieces compute: {description: that mistake's output}


def norm_mistakes(x: torch.Tensor, weight: torch.Tensor, eps: float) -> dict[str, torch.Tensor]:
    """What common wrong RMSNorms compute, for `check_close(..., mistakes=...)`."""
    ms = x.pow(2).mean(-1, keepdim=True)
    centred = x - x.mean(-1, keepdim=True)
    return {
        Mistake("04.rmsnorm_centred", "it subtracts the mean (that is LayerNorm): RMSNorm only divides by the root "
                                      "mean square"):
            centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * weight,
        Mistake("04.eps_outside_sqrt", "eps is added outside the square root: use x / sqrt(mean(x^2) + eps)"):
            x / (ms.sqrt() + eps) * weight,
        Mistake("04.no_gain", "the gain (weight) is not applied"): x * torch.rsqrt(ms + eps),
        Mistake("04.divides_by_rsqrt", "x is divided by torch.rsqrt(mean(x^2) + eps): rsqrt is already 1 / sqrt, so "
                                       "multiply by it, x * torch.rsqrt(mean(x^2) + eps), or divide by "
                                       "torch.sqrt(...)"): x / torch.rsqrt(ms + eps) * weight,
        Mistake("04.norm_wrong_axis", "it divides by the standard deviation over the wrong axis: normalise each "
                                      "token over its C features (dim=-1)"):
            x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + eps) * weight,
        Mistake("04.l2_norm", "it divides by the L2 norm, sqrt(sum(x^2)): the root mean square divides the sum by "
                              "C, sqrt(mean(x^2) + eps) (the output is sqrt(C) times too small)"):
            x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps) * weight,
        Mistake("04.gain_plus_one", "the gain is applied as (1 + weight), Gemma's convention: the lab's gain is "
                                    "weight itself, initialised to ones, x / sqrt(mean(x^2) + eps) * weight"):
            x * torch.rsqrt(ms + eps) * (1 + weight),
    }


def swiglu_mistakes(x: torch.Tensor, w_in: torch.Tensor, w_out: torch.Tensor) -> dict[str, torch.Tensor]:
    """Wrong SwiGLUs of x (..., C), given the fused w_in weight (2F, C), rows [gate; value], and w_out (C, F)."""
    interleaved = x @ w_in.T  # (..., 2F)
    gate, value = interleaved.chunk(2, dim=-1)  # each (..., F)
    silu = torch.nn.functional.silu
    return {
        Mistake("04.gate_value_swapped", "the gate and the value are swapped: the first half of w_in's output is "
                                         "the gate (it goes through SiLU), the second half the value"):
            (silu(value) * gate) @ w_out.T,
        Mistake("04.silu_on_value", "SiLU is applied to the value too: only the gate goes through SiLU"):
            (silu(gate) * silu(value)) @ w_out.T,
        Mistake("04.silu_of_product", "SiLU is applied to the product, silu(gate * value): only the gate goes "
                                      "through SiLU, then multiplies the value, silu(gate) * value"):
            silu(gate * value) @ w_out.T,
        Mistake("04.no_silu", "the gate's SiLU is missing: silu(gate) * value"): (gate * value) @ w_out.T,
        Mistake("04.relu_gate", "ReLU instead of SiLU on the gate: SiLU(g) = g * sigmoid(g)"):
            (gate.relu() * value) @ w_out.T,
        Mistake("04.sigmoid_gate", "sigmoid instead of SiLU on the gate: SiLU(g) = g * sigmoid(g)"):
            (gate.sigmoid() * value) @ w_out.T,
        Mistake("04.gate_plus_value", "the gate and the value are added: SwiGLU multiplies them, silu(gate) * value"):
            (silu(gate) + value) @ w_out.T,
        Mistake("04.gelu_gate", "GELU instead of SiLU on the gate (that is GeGLU): SwiGLU's gate goes through "
                                "SiLU(g) = g * sigmoid(g)"):
            (torch.nn.functional.gelu(gate) * value) @ w_out.T,
        Mistake("04.interleaved_split", "w_in's output is split into its even and odd columns: the gate is its "
                                        "first half and the value its second, gate, value = w_in(x).chunk(2, dim=-1)"):
            (silu(interleaved[..., 0::2]) * interleaved[..., 1::2]) @ w_out.T,
    }


def block_mistakes(
    x: torch.Tensor,
    attn: Callable[[torch.Tensor], torch.Tensor],
    mlp: Callable[[torch.Tensor], torch.Tensor],
    norm1: Callable[[torch.Tensor], torch.Tensor],
    norm2: Callable[[torch.Tensor], torch.Tensor],
    attn_without_rope: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """Wrong pre-norm decoder blocks of x (B, T, C), given the block's four sublayers as functions (and, with RoPE,
    the attention run without it)."""
    u = x + attn(norm1(x))  # (B, T, C): the right first half
    post = norm1(x + attn(x))
    normed = norm1(x) + attn(norm1(x))  # (B, T, C): the residual stream started from norm1(x)
    return {
        Mistake("04.post_norm", "post-norm: the norms are applied after the residual additions, norm(x + "
                                "sublayer(x)); a pre-norm block normalises only each sublayer's input: x + "
                                "attn(norm1(x))"): norm2(post + mlp(post)),
        Mistake("04.no_attention_residual", "the attention's residual is missing: u = x + attn(norm1(x))"):
            attn(norm1(x)) + mlp(norm2(attn(norm1(x)))),
        Mistake("04.no_mlp_residual", "the MLP's residual is missing: y = u + mlp(norm2(u))"): mlp(norm2(u)),
        Mistake("04.residual_from_normed", "the residual adds the normalised x, norm1(x) + attn(norm1(x)): the norm "
                                           "belongs to the sublayer's input only, and the residual stream carries x "
                                           "itself, u = x + attn(norm1(x)), then y = u + mlp(norm2(u))"):
            norm2(normed) + mlp(norm2(normed)),
        Mistake("04.parallel_mlp", "the MLP reads norm2(x), not norm2(u): it must see the attention's result "
                                   "(sequential, not parallel)"):
            u + mlp(norm2(x)),
        Mistake("04.norm1_twice", "norm1 is used before both sublayers: the MLP reads norm2(u), with its own gain"):
            u + mlp(norm1(u)),
        Mistake("04.no_norms", "the norms are not applied: each sublayer reads a normalised copy, attn(norm1(x)) "
                               "and mlp(norm2(u))"):
            (x + attn(x)) + mlp(x + attn(x)),
    } | ({} if attn_without_rope is None else {
        Mistake("04.rope_not_passed", "rope is not passed on to the attention: call self.attn(self.norm1(x), "
                                      "rope=rope), or the block ignores the rotary tables it is given"):
            (plain := x + attn_without_rope(norm1(x))) + mlp(norm2(plain))})


def _block_count_causes(config: GPTConfig) -> dict[str, list[tuple[int, Mistake]]]:
    """Per block component: (amount a count is commonly off by, likely cause)."""
    c, f = config.d_model, config.hidden_width
    norm = block_breakdown(config)["norms"] // 2
    attn_bias = [(-4 * c, Mistake("04.count_attention_bias_missing", "the attention biases are missing (qkv and out "
                                                                     "have bias=True here)"))] if config.attn_bias \
        else [(4 * c, Mistake("04.count_attention_bias_extra", "the attention has biases, but this config has none"))]
    if config.mlp == "swiglu":
        mlp = [
            (-c * f, Mistake("04.count_w_in_unfused", "w_in maps C -> d_ff, but it holds the gate and the value: C -> "
                                                      "2 d_ff")),
            (c * f, Mistake("04.count_swiglu_four_matrices", "SwiGLU has three C x d_ff matrices (gate, value, "
                                                             "output), not four")),
            (2 * f + c, Mistake("04.count_swiglu_bias_extra", "SwiGLU's linear layers have biases, but this config "
                                                              "has none: use bias=False")),
        ]
    else:
        mlp = [(f + c, Mistake("04.count_mlp_bias_extra", "the MLP has biases, but this config has none")),
               (-(f + c), Mistake("04.count_mlp_bias_missing", "the MLP biases are missing"))]
    norms = [(-norm, Mistake("04.count_norm_missing", "a norm is missing: one before attention (norm1), one before "
                                                      "the MLP (norm2)")),
             (2 * c, Mistake("04.count_norm_bias", "a bias (beta) in each norm: RMSNorm has only a gain"
                             if config.norm == "rmsnorm" else "a bias (beta) in each norm, but this config has none"))]
    return {"attention": attn_bias, "mlp": mlp, "norms": norms}


def check_block_parameter_count(got: Mapping[str, int], config: GPTConfig, name: str = "decoder block") -> None:
    """Compare a block's parameters by component ({"attention", "mlp", "norms"}) with `block_breakdown(config)`;
    the key of a mismatch is the first mistake it names."""
    expected = block_breakdown(config)
    causes = _block_count_causes(config)
    wrong, keys = [], []
    for component, want in expected.items():
        have = int(got.get(component, 0))
        if have != want:
            why = next((why for amount, why in causes[component] if amount == have - want), "")
            keys.append(mistake_key(why))
            wrong.append(f"{component} has {have:,}, expected {want:,} ({have - want:+,}" + (f": {why})" if why
                                                                                            else ")"))
    if wrong:
        raise fail(f"{name} parameters: " + "; ".join(wrong) + ".", next(filter(None, keys), None))


# ---- RMSNorm(d, eps): x / sqrt(mean(x^2) + eps) * weight


def _norm_inputs(b: int, t: int, c: int, seed: int, eps: float = 1e-6, scale: float = 1.0,
                 tiny_last: bool = False) -> Inputs:
    gen = tensor_rng(seed)
    x = (torch.randn(b, t, c, generator=gen) + 1.5) * scale  # a non-zero mean, so subtracting it shows
    if tiny_last:  # one token of size ~1e-3, where eps is no longer negligible: where it goes shows
        x[:, -1] *= 1e-3
    return {"init": {"d": c, "eps": eps}, "weights": {"weight": 1 + 0.5 * torch.randn(c, generator=gen)}, "x": x,
            "sizes": {"B": b, "T": t, "C": c}}


# ---- SwiGLU(d_model, d_ff): w_out(silu(gate) * value), [gate; value] = w_in(x)


def _swiglu_inputs(b: int, t: int, c: int, f: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    return {"init": {"d_model": c, "d_ff": f}, "weights": random_weights(SwiGLU(c, f), gen, scale=1 / math.sqrt(c)),
            "x": torch.randn(b, t, c, generator=gen) * 2, "sizes": {"B": b, "T": t, "C": c, "F": f}}


def _swiglu_expected(inputs: Inputs) -> Outputs:
    """gptcourse.SwiGLU with the same weights: its width argument is `d` where the lab's is `d_model`."""
    module = SwiGLU(inputs["init"]["d_model"], inputs["init"]["d_ff"])
    module.load_state_dict(inputs["weights"])
    with torch.no_grad():
        return {"y": module(inputs["x"])}


# ---- DecoderBlock(d_model, n_heads, d_ff): x + attn(norm1(x)), then + mlp(norm2(.))


def _config(c: int, h: int, f: int) -> GPTConfig:
    """The block the lab describes, as a GPTConfig: RMSNorm (eps 1e-6), attention with biases, SwiGLU without."""
    return GPTConfig(d_model=c, n_heads=h, d_ff=f, position="rope", norm="rmsnorm", norm_eps=1e-6, mlp="swiglu",
                     attn_bias=True, mlp_bias=False)


class _LabBlock(DecoderBlock):
    """gptcourse.DecoderBlock built from the lab's arguments (the package's takes a GPTConfig), so that the value,
    causality and parameter-count cases all run it through their own call, as they run the student's block."""

    def __init__(self, d_model: int, n_heads: int, d_ff: int) -> None:
        super().__init__(_config(d_model, n_heads, d_ff))


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


def _block_forward(module: Any, x: torch.Tensor, inputs: Inputs) -> torch.Tensor:
    rope = _rope_of(inputs)
    what = f"{_block_what(inputs)}(x {tuple(x.shape)}{', rope=(cos, sin)' if rope else ''})"
    return as_tensor(module(x.clone(), rope=rope) if rope else module(x.clone()), what)


def _block_call(cls: Any, inputs: Inputs) -> Outputs:
    module = build_module(cls, _block_what(inputs), inputs["init"], inputs["weights"])
    return {"y": _block_forward(module, inputs["x"], inputs)}


def _block_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    block = build_module(_LabBlock, _block_what(inputs), inputs["init"], inputs["weights"])
    rope = _rope_of(inputs)
    with torch.no_grad():
        return block_mistakes(inputs["x"], lambda z: block.attn(z, rope=rope), block.mlp, block.norm1, block.norm2,
                              block.attn if rope else None)


_COMPONENTS = {"norm1.": "norms", "norm2.": "norms", "attn.": "attention", "mlp.": "mlp"}


def _params_call(cls: Any, inputs: Inputs) -> Outputs:
    """The student's parameters by component, counted on a freshly built block (no weights loaded)."""
    counts = dict.fromkeys(("attention", "mlp", "norms"), 0)
    other = []
    for name, p in module_class(cls, _block_what(inputs))(**inputs["init"]).named_parameters():
        component = next((v for k, v in _COMPONENTS.items() if name.startswith(k)), None)
        if component is None:
            other.append(name)
        else:
            counts[component] += p.numel()
    return {**counts, "other": ", ".join(other)}


def _params_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    init = inputs["init"]
    if got["other"]:
        raise fail(f"decoder block: parameters {got['other']} belong to no sublayer; the block's parameters live "
                   "in norm1, attn, norm2 and mlp")
    check_block_parameter_count({k: int(got[k]) for k in ("attention", "mlp", "norms")},
                                _config(init["d_model"], init["n_heads"], init["d_ff"]))


_CAUSAL = causal_probe(_block_what, _block_forward, "block output", "DecoderBlock")

PIECES = declare(
    Piece("04", "RMSNorm", RMSNorm, module_returns("y", lambda i: "RMSNorm({d}, eps={eps})".format(**i["init"])),
          label="RMSNorm output", shape="B T C", forbidden=_NORM + _OTHER_NORMS + _WHOLE,
          mistakes=lambda i: norm_mistakes(i["x"], i["weights"]["weight"], i["init"]["eps"]),
          visible=[("visible", "RMSNorm(8) on x (B, T, C) = (2, 5, 8), the last token tiny (x ~ 1e-3: eps matters)",
                    lambda seed: _norm_inputs(2, 5, 8, seed, tiny_last=True))],
          hidden=[("hidden_single", "RMSNorm on one token (B=1, T=1)", lambda seed: _norm_inputs(1, 1, 6, seed)),
                  ("hidden_tiny", "RMSNorm on tiny inputs, where eps matters (x ~ 1e-3, eps=1e-6)",
                   lambda seed: _norm_inputs(2, 3, 7, seed, scale=1e-3)),
                  ("hidden_sizes", "RMSNorm with other sizes and eps",
                   sized(lambda r, seed: _norm_inputs(r.randint(2, 4), r.randint(3, 9), r.choice([10, 16, 20]), seed,
                                                      eps=r.choice([1e-5, 1e-4]))))]),
    Piece("04", "SwiGLU", SwiGLU, module_returns("y", lambda i: "SwiGLU({d_model}, {d_ff})".format(**i["init"])),
          expected=_swiglu_expected, label="SwiGLU output", shape="B T C", forbidden=_MLP + _WHOLE,
          mistakes=lambda i: swiglu_mistakes(i["x"], i["weights"]["w_in.weight"], i["weights"]["w_out.weight"]),
          visible=[("visible", "SwiGLU(d_model=8, d_ff=12) on x (B, T, C) = (2, 5, 8)",
                    lambda seed: _swiglu_inputs(2, 5, 8, 12, seed))],
          hidden=[("hidden_single", "SwiGLU on one token (B=1, T=1)", lambda seed: _swiglu_inputs(1, 1, 6, 10, seed)),
                  ("hidden_sizes", "SwiGLU with other sizes (d_ff smaller or larger than C)",
                   sized(lambda r, seed: _swiglu_inputs(r.randint(1, 3), r.randint(4, 9), r.choice([10, 12, 14]),
                                                        r.choice([6, 20, 28]), seed)))]),
    Piece("04", "DecoderBlock", _LabBlock, _block_call, label="block output", shape="B T C", mistakes=_block_mistakes,
          forbidden=_NORM + _MLP + _WHOLE,
          visible=[("visible", "DecoderBlock(12, 3, 16) on x (B, T, C) = (2, 5, 12), no RoPE",
                    lambda seed: _block_inputs(2, 5, 3, 4, 16, seed, rope=False)),
                   ("rope", "DecoderBlock(16, 2, 24) with RoPE on x (B, T, C) = (3, 6, 16)",
                    lambda seed: _block_inputs(3, 6, 2, 8, 24, seed)),
                   ("causal", "DecoderBlock with RoPE is causal: later inputs never change earlier outputs",
                    lambda seed: _block_inputs(2, 5, 2, 6, 20, seed), _CAUSAL),
                   ("params", "DecoderBlock(32, 4, 64)'s parameters by component (the seed-tiny block: 10,432)",
                    lambda seed: {"init": {"d_model": 32, "n_heads": 4, "d_ff": 64}},
                    Probe(_params_call, _params_judge))],
          hidden=[("hidden_single", "DecoderBlock with RoPE on one token (B=1, T=1)",
                   lambda seed: _block_inputs(1, 1, 2, 4, 12, seed)),
                  ("hidden_one_head", "DecoderBlock with a single head (H=1)",
                   lambda seed: _block_inputs(2, 5, 1, 6, 10, seed)),
                  ("hidden_sizes", "DecoderBlock with RoPE, other sizes",
                   sized(lambda r, seed: _block_inputs(r.randint(1, 3), r.randint(4, 8), r.choice([2, 4]),
                                                       r.choice([4, 6]), r.choice([12, 20]), seed)))]),
)
