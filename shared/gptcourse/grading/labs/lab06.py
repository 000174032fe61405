"""Lab 06, parameter counting: the student's closed forms `parameter_breakdown(config)` and
`count_parameters(config)`, for any GPTConfig, without building a model.

The references count gptcourse.GPT's parameters (`numel`), component by component, on the meta device (shapes
without memory), so a 7-billion-parameter model costs nothing, and the expected counts are the model's tensors,
not the package's own closed form (which the judges use to explain a mismatch: "+3,200 = V x d: untied output
projection?"). The visible presets have published totals: seed-tiny 24,096, untied 27,296, GPT-2 small
124,439,808, Llama-2-7B 6,738,415,616.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from numbers import Integral
from typing import Any

import torch

from ...checks import check_parameter_count, fail, gpt_module_breakdown
from ...model.config import PRESETS, GPTConfig, preset
from ...model.gpt import GPT
from ..cases import Inputs, Outputs, given, sized
from ..piece import Piece, declare
from ..student import TensorsMade

# Each piece forbids what computes its own answer. The breakdown's: the package's per-component closed forms (its
# private helpers too, one per component), the checker whose messages give the expected counts, the calculator
# widget, and a built model whose tensors are counted. The total is the breakdown's sum, so it forbids all of that
# as well (the sum of the reference breakdown is the reference total) and the whole module; the breakdown does not
# forbid the total, which it is not built from (a student who checks their components against it loses the total).
_BREAKDOWN = ("gptcourse.parameter_breakdown", "gptcourse.block_breakdown", "gptcourse.model.params._attention",
              "gptcourse.model.params._mlp", "gptcourse.model.params._norm", "gptcourse.checks.gpt_module_breakdown",
              "gptcourse.checks.check_parameter_count", "gptcourse.widgets.ParameterCalculator", "gptcourse.GPT",
              "gptcourse.model.gpt")
_TOTAL = ("gptcourse.count_parameters", "gptcourse.model.params", *_BREAKDOWN)
COMPONENTS = ("token_embedding", "position_embedding", "attention", "mlp", "block_norms", "final_norm",
              "output_projection")


def config_name(config: GPTConfig) -> str:
    """A preset's name, or the fields that differ from GPTConfig()."""
    for name, known in PRESETS.items():
        if known == config:
            return name
    default = GPTConfig()
    changed = ", ".join(f"{f}={getattr(config, f)!r}" for f in default.__dataclass_fields__
                        if getattr(config, f) != getattr(default, f))
    return f"GPTConfig({changed})"


def _as_count(value: Any, what: str) -> int:
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise fail(f"{what} is {type(value).__name__} {value!r}, expected a whole number (int)")
    return int(value)


def _model_breakdown(config: GPTConfig) -> dict[str, int]:
    """The reference parameter_breakdown: the numel of gptcourse.GPT(config)'s tensors, by component."""
    with torch.device("meta"):  # shapes without memory: Llama-2-7B costs nothing
        return gpt_module_breakdown(GPT(config))


def _model_total(config: GPTConfig) -> int:
    """The reference count_parameters: every tensor of gptcourse.GPT(config), tied ones once."""
    return sum(_model_breakdown(config).values())


# ---- parameter_breakdown(config) -> {component: count}


def _largest_made(fn: Any, config: GPTConfig) -> tuple[Any, int]:
    """fn(config), and the number of elements of the largest tensor it made (0 for a closed form: building a
    model, even on the meta device, makes every parameter)."""
    with TensorsMade() as made:
        result = fn(config)
    return result, max((math.prod(shape) for shape in made.shapes), default=0)


def _check_closed_form(made: int, config: GPTConfig, what: str) -> None:
    """A closed form makes no tensor of C elements: the smallest parameter of a GPT (a norm's gain) has that many."""
    if made >= config.d_model:
        raise fail(f"{what} gave the right count, but made a tensor of {made:,} elements on the way: it built layers "
                   "(on the meta device or not) and counted their tensors. This lab is where you write the formula: "
                   "compute each component from the config's fields (V x C for the token table, ...)",
                   mistake="06.counted_built_tensors")


def _breakdown_call(fn: Any, inputs: Inputs) -> Outputs:
    outputs: Outputs = {}
    for i, config in enumerate(inputs["configs"]):
        what = f"parameter_breakdown({config_name(config)})"
        got, outputs[f"{i}.made"] = _largest_made(fn, config)
        if not isinstance(got, Mapping):
            raise fail(f"{what} returned {type(got).__name__}, expected a dict {{component: count}} with the keys "
                       f"{list(COMPONENTS)}")
        if set(got) != set(COMPONENTS):
            missing, unknown = sorted(set(COMPONENTS) - set(got)), sorted(set(got) - set(COMPONENTS), key=str)
            raise fail(f"{what}: keys {sorted(got, key=str)}; expected exactly {list(COMPONENTS)}"
                       + (f" (missing: {missing})" if missing else "") + (f" (unknown: {unknown})" if unknown else ""))
        outputs |= {f"{i}.{k}": _as_count(got[k], f"{what}[{k!r}]") for k in COMPONENTS}
    return outputs


def _breakdown_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    for i, config in enumerate(inputs["configs"]):
        counts = {k: got[f"{i}.{k}"] for k in COMPONENTS}
        check_parameter_count(counts, config, f"parameter_breakdown({config_name(config)})")
        if any(counts[k] != expected[f"{i}.{k}"] for k in COMPONENTS):  # the closed form disagrees with numel
            raise fail(f"parameter_breakdown({config_name(config)}): {counts}, but the model has "
                       f"{ {k: expected[f'{i}.{k}'] for k in COMPONENTS} }")
        _check_closed_form(got[f"{i}.made"], config, f"parameter_breakdown({config_name(config)})")


# ---- count_parameters(config) -> total


def _total_call(fn: Any, inputs: Inputs) -> Outputs:
    outputs: Outputs = {}
    for i, config in enumerate(inputs["configs"]):
        total, outputs[f"{i}.made"] = _largest_made(fn, config)
        outputs[f"{i}.total"] = _as_count(total, f"count_parameters({config_name(config)})")
    return outputs


def _total_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    for i, config in enumerate(inputs["configs"]):
        check_parameter_count(got[f"{i}.total"], config, f"count_parameters({config_name(config)})")
        if got[f"{i}.total"] != expected[f"{i}.total"]:
            raise fail(f"count_parameters({config_name(config)}): {got[f'{i}.total']:,}, but the model has "
                       f"{expected[f'{i}.total']:,}")
        _check_closed_form(got[f"{i}.made"], config, f"count_parameters({config_name(config)})")


# ---- the configs: published presets, three variants, and random ones


def random_config(r: random.Random) -> GPTConfig:
    """Any architecture the config can express, at sizes from tiny to large."""
    h, d = r.randint(1, 16), r.choice([8, 16, 32, 64, 128])
    mlp = r.choice(["relu", "gelu", "gelu_tanh", "swiglu"])
    return GPTConfig(
        vocab_size=r.randint(50, 60_000), context_length=r.choice([128, 512, 1000, 2048]), d_model=h * d,
        n_heads=h, n_layers=r.randint(1, 40), position=r.choice(["learned", "rope", "none"]),
        norm=r.choice(["layernorm", "rmsnorm"]), norm_bias=r.random() < 0.5, mlp=mlp,
        d_ff=r.choice([None, r.randint(16, 4 * h * d)]), attn_bias=r.random() < 0.5, mlp_bias=r.random() < 0.5,
        tie_weights=r.random() < 0.5, lm_head_bias=r.random() < 0.3,
    )


VARIANTS = (
    preset("seed-repo"),  # learned, LayerNorm, ReLU, untied head with a bias, no attention biases
    GPTConfig(vocab_size=300, context_length=128, d_model=48, n_heads=3, n_layers=5, position="none",
              norm="layernorm", norm_bias=False, mlp="gelu", d_ff=100, attn_bias=False, mlp_bias=False),
    GPTConfig(vocab_size=1000, context_length=256, d_model=64, n_heads=8, n_layers=3, position="rope",
              norm="rmsnorm", mlp="swiglu", attn_bias=True, mlp_bias=True, tie_weights=True),
)
PIECES = declare(
    Piece("06", "parameter_breakdown", _model_breakdown, _breakdown_call, judge=_breakdown_judge,
          forbidden=_BREAKDOWN,
          visible=[("visible", "parameter_breakdown of seed-tiny (24,096) and seed-tiny-untied (27,296)",
                    given(configs=[preset("seed-tiny"), preset("seed-tiny-untied")])),
                   ("gpt2", "parameter_breakdown of gpt2-small (124,439,808)", given(configs=[preset("gpt2-small")])),
                   ("llama", "parameter_breakdown of llama2-7b (6,738,415,616)", given(configs=[preset("llama2-7b")]))],
          hidden=[("hidden_variants", "parameter_breakdown of seed-repo, no positions, biased SwiGLU",
                   given(configs=list(VARIANTS))),
                  ("hidden_random", "parameter_breakdown of three random configs",
                   sized(lambda r, seed: {"configs": [random_config(r) for _ in range(3)]}))]),
    Piece("06", "count_parameters", _model_total, _total_call, judge=_total_judge, forbidden=_TOTAL,
          visible=[("visible", "count_parameters of seed-tiny (24,096) and seed-tiny-untied (27,296)",
                    given(configs=[preset("seed-tiny"), preset("seed-tiny-untied")])),
                   ("published", "count_parameters of gpt2-small (124,439,808) and llama2-7b (6,738,415,616)",
                    given(configs=[preset("gpt2-small"), preset("llama2-7b")]))],
          hidden=[("hidden_random", "count_parameters of seed-repo, no positions, a biased SwiGLU and three random "
                   "configs", sized(lambda r, seed: {"configs": [*VARIANTS, *(random_config(r) for _ in range(3))]}))]),
)
