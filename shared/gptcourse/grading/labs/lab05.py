"""Lab 05, assembling GPT: the student's `GPT(config)` with `forward(idx)` -> logits and `forward_hidden(idx)`.

The student's model has gptcourse.GPT's parameter names: `tok_emb` (nn.Embedding), `pos_emb` (LearnedPositions
or None), `rope` (RotaryEmbedding or None, no parameters), `blocks` (nn.ModuleList of gptcourse.DecoderBlock),
`final_norm`, `lm_head` (nn.Linear(C, V), its weight the token table when tied). The cases load reference
weights into it. A model that forgets to tie gets the token table in its own head too, so its logits are
judged on their own and only the tying test fails.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...checks import check_causal, check_parameter_count, check_shape, fail, perturbed_copies
from ...model.config import GPTConfig, preset
from ...model.gpt import GPT
from ..cases import Case, Inputs, Outputs, case_family, random_weights, register, sizes_rng, tensor_rng
from ..fixtures import check_close_lazily, load_gpt_weights, reference_gpt
from ..student import as_tensor

_REFERENCE = ("gptcourse.GPT", "gptcourse.model.gpt", "gptcourse.model.hf", "gptcourse.model.heads")
FORBIDDEN: dict[str, tuple[str, ...]] = {"gpt": _REFERENCE, "forward_hidden": _REFERENCE, "tying": _REFERENCE}

LOGITS_CAUSES = {("V", "C"): "the output projection is missing: forward returns lm_head(forward_hidden(idx)), "
                             "V scores per position"}
HIDDEN_CAUSES = {("C", "V"): "forward_hidden must stop before the output projection: it returns the hidden "
                             "states after the final norm, (B, T, C); forward applies lm_head to them"}


def _gpt_inputs(config: GPTConfig, b: int, t: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    with torch.device("meta"):  # shapes only: the weights are drawn below
        skeleton = GPT(config)
    return {
        "config": config,
        "weights": random_weights(skeleton, gen, scale=0.3),
        "idx": torch.randint(0, config.vocab_size, (b, t), generator=gen),
        "sizes": {"B": b, "T": t, "C": config.d_model, "V": config.vocab_size},
    }


def _describe(config: GPTConfig) -> str:
    tie = "tied" if config.tie_weights else "untied" + (" with bias" if config.lm_head_bias else "")
    return (f"GPT(V={config.vocab_size}, C={config.d_model}, H={config.n_heads}, N={config.n_layers}, "
            f"{config.position} positions, {config.norm}, {config.mlp}, {tie} head)")


def _student_gpt(cls: Any, inputs: Inputs) -> nn.Module:
    config = inputs["config"]
    what = _describe(config)
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise fail(f"{what}: expected a class derived from nn.Module, got {type(cls).__name__} {cls!r}")
    return load_gpt_weights(cls(config), config, inputs["weights"], what)


def _variant(inputs: Inputs, **removed: Any) -> nn.Module:
    """The reference with pieces replaced, e.g. final_norm=nn.Identity(): what a model missing them computes."""
    model = reference_gpt(inputs["config"], inputs["weights"])
    for name, module in removed.items():
        setattr(model, name, module)
    return model


def _mistakes(inputs: Inputs, hidden: bool) -> dict[str, torch.Tensor]:
    """What common wrong assemblies compute: description -> logits (or hidden states when `hidden`)."""
    config, idx = inputs["config"], inputs["idx"]
    variants = {
        "the final norm is missing: forward_hidden applies final_norm after the last block":
            {"final_norm": nn.Identity()},
        "the blocks are not applied: x goes through every block in self.blocks, in order": {"blocks": nn.ModuleList()},
    }
    if config.position == "learned":
        variants["the positions are missing: add pos_emb of positions 0..T-1 to the token embeddings"] = \
            {"pos_emb": None}
    if config.position == "rope":
        variants["RoPE is not used: compute rope = self.rope(positions), the (cos, sin) of positions 0..T-1, "
                 "and pass it to every block, block(x, rope=rope)"] = {"rope": None}
    with torch.no_grad():
        return {what: (_variant(inputs, **removed).forward_hidden if hidden else _variant(inputs, **removed))(idx)
                for what, removed in variants.items()}


# ---- forward(idx) -> logits (B, T, V)


def _logits_run(cls: Any, inputs: Inputs) -> Outputs:
    model = _student_gpt(cls, inputs)
    with torch.no_grad():
        logits = model(inputs["idx"].clone())
    return {"logits": as_tensor(logits, f"{_describe(inputs['config'])} on idx {tuple(inputs['idx'].shape)}")}


def _logits_reference(inputs: Inputs) -> Outputs:
    with torch.no_grad():
        return {"logits": reference_gpt(inputs["config"], inputs["weights"])(inputs["idx"])}


def _logits_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["logits"], "B T V", inputs["sizes"], "logits", causes=LOGITS_CAUSES)
    check_close_lazily(got["logits"], expected["logits"], "logits", lambda: _mistakes(inputs, hidden=False),
                       atol=1e-4)


_logits_case = case_family(_logits_run, _logits_reference, _logits_judge)


def _causal_run(cls: Any, inputs: Inputs) -> Outputs:
    model = _student_gpt(cls, inputs)
    copies = perturbed_copies(inputs["idx"], dim=1, vocab_size=inputs["config"].vocab_size)  # (T + 1, B, T)
    with torch.no_grad():
        outputs = [as_tensor(model(ids.clone()), f"{_describe(inputs['config'])}") for ids in copies]
    if len({tuple(o.shape) for o in outputs}) != 1:
        raise fail("the model's output shape changes when one token changes")
    return {"outputs": torch.stack(outputs)}  # (T + 1, B, T, V)


def _causal_reference(inputs: Inputs) -> Outputs:
    model = reference_gpt(inputs["config"], inputs["weights"])
    with torch.no_grad():
        return {"outputs": torch.stack([model(ids) for ids in perturbed_copies(
            inputs["idx"], dim=1, vocab_size=inputs["config"].vocab_size)])}


def _causal_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    if got["outputs"].dim() < 3:
        raise fail(f"the model returned shape {tuple(got['outputs'].shape[1:])}, expected (B, T, ...)")
    check_causal(got["outputs"], "the model's outputs", dim=1, atol=1e-5)


def _config(v: int, c: int, h: int, n: int, t_max: int, **changes: Any) -> GPTConfig:
    return GPTConfig(vocab_size=v, d_model=c, n_heads=h, n_layers=n, context_length=t_max, **changes)


LLAMA_LIKE = {"position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "attn_bias": False, "mlp_bias": False,
              "tie_weights": False}
SEED_REPO_LIKE = {"position": "learned", "norm": "layernorm", "mlp": "relu", "attn_bias": False, "tie_weights": False,
                  "lm_head_bias": True}


def _random_config(r: Any) -> GPTConfig:
    """Other sizes and a non-default number of heads, with one of the three families."""
    h = r.choice([1, 2, 8])
    family = r.choice([{}, LLAMA_LIKE, SEED_REPO_LIKE])
    return _config(r.randint(70, 99), 8 * h if h > 2 else 16, h, r.randint(1, 3), r.randint(10, 16), **family)


def _hidden_sizes(seed: int) -> Inputs:
    r = sizes_rng(seed)
    config = _random_config(r)
    return _gpt_inputs(config, r.randint(2, 3), r.randint(3, config.context_length - 1), seed)


SEED_TINY = preset("seed-tiny").replace(context_length=16)
register(
    _logits_case("05.gpt.visible", "GPT(GPTConfig()) (learned positions, LayerNorm, GELU, tied) on idx (2, 5)",
                 lambda seed: _gpt_inputs(GPTConfig(), 2, 5, seed)),
    _logits_case("05.gpt.rope", "GPT(seed-tiny) (RoPE, RMSNorm, SwiGLU, tied) on idx (3, 7)",
                 lambda seed: _gpt_inputs(SEED_TINY, 3, 7, seed)),
    Case("05.gpt.causal", "GPT is causal: changing a later token never changes earlier logits",
         lambda seed: _gpt_inputs(_config(50, 24, 3, 2, 12), 2, 5, seed), _causal_run, _causal_reference,
         _causal_judge),
    _logits_case("05.gpt.hidden_single", "GPT on a single token (B=1, T=1), untied Llama-like",
                 lambda seed: _gpt_inputs(_config(30, 16, 2, 1, 8, **LLAMA_LIKE), 1, 1, seed), hidden=True),
    _logits_case("05.gpt.hidden_rope_untied", "GPT with RoPE, 8 heads and an untied head (Llama-like)",
                 lambda seed: _gpt_inputs(_config(60, 32, 8, 2, 12, **LLAMA_LIKE), 2, 7, seed), hidden=True),
    _logits_case("05.gpt.hidden_head_bias", "GPT with an untied output projection with bias (batch 1, full context)",
                 lambda seed: _gpt_inputs(_config(45, 20, 5, 2, 9, **SEED_REPO_LIKE), 1, 9, seed), hidden=True),
    _logits_case("05.gpt.hidden_sizes", "GPT with other sizes and heads", _hidden_sizes, hidden=True),
)

# ---- forward_hidden(idx) -> (B, T, C), the states the output projection reads


def _hidden_run(cls: Any, inputs: Inputs) -> Outputs:
    model = _student_gpt(cls, inputs)
    if not callable(getattr(model, "forward_hidden", None)):
        raise fail("the model has no method forward_hidden(idx)")
    with torch.no_grad():
        hidden = model.forward_hidden(inputs["idx"].clone())
    return {"hidden": as_tensor(hidden, f"forward_hidden of {_describe(inputs['config'])}")}


def _hidden_reference(inputs: Inputs) -> Outputs:
    with torch.no_grad():
        return {"hidden": reference_gpt(inputs["config"], inputs["weights"]).forward_hidden(inputs["idx"])}


def _hidden_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["hidden"], "B T C", inputs["sizes"], "forward_hidden", causes=HIDDEN_CAUSES)
    check_close_lazily(got["hidden"], expected["hidden"], "forward_hidden", lambda: _mistakes(inputs, hidden=True),
                       atol=1e-4)


_hidden_case = case_family(_hidden_run, _hidden_reference, _hidden_judge)


register(
    _hidden_case("05.forward_hidden.visible", "forward_hidden of GPT(GPTConfig()) on idx (2, 5)",
                 lambda seed: _gpt_inputs(GPTConfig(), 2, 5, seed)),
    _hidden_case("05.forward_hidden.hidden_single", "forward_hidden on a single token (B=1, T=1)",
                 lambda seed: _gpt_inputs(_config(30, 16, 2, 1, 8, **SEED_REPO_LIKE), 1, 1, seed), hidden=True),
    _hidden_case("05.forward_hidden.hidden_rope", "forward_hidden with RoPE on a batch of one (B=1, T=5)",
                 lambda seed: _gpt_inputs(SEED_TINY, 1, 5, seed), hidden=True),
    _hidden_case("05.forward_hidden.hidden_sizes", "forward_hidden with other sizes and heads", _hidden_sizes,
                 hidden=True),
)

# ---- tying: one (V, C) matrix for the token table and the output projection, counted once


def _tying_inputs(config: GPTConfig) -> Inputs:
    return {"tied": config.replace(tie_weights=True), "untied": config.replace(tie_weights=False)}


def _tying_run(cls: Any, inputs: Inputs) -> Outputs:
    outputs: Outputs = {}
    for kind in ("tied", "untied"):
        config = inputs[kind]
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise fail(f"expected a class derived from nn.Module, got {type(cls).__name__} {cls!r}")
        model = cls(config)
        head, table = getattr(model, "lm_head", None), getattr(model, "tok_emb", None)
        if not isinstance(head, nn.Linear) or not isinstance(table, nn.Embedding):
            raise fail(f"{_describe(config)}: the lab fixes tok_emb = nn.Embedding(V, C) and lm_head = "
                       f"nn.Linear(C, V); found tok_emb {type(table).__name__}, lm_head {type(head).__name__}")
        outputs[f"{kind}_count"] = sum(p.numel() for p in model.parameters())  # a shared tensor counted once
        outputs[f"{kind}_shared"] = head.weight is table.weight
    return outputs


def _tying_reference(inputs: Inputs) -> Outputs:
    counts = {}
    for kind in ("tied", "untied"):
        with torch.device("meta"):
            counts[kind] = sum(p.numel() for p in GPT(inputs[kind]).parameters())
    return {"tied_count": counts["tied"], "untied_count": counts["untied"], "tied_shared": True,
            "untied_shared": False}


def _tying_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    tied, untied = inputs["tied"], inputs["untied"]
    check_parameter_count(got["tied_count"], tied, f"parameters of {_describe(tied)}")
    if not got["tied_shared"]:
        raise fail(f"{_describe(tied)}: lm_head.weight must be the very tensor tok_emb.weight (tie them with "
                   "self.lm_head.weight = self.tok_emb.weight; a copy is two matrices that drift apart in training)")
    check_parameter_count(got["untied_count"], untied, f"parameters of {_describe(untied)}")
    if got["untied_shared"]:
        raise fail(f"{_describe(untied)}: with tie_weights=False, lm_head has its own (V, C) weight, not "
                   "tok_emb.weight")
    if got["untied_count"] - got["tied_count"] != untied.vocab_size * untied.d_model:
        raise fail("untying should add exactly V x C parameters")


def _tying_hidden(seed: int) -> Inputs:
    return _tying_inputs(_random_config(sizes_rng(seed)))


register(
    Case("05.tying.visible", "GPT(GPTConfig()) tied and untied: untied has V x C = 3,200 parameters more",
         lambda seed: _tying_inputs(GPTConfig()), _tying_run, _tying_reference, _tying_judge),
    Case("05.tying.hidden_head_bias", "tied and untied with an output bias and RoPE",
         lambda seed: _tying_inputs(_config(45, 20, 5, 2, 9, **LLAMA_LIKE | {"lm_head_bias": True})),
         _tying_run, _tying_reference, _tying_judge, hidden=True),
    Case("05.tying.hidden_sizes", "tied and untied with other sizes and heads", _tying_hidden, _tying_run,
         _tying_reference, _tying_judge, hidden=True),
)
