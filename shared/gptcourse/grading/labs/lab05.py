"""Lab 05, assembling GPT: the student's `GPT(config)` with `forward(idx)` -> logits and `forward_hidden(idx)`.

The student's model has gptcourse.GPT's parameter names: `tok_emb` (nn.Embedding), `pos_emb` (LearnedPositions
or None), `rope` (RotaryEmbedding or None, no parameters), `blocks` (nn.ModuleList of gptcourse.DecoderBlock),
`final_norm`, `lm_head` (nn.Linear(C, V), its weight the token table when tied). The cases load reference
weights into it. A model that forgets to tie gets the token table in its own head too, so its logits are
judged on their own and only the tying test fails. One piece, GPT, whose reference is gptcourse.GPT: its
variants test the logits, causality, `forward_hidden` and the tied head (the last two with calls of their own).
"""

from __future__ import annotations

import random
from typing import Any

import torch
from torch import nn

from ...checks import Mistake, check_causal, check_parameter_count, check_shape, fail, perturbed_copies
from ...model.config import GPTConfig, preset
from ...model.gpt import GPT
from ...model.params import block_breakdown, parameter_breakdown
from ..cases import Inputs, Outputs, random_weights, sized, sizes_rng, tensor_rng
from ..fixtures import check_close_lazily, gpt_config, load_gpt_weights, reference_gpt
from ..piece import Piece, Probe, declare
from ..student import as_tensor, module_class

# what each call returns -> (its name in messages, its shape, the likely cause of a wrong size)
_STATES = {
    "logits": ("logits", "B T V", {("V", "C"): Mistake("05.no_lm_head",
                                                       "the output projection is missing: forward returns "
                                                       "lm_head(forward_hidden(idx)), V scores per position")}),
    "hidden": ("forward_hidden", "B T C", {("C", "V"): Mistake("05.hidden_through_lm_head",
                                                            "forward_hidden must stop before the output projection: it "
                                                       "returns the hidden states after the final norm, (B, T, C); "
                                                       "forward applies lm_head to them")}),
}


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


def _built(cls: Any, inputs: Inputs) -> nn.Module:
    """`cls(config)` (the student's GPT or the reference) with the case's weights loaded."""
    config = inputs["config"]
    what = _describe(config)
    model = module_class(cls, what)(config)
    if config.position == "none" and getattr(model, "pos_emb", None) is not None:
        raise fail(f"{what}: position='none' means no position information at all (NoPE): pos_emb is None and "
                   "nothing is added to the token embeddings; only position='learned' has a table",
                   mistake="05.nope_has_pos_emb")
    return load_gpt_weights(model, config, inputs["weights"], what)


def _forward(model: nn.Module, inputs: Inputs, method: str) -> Any:
    """`model.<method>(idx)`, watching what its pos_emb and rope are given: positions that are not 0..T-1 are named,
    whether the forward then raised (the token ids index a table of T_max rows) or not."""
    idx = inputs["idx"]
    given: dict[str, Any] = {}

    def record(name: str) -> Any:
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:  # returns None: the call's arguments stay
            given.setdefault(name, args[:1])
        return hook

    hooks = [module.register_forward_pre_hook(record(name))
             for name in ("pos_emb", "rope") if isinstance(module := getattr(model, name, None), nn.Module)]
    try:
        with torch.no_grad():
            out = getattr(model, method)(idx.clone())
    except Exception:
        _check_positions(given, idx, inputs["config"])
        raise
    finally:
        for hook in hooks:
            hook.remove()
    _check_positions(given, idx, inputs["config"])
    return out


def _check_positions(given: dict[str, Any], idx: torch.Tensor, config: GPTConfig) -> None:
    """pos_emb and rope take the positions of this input, 0..T-1: not the token ids, not the whole context."""
    t = idx.shape[1]
    for name, args in given.items():
        positions = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if positions is None:
            continue
        if positions.shape == idx.shape and torch.equal(positions, idx) and not torch.equal(idx[0], torch.arange(t)):
            raise fail(f"self.{name} is given the token ids idx (B, T): it takes the positions 0..T-1, "
                       f"torch.arange(T), one row per position (T_max = {config.context_length}), not per token id",
                       mistake="05.positions_are_token_ids")
        if positions.dim() >= 1 and positions.shape[-1] != t:
            raise fail(f"self.{name} is given {positions.shape[-1]} positions for T = {t} tokens: it takes the "
                       "positions of this input, torch.arange(T), not the whole context "
                       f"(context_length = {config.context_length})", mistake="05.positions_whole_context")


def _mistakes(inputs: Inputs, hidden: bool) -> dict[str, torch.Tensor]:
    """What common wrong assemblies compute: description -> logits (or hidden states when `hidden`), from the
    reference with pieces replaced (final_norm=nn.Identity(): what a model missing it computes)."""
    config, idx = inputs["config"], inputs["idx"]
    variants = {
        Mistake("05.no_final_norm",
                "the final norm is missing: forward_hidden applies final_norm after the last block"):
            {"final_norm": nn.Identity()},
        Mistake("05.blocks_not_applied",
        "the blocks are not applied: x goes through every block in self.blocks, in order"): {"blocks": nn.ModuleList()},
    }
    if config.n_layers > 1:  # one block in every layer: loading the weights left the last layer's in it
        variants[SHARED_BLOCKS] = {"blocks": "shared"}
    if config.position == "learned":
        variants[Mistake("05.no_positions",
                         "the positions are missing: add pos_emb of positions 0..T-1 to the token embeddings")] = \
            {"pos_emb": None}
    if config.position == "rope":
        variants[Mistake("05.rope_not_used",
                         "RoPE is not used: compute rope = self.rope(positions), the (cos, sin) of positions 0..T-1, "
                         "and pass it to every block, block(x, rope=rope)")] = {"rope": None}
    wrong = {}
    for what, removed in variants.items():
        model = reference_gpt(config, inputs["weights"])
        for name, module in removed.items():
            setattr(model, name, nn.ModuleList([model.blocks[-1]] * config.n_layers) if module == "shared" else module)
        with torch.no_grad():
            wrong[what] = model.forward_hidden(idx) if hidden else model(idx)
    if not hidden:
        with torch.no_grad():
            wrong[Mistake("05.returns_probabilities",
                          "forward returns probabilities, a softmax over V: it returns the logits themselves, "
                          "lm_head(forward_hidden(idx)) (the loss and sampling apply the softmax)")] = \
                reference_gpt(config, inputs["weights"])(idx).softmax(-1)
    return wrong


SHARED_BLOCKS = (Mistake("05.shared_blocks",
                        "the N blocks are one block repeated ([DecoderBlock(config)] * N puts the same module in every "
                        "layer, sharing its weights): build each layer its own, nn.ModuleList(DecoderBlock(config) for "
                        "_ in range(N))"))


# ---- forward(idx) -> logits (B, T, V), and forward_hidden(idx) -> the (B, T, C) states lm_head reads


def _logits_call(cls: Any, inputs: Inputs) -> Outputs:
    model = _built(cls, inputs)
    logits = _forward(model, inputs, "forward")
    return {"logits": as_tensor(logits, f"{_describe(inputs['config'])} on idx {tuple(inputs['idx'].shape)}")}


def _hidden_call(cls: Any, inputs: Inputs) -> Outputs:
    model = _built(cls, inputs)
    if not callable(getattr(model, "forward_hidden", None)):
        raise fail("the model has no method forward_hidden(idx)")
    hidden = _forward(model, inputs, "forward_hidden")
    return {"hidden": as_tensor(hidden, f"forward_hidden of {_describe(inputs['config'])}")}


def _states_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    """The logits or the hidden states, whichever the call returned, are the reference's; the known mistakes
    (a model run each) are computed only when they are not."""
    [(key, want)] = expected.items()
    label, shape, causes = _STATES[key]
    check_shape(got[key], shape, inputs["sizes"], label, causes=causes)
    check_close_lazily(got[key], want, label, lambda: _mistakes(inputs, hidden=key == "hidden"), atol=1e-4)


def _causal_call(cls: Any, inputs: Inputs) -> Outputs:
    model = _built(cls, inputs)
    copies = perturbed_copies(inputs["idx"], dim=1, vocab_size=inputs["config"].vocab_size)  # (T + 1, B, T)
    outputs = [as_tensor(_forward(model, inputs | {"idx": ids}, "forward"), f"{_describe(inputs['config'])}")
               for ids in copies]  # each call's positions watched: token ids as positions are named
    if len({tuple(o.shape) for o in outputs}) != 1:
        raise fail("the model's output shape changes when one token changes")
    return {"outputs": torch.stack(outputs)}  # (T + 1, B, T, V)


def _causal_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    if got["outputs"].dim() < 3:
        raise fail(f"the model returned shape {tuple(got['outputs'].shape[1:])}, expected (B, T, ...)")
    check_causal(got["outputs"], "the model's outputs", dim=1, atol=1e-5)


# ---- tying: one (V, C) matrix for the token table and the output projection, counted once


def _tying_inputs(config: GPTConfig) -> Inputs:
    return {"tied": config.replace(tie_weights=True), "untied": config.replace(tie_weights=False)}


def _tying_call(cls: Any, inputs: Inputs) -> Outputs:
    outputs: Outputs = {}
    for kind in ("tied", "untied"):
        config = inputs[kind]
        model = module_class(cls, _describe(config))(config)
        head, table = getattr(model, "lm_head", None), getattr(model, "tok_emb", None)
        if not isinstance(head, nn.Linear) or not isinstance(table, nn.Embedding):
            raise fail(f"{_describe(config)}: the lab fixes tok_emb = nn.Embedding(V, C) and lm_head = "
                       f"nn.Linear(C, V); found tok_emb {type(table).__name__}, lm_head {type(head).__name__}")
        outputs[f"{kind}_count"] = sum(p.numel() for p in model.parameters())  # a shared tensor counted once
        outputs[f"{kind}_shared"] = head.weight is table.weight
        outputs[f"{kind}_copied"] = (head.weight is not table.weight and head.weight.shape == table.weight.shape
                                     and bool(torch.equal(head.weight, table.weight)))
    return outputs


def _tying_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    tied, untied = inputs["tied"], inputs["untied"]
    if got["tied_copied"]:
        raise fail(f"{_describe(tied)}: lm_head.weight is a copy of tok_emb.weight, two (V, C) matrices that start "
                   "equal and drift apart in training (and are counted twice): share the one tensor, "
                   "self.lm_head.weight = self.tok_emb.weight", mistake="05.head_copied")
    for kind, config in (("tied", tied), ("untied", untied)):
        missing = sum(parameter_breakdown(config).values()) - got[f"{kind}_count"]
        block = sum(block_breakdown(config).values())
        if config.n_layers > 1 and missing == (config.n_layers - 1) * block:
            raise fail(f"parameters of {_describe(config)}: {missing:,} too few, (N - 1) = {config.n_layers - 1} "
                       f"blocks' worth: {SHARED_BLOCKS}", mistake=SHARED_BLOCKS.key)
        if missing == config.n_layers * block:
            raise fail(f"parameters of {_describe(config)}: {missing:,} too few, all N = {config.n_layers} blocks' "
                       "worth: the blocks are not registered as submodules (a plain Python list hides them from "
                       "parameters(), state_dict() and .to()): self.blocks = nn.ModuleList(...)",
                       mistake="05.blocks_not_registered")
    check_parameter_count(got["tied_count"], tied, f"parameters of {_describe(tied)}")
    if not got["tied_shared"]:
        raise fail(f"{_describe(tied)}: lm_head.weight must be the very tensor tok_emb.weight (tie them with "
                   "self.lm_head.weight = self.tok_emb.weight; a copy is two matrices that drift apart in training)",
                   mistake="05.not_tied")
    check_parameter_count(got["untied_count"], untied, f"parameters of {_describe(untied)}")
    if got["untied_shared"]:
        raise fail(f"{_describe(untied)}: with tie_weights=False, lm_head has its own (V, C) weight, not "
                   "tok_emb.weight", mistake="05.tied_when_untied")
    if got["untied_count"] - got["tied_count"] != untied.vocab_size * untied.d_model:
        raise fail("untying should add exactly V x C parameters")


# ---- the configs: the default (GPT-2-like), seed-tiny and two other families, at small sizes


LLAMA_LIKE = {"position": "rope", "norm": "rmsnorm", "mlp": "swiglu", "attn_bias": False, "mlp_bias": False,
              "tie_weights": False}
SEED_REPO_LIKE = {"position": "learned", "norm": "layernorm", "mlp": "relu", "attn_bias": False, "tie_weights": False,
                  "lm_head_bias": True}
SEED_TINY = preset("seed-tiny").replace(context_length=16)


def _random_config(r: random.Random) -> GPTConfig:
    """Other sizes and a non-default number of heads, with one of the three families."""
    h = r.choice([1, 2, 8])
    family = r.choice([{}, LLAMA_LIKE, SEED_REPO_LIKE])
    return gpt_config(r.randint(70, 99), 8 * h if h > 2 else 16, h, r.randint(1, 3), r.randint(10, 16), **family)


@sized
def _hidden_sizes(r: random.Random, seed: int) -> Inputs:
    config = _random_config(r)
    return _gpt_inputs(config, r.randint(2, 3), r.randint(3, config.context_length - 1), seed)


_FORWARD_HIDDEN, _TYING = Probe(_hidden_call, _states_judge), Probe(_tying_call, _tying_judge)
PIECES = declare(
    Piece("05", "GPT", GPT, _logits_call, judge=_states_judge,
          forbidden=("gptcourse.GPT", "gptcourse.model.gpt", "gptcourse.model.hf", "gptcourse.model.heads"),
          visible=[("visible", "GPT(GPTConfig()) (learned positions, LayerNorm, GELU, tied) on idx (2, 5)",
                    lambda seed: _gpt_inputs(GPTConfig(), 2, 5, seed)),
                   ("rope", "GPT(seed-tiny) (RoPE, RMSNorm, SwiGLU, tied) on idx (3, 7)",
                    lambda seed: _gpt_inputs(SEED_TINY, 3, 7, seed)),
                   ("causal", "GPT is causal: changing a later token never changes earlier logits",
                    lambda seed: _gpt_inputs(gpt_config(50, 24, 3, 2, 12), 2, 5, seed),
                    Probe(_causal_call, _causal_judge)),
                   ("forward_hidden", "forward_hidden of GPT(GPTConfig()) on idx (2, 5)",
                    lambda seed: _gpt_inputs(GPTConfig(), 2, 5, seed), _FORWARD_HIDDEN),
                   ("tying", "GPT(GPTConfig()) tied and untied: untied has V x C = 3,200 parameters more",
                    lambda seed: _tying_inputs(GPTConfig()), _TYING)],
          hidden=[("hidden_single", "GPT on a single token (B=1, T=1), untied Llama-like",
                   lambda seed: _gpt_inputs(gpt_config(30, 16, 2, 1, 8, **LLAMA_LIKE), 1, 1, seed)),
                  ("hidden_rope_untied", "GPT with RoPE, 8 heads and an untied head (Llama-like)",
                   lambda seed: _gpt_inputs(gpt_config(60, 32, 8, 2, 12, **LLAMA_LIKE), 2, 7, seed)),
                  ("hidden_head_bias", "GPT with an untied output projection with bias (batch 1, full context)",
                   lambda seed: _gpt_inputs(gpt_config(45, 20, 5, 2, 9, **SEED_REPO_LIKE), 1, 9, seed)),
                  ("hidden_sizes", "GPT with other sizes and heads", _hidden_sizes),
                  ("hidden_no_positions", "GPT with position='none' (no position information: NoPE), untied",
                   lambda seed: _gpt_inputs(gpt_config(40, 16, 2, 2, 10, position="none", tie_weights=False), 2, 6,
                                            seed)),
                  ("hidden_forward_hidden_single", "forward_hidden on a single token (B=1, T=1)",
                   lambda seed: _gpt_inputs(gpt_config(30, 16, 2, 1, 8, **SEED_REPO_LIKE), 1, 1, seed),
                   _FORWARD_HIDDEN),
                  ("hidden_forward_hidden_rope", "forward_hidden with RoPE on a batch of one (B=1, T=5)",
                   lambda seed: _gpt_inputs(SEED_TINY, 1, 5, seed), _FORWARD_HIDDEN),
                  ("hidden_forward_hidden_sizes", "forward_hidden with other sizes and heads", _hidden_sizes,
                   _FORWARD_HIDDEN),
                  ("hidden_tying_head_bias", "tied and untied with an output bias and RoPE",
                   lambda seed: _tying_inputs(gpt_config(45, 20, 5, 2, 9, **LLAMA_LIKE | {"lm_head_bias": True})),
                   _TYING),
                  ("hidden_tying_sizes", "tied and untied with other sizes and heads",
                   lambda seed: _tying_inputs(_random_config(sizes_rng(seed))), _TYING)]),
)
