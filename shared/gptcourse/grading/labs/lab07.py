"""Lab 07, training and generation: `next_token_loss(model, tokens)`, `train_step(model, optimizer, tokens,
grad_clip)`, `next_token_probs(logits, temperature, top_k)` and `sample_next_token(model, idx, temperature, top_k,
generator)`.

The model is gptcourse.GPT with reference weights (earlier labs' pieces come from the package); the optimizer is
torch's SGD, whose update is plain enough that a missing clip or a gradient left over from the previous step shows
in the parameters. The references are gptcourse's lm_loss, train_step, filter_logits and generate, each behind a
function with the lab's arguments (the package's take x and y, or sample a whole continuation).
"""

from __future__ import annotations

import math
import random
from functools import partial
from typing import Any

import torch
from torch.nn import functional as F

from ...checks import CheckFailed, Mistake, check_close, check_dtype, check_shape, fail, fmt_shape
from ...inference.sampling import filter_logits, generate
from ...model.config import GPTConfig
from ...training.loop import lm_loss, train_step
from ..cases import Inputs, Outputs, sized, sizes_rng, tensor_rng
from ..fixtures import (
    LOG_SOFTMAX_FUNCTIONS,
    case_gpt,
    check_close_lazily,
    check_differentiable,
    check_scalar_loss,
    flat_parameters,
    gpt_config,
    gpt_inputs,
    gpt_with_tokens,
    loss_outputs,
    switch_key,
)
from ..piece import Piece, declare
from ..student import as_number, as_tensor, returns

# Each piece forbids what computes its own answer; the module entries are gone, so that each name belongs to the
# piece it answers. train_step and sample_next_token call the student's next_token_loss and next_token_probs, but
# the loss is not the step's point (zero_grad, backward, clip, step) nor the filter the sample's (the last
# position, greedy at 0, one draw from the generator): neither forbids its part's reference. (In a graded kernel
# every reference the lab names is a stub, so a step that calls lm_loss still fails, by its error.)
# The loss's point is the shift (position t predicts token t + 1): the later lessons' functions that shift for the
# student are its references too.
_LOSS = LOG_SOFTMAX_FUNCTIONS
_STEP = ("gptcourse.training.loop.train_step", "gptcourse.train")
_PROBS = ("gptcourse.filter_logits", "gptcourse.top_k_routing")  # lesson 16's router: top k, then their softmax
_SAMPLE = ("gptcourse.generate", "gptcourse.widgets.TemperatureSampler")

# ---- next_token_loss(model, tokens (B, T + 1)) -> the mean cross-entropy of predicting tokens[:, 1:]


def _next_token_loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """The reference: gptcourse's lm_loss on x = tokens[:, :-1], y = tokens[:, 1:]."""
    return lm_loss(model, tokens[:, :-1], tokens[:, 1:])


def _loss_call(fn: Any, inputs: Inputs) -> Outputs:
    tokens = inputs["tokens"]
    what = f"next_token_loss(model, tokens {fmt_shape(tokens.shape)})"
    return loss_outputs(fn(case_gpt(inputs), tokens.clone()), what)


def _loss_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    model, tokens = case_gpt(inputs), inputs["tokens"]
    x, y = tokens[:, :-1], tokens[:, 1:]  # each (B, T)
    with torch.no_grad():
        logits = model(x)  # (B, T, V)
        mistakes = {
            Mistake("07.targets_not_shifted", "the targets are not shifted: the target at position t is the next "
                                              "token, so x = tokens[:, :-1] and y = tokens[:, 1:]"):
            lm_loss(model, x, x),
            Mistake("07.x_y_swapped", "x and y are swapped: the model reads x = tokens[:, :-1] and predicts y = "
                                      "tokens[:, 1:]"):
                lm_loss(model, y, x),
            Mistake("07.softmax_before_loss", "the logits went through a softmax first: F.cross_entropy takes the "
                                              "raw logits (it applies log_softmax itself)"):
            F.cross_entropy(logits.softmax(-1).flatten(0, 1), y.flatten()),
            Mistake("07.loss_summed", "the loss is summed over the B x T positions: average it (F.cross_entropy's "
                                      "default reduction='mean')"):
            F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum"),
            Mistake("07.last_position_only", "only the last position is scored: every position t predicts token t + "
                                             "1"):
                F.cross_entropy(logits[:, -1], y[:, -1]),
            Mistake("07.targets_flattened_transposed", "the targets are flattened in another order than the logits "
                                                       "(y.T, or a transpose before the reshape): row b * T + t of "
                                                       "logits.flatten(0, 1) is sequence b's position t, so flatten "
                                                       "y the same way, y.flatten()"):
            F.cross_entropy(logits.flatten(0, 1), y.T.flatten()),
        }
        if tokens.size(1) > 2:
            mistakes[Mistake("07.targets_shifted_twice", "the targets are shifted twice: tokens[:, 1:] is already "
                                                         "the next token, so position t is scored against token t + "
                                                         "2. Shift once: x = tokens[:, :-1], y = tokens[:, 1:], and "
                                                         "compare model(x) with y as they are")] = \
                F.cross_entropy(logits[:, :-1].flatten(0, 1), y[:, 1:].flatten())
        if tokens.size(1) <= inputs["config"].context_length:
            mistakes[Mistake("07.targets_not_shifted", "the targets are not shifted: x and y are both the whole "
                                                       "sequence; use x = tokens[:, :-1] and y = tokens[:, 1:]")] = \
                lm_loss(model, tokens, tokens)
    return mistakes


def _loss_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_scalar_loss(got["loss"], "average over all B x T positions, as F.cross_entropy(logits.flatten(0, 1), "
                                   "y.flatten()) does")
    check_close_lazily(got["loss"], expected["loss"], "the loss", lambda: _loss_mistakes(inputs))
    check_differentiable(got["differentiable"], "return the tensor computed from the model's logits (not loss.item() "
                         "or a detached copy), so that loss.backward() reaches the parameters")


@sized
def _loss_hidden(r: random.Random, seed: int) -> Inputs:
    h = r.choice([1, 2, 4])
    return gpt_with_tokens(gpt_config(r.randint(20, 60), 8 * h, h, r.randint(1, 2), 16), seed,
                           (r.randint(2, 5), r.randint(2, 15) + 1))


# ---- train_step(model, optimizer, tokens, grad_clip) -> the loss before the update


def _train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
                grad_clip: float) -> torch.Tensor:
    """The reference: gptcourse's train_step on x = tokens[:, :-1], y = tokens[:, 1:]."""
    return train_step(model, optimizer, tokens[:, :-1], tokens[:, 1:], grad_clip)


def _wrong_train_step(*, zero_grad: bool = True, clip: str | None = "norm", shift: bool = True,
                      loss_after: bool = False) -> Any:
    """A train_step with one of the usual mistakes, run through the same call as the student's: `clip` "norm"
    (right), "value" (each element clamped) or None; `loss_after` returns the loss after the update."""

    def step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, tokens: torch.Tensor,
             grad_clip: float) -> float:
        x = tokens[:, :-1]  # (B, T)
        if zero_grad:
            optimizer.zero_grad()
        loss = lm_loss(model, x, tokens[:, 1:] if shift else x)
        loss.backward()
        if clip == "norm":
            torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
        elif clip == "value":
            torch.nn.utils.clip_grad_value_(model.parameters(), grad_clip)
        optimizer.step()
        if loss_after:
            with torch.no_grad():
                loss = lm_loss(model, x, tokens[:, 1:] if shift else x)
        return loss.item()

    return step


def _step_inputs(config: GPTConfig, b: int, t: int, steps: int, seed: int, momentum: float = 0.0,
                 weight_decay: float = 0.0) -> Inputs:
    gen = tensor_rng(seed)
    inputs = gpt_inputs(config, gen)
    return inputs | {"batches": [torch.randint(0, config.vocab_size, (b, t + 1), generator=gen)
                                 for _ in range(steps)],
                     "lr": 0.5, "grad_clip": 0.5, "momentum": momentum, "weight_decay": weight_decay}


def _step_call(fn: Any, inputs: Inputs) -> Outputs:
    model = case_gpt(inputs).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=inputs["lr"], momentum=inputs["momentum"],
                                weight_decay=inputs["weight_decay"])
    losses = [as_number(fn(model, optimizer, tokens.clone(), inputs["grad_clip"]),
                        f"train_step(model, optimizer, tokens {fmt_shape(tokens.shape)}, grad_clip)",
                        "the loss (a number or a 0-dim tensor)")
              for tokens in inputs["batches"]]
    return {"losses": torch.tensor(losses, dtype=torch.float64), "parameters": flat_parameters(model),
            "own_loss": _own_loss(fn, inputs)}


def _own_loss(fn: Any, inputs: Inputs) -> torch.Tensor:
    """What the student's own next_token_loss (where their train_step's cell sees one) gives on the case's first
    batch and untrained model, NaN where there is none or it fails: if train_step is wrong, the judge says whether
    this is why. It only ever changes a failing case's message."""
    own = getattr(fn, "__globals__", {}).get("next_token_loss")
    try:
        with torch.no_grad():
            value = as_number(own(case_gpt(inputs), inputs["batches"][0].clone()), "next_token_loss", "a number")
    except Exception:  # no next_token_loss, or one that raises: its own test says so
        value = float("nan")
    return torch.tensor(value, dtype=torch.float64)


STEP_MISTAKES = {
    "the gradients are not clipped: call torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip) after "
    "loss.backward() and before optimizer.step()": {"clip": None},
    "the gradients are clipped element by element (clip_grad_value_): clip their total norm, "
    "torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip), which scales every gradient by one factor and "
    "keeps the update's direction": {"clip": "value"},
    "the returned loss was computed after the update: return the loss that loss.backward() used, before "
    "optimizer.step() changed the parameters (loss.item() of that forward pass)": {"loss_after": True},
    "the gradients accumulate from one step to the next: call optimizer.zero_grad() before loss.backward(), or "
    "each step adds the old gradients to the new ones": {"zero_grad": False},
    "the targets are not shifted: the target at position t is the next token, tokens[:, t + 1]": {"shift": False},
}


def _step_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    if torch.equal(got["parameters"], flat_parameters(case_gpt(inputs))):
        raise fail("the parameters did not change: call loss.backward() and then optimizer.step() (in that order: "
                   "step() uses the gradients that backward() computed)")
    variants: dict[str, Outputs] = {}

    def mistakes(output: str) -> dict[str, torch.Tensor]:
        if not variants:
            variants.update({Mistake(switch_key(_step_call, _wrong_train_step, flags), what):
                             _step_call(_wrong_train_step(**flags), inputs) for what, flags in STEP_MISTAKES.items()})
        return {what: v[output] for what, v in variants.items()}

    try:
        check_close_lazily(got["parameters"], expected["parameters"], "the parameters after training",
                           lambda: mistakes("parameters"))
        check_close_lazily(got["losses"], expected["losses"], "the returned losses (before each update)",
                           lambda: mistakes("losses"))
    except CheckFailed as failure:
        first = inputs["batches"][0]
        with torch.no_grad():
            want = lm_loss(case_gpt(inputs), first[:, :-1], first[:, 1:]).item()
        own = float(got.get("own_loss", float("nan")))
        if math.isfinite(own) and not math.isclose(own, want, rel_tol=1e-4, abs_tol=1e-5):
            raise fail(f"your next_token_loss gives {own:.5g} on this case's first batch, where the mean "
                       f"cross-entropy is {want:.5g}: train_step builds on it, so fix next_token_loss first (its own "
                       f"test names the mistake). What train_step gave: {str(failure).rstrip('.')}") from None
        raise


# ---- next_token_probs(logits (B, V), temperature, top_k) -> probabilities (B, V)


def _next_token_probs(logits: torch.Tensor, temperature: float = 1.0, top_k: int | None = None) -> torch.Tensor:
    """The reference: gptcourse's filter_logits on the logits divided by the temperature, then the softmax."""
    return filter_logits(logits / temperature, top_k).softmax(dim=-1)


def _probs_inputs(b: int, v: int, temperature: float, top_k: int | None, seed: int) -> Inputs:
    logits = torch.randn(b, v, generator=tensor_rng(seed)) * 2.0
    return {"logits": logits, "temperature": temperature, "top_k": top_k, "sizes": {"B": b, "V": v}}


def probs_mistakes(logits: torch.Tensor, temperature: float, top_k: int | None) -> dict[str, torch.Tensor]:
    """What common wrong temperature / top-k samplers give as next-token probabilities (B, V)."""
    k, tau = top_k, temperature
    mistakes = {
        Mistake("07.temperature_after_softmax", "the temperature is applied after the softmax: divide the logits by "
                                                "it first, softmax(logits / temperature)"):
            filter_logits(logits, k).softmax(-1) / tau,
        Mistake("07.temperature_power_after_softmax", "the probabilities are raised to the power 1 / temperature "
                                                      "after the softmax, and not renormalised, so no row sums to "
                                                      "1: divide the logits by the temperature before the softmax, "
                                                      "softmax(logits / temperature)"):
            filter_logits(logits, k).softmax(-1) ** (1 / tau),
        Mistake("07.no_temperature", "the temperature is not applied: divide the logits by it before the softmax"):
            filter_logits(logits, k).softmax(-1),
        Mistake("07.temperature_multiplied", "the logits are multiplied by the temperature: divide them, so that a "
                                             "temperature below 1 sharpens the distribution"):
            filter_logits(logits * tau, k).softmax(-1),
        Mistake("07.temperature_twice", "the temperature is applied twice (softmax(logits / temperature**2)): "
                                        "divide the logits by it once, before the softmax"):
            filter_logits(logits / tau**2, k).softmax(-1),
        Mistake("07.softmax_over_batch", "the softmax runs over the batch axis: each row (one sequence) is a "
                                         "distribution over the V tokens, softmax(dim=-1)"):
            filter_logits(logits / tau, k).softmax(0),
    }
    if k is not None:
        scaled = logits / tau
        kept = filter_logits(scaled, k).isfinite()
        kth = torch.topk(scaled, min(k, scaled.size(-1)), dim=-1).values[..., -1:]  # (B, 1)
        mistakes |= {
            Mistake("07.top_k_minus_1", "top-k keeps k - 1 tokens: mask only the logits *below* the k-th largest "
                                        "(logits < kth), keep the k-th itself"):
            scaled.masked_fill(scaled <= kth, float("-inf")).softmax(-1),
            Mistake("07.top_k_plus_1", "top-k keeps k + 1 tokens: the k-th largest is torch.topk(logits, "
                                       "k).values[..., -1:], the last of the k"):
            filter_logits(scaled, k + 1).softmax(-1),
            Mistake("07.top_k_fill_zero", "the tokens outside the top k are set to 0, not -inf: exp(0) still gives "
                                          "them probability"):
                scaled.masked_fill(~kept, 0.0).softmax(-1),
            Mistake("07.top_k_zeroed_after_softmax", "the probabilities outside the top k are zeroed after the "
                                                     "softmax without renormalising: set those logits to -inf "
                                                     "before the softmax, so the k left sum to 1"):
            scaled.softmax(-1) * kept,
            Mistake("07.top_k_batch_threshold", "one top-k threshold for the whole batch (the smallest k-th largest "
                                                "of all rows), so some rows keep more than k: take the k-th largest "
                                                "of each row, torch.topk(logits, k).values[..., -1:], shape (B, 1)"):
                scaled.masked_fill(scaled < kth.min(), float("-inf")).softmax(-1),
        }
    return mistakes


def _probs_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_shape(got["probs"], "B V", inputs["sizes"], "the probabilities")
    empty = got["probs"].isnan().all(dim=-1)
    if inputs["top_k"] is not None and bool(empty.any()):
        raise fail(f"the probabilities: row {int(empty.nonzero()[0])} is all NaN, every logit was masked: top-k "
                   "keeps the k largest, so mask only the logits below the k-th largest (logits < kth, not <=)")
    check_close(got["probs"], expected["probs"], "the probabilities", atol=1e-6,
                mistakes=partial(probs_mistakes, inputs["logits"], inputs["temperature"], inputs["top_k"]))


@sized
def _probs_hidden(r: random.Random, seed: int) -> Inputs:
    v = r.randint(20, 60)
    return _probs_inputs(r.randint(2, 5), v, round(r.uniform(0.3, 2.5), 2), r.randint(2, v - 1), seed)


# ---- sample_next_token(model, idx, temperature, top_k, generator) -> (B, 1)


def _sample_next_token(model: Any, idx: torch.Tensor, temperature: float = 1.0, top_k: int | None = None,
                       generator: torch.Generator | None = None) -> torch.Tensor:
    """The reference: the one token gptcourse's generate appends (without the KV cache: the same model calls)."""
    return generate(model, idx, 1, temperature, top_k, use_cache=False, generator=generator)[:, -1:]


def _sample_inputs(config: GPTConfig, b: int, t: int, temperature: float, top_k: int | None, seed: int) -> Inputs:
    return gpt_with_tokens(config, seed, (b, t), "idx", temperature=temperature, top_k=top_k, sample_seed=seed)


def _sample_call(fn: Any, inputs: Inputs) -> Outputs:
    generator = torch.Generator().manual_seed(inputs["sample_seed"])
    seeded = generator.get_state()
    with torch.no_grad():
        out = fn(case_gpt(inputs), inputs["idx"].clone(), temperature=inputs["temperature"], top_k=inputs["top_k"],
                 generator=generator)
    return {"next_id": as_tensor(out, f"sample_next_token(model, idx {fmt_shape(inputs['idx'].shape)}, "
                                      f"temperature={inputs['temperature']}, top_k={inputs['top_k']}, generator)"),
            "generator_used": not torch.equal(generator.get_state(), seeded)}  # a draw from it moves its state


def _first_position(model: Any, idx: torch.Tensor, temperature: float, top_k: int | None,
                    generator: torch.Generator) -> torch.Tensor:
    """A sampler that reads the first position's logits: in a causal model, those of the window's first token."""
    return _sample_next_token(model, idx[:, -model.config.context_length:][:, :1], temperature, top_k, generator)


def _sample_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    next_id, b = got["next_id"], inputs["idx"].size(0)
    if tuple(next_id.shape) != (b, 1):
        raise fail(f"the next tokens have shape {fmt_shape(next_id.shape)}, expected (B, 1) = ({b}, 1), one id per "
                   "sequence, ready for torch.cat([idx, next_id], dim=1): torch.multinomial(probs, 1) and "
                   "argmax(dim=-1, keepdim=True) give that shape")
    check_dtype(next_id, torch.int64, "the next tokens", "token ids are torch.long")
    if inputs["temperature"] == 0 and got["generator_used"]:
        raise fail("at temperature 0 the generator was drawn from: greedy decoding takes the most likely token, "
                   "logits.argmax(dim=-1, keepdim=True), and draws nothing. A tiny temperature is not greedy: it "
                   "draws at random between tied tokens, and each draw moves the generator, so every later draw "
                   "from it changes")
    if inputs["temperature"] > 0 and not got["generator_used"]:
        raise fail("the generator was not used: at temperature > 0 draw with torch.multinomial(probs, 1, "
                   "generator=generator), so that the same seed gives the same tokens (without it the draws come from "
                   "torch's global random state, and a check of them passes or fails by chance)")
    check_close(next_id, expected["next_id"], "the next tokens", atol=0, rtol=0,
                mistakes=partial(_sample_mistakes, inputs))


def _sample_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    """The next tokens the usual mistakes draw ({why: next ids}), for next tokens that are wrong."""
    mistakes = {Mistake("07.first_position", "the logits of the first position were used: the next token follows "
                                             "the *last* position, logits[:, -1]"):
            _sample_call(_first_position, inputs)["next_id"]}
    if inputs["temperature"] > 0:
        mistakes |= {
            Mistake("07.argmax_sampling", "the most likely token was taken (argmax): at temperature > 0, draw from "
                                          "the probabilities with torch.multinomial(probs, 1, generator=generator)"):
                _sample_call(_sample_next_token, inputs | {"temperature": 0.0})["next_id"],
            Mistake("07.sampling_unfiltered", "temperature and top-k were not applied: use next_token_probs(logits, "
                                              "temperature, top_k)"):
                _sample_call(_sample_next_token, inputs | {"temperature": 1.0, "top_k": None})["next_id"],
        }
    return mistakes


SMALL = gpt_config(23, 16, 2, 1, 8)
SAMPLER = gpt_config(40, 16, 2, 1, 8)
PIECES = declare(
    Piece("07", "next_token_loss", _next_token_loss, _loss_call, judge=_loss_judge, forbidden=_LOSS,
          visible=[("visible", "next_token_loss on tokens (B, T + 1) = (3, 7), V=23",
                    lambda seed: gpt_with_tokens(SMALL, seed, (3, 7)))],
          hidden=[("hidden_single", "next_token_loss on one pair of tokens (B=1, T + 1 = 2)",
                   lambda seed: gpt_with_tokens(gpt_config(17, 12, 3, 1, 4), seed, (1, 2))),
                  ("hidden_sizes", "next_token_loss with other sizes", _loss_hidden)]),
    Piece("07", "train_step", _train_step, _step_call, judge=_step_judge, forbidden=_STEP,
          visible=[("visible", "one train_step with SGD(lr=0.5), grad_clip=0.5, tokens (3, 7)",
                    lambda seed: _step_inputs(SMALL, 3, 6, 1, seed)),
                   ("twice", "two train_steps in a row on two batches (gradients must not accumulate)",
                    lambda seed: _step_inputs(SMALL, 3, 6, 2, seed))],
          hidden=[("hidden_momentum", "three train_steps with momentum and weight decay, batch 1",
                   lambda seed: _step_inputs(gpt_config(31, 12, 3, 2, 10), 1, 9, 3, seed, momentum=0.9,
                                             weight_decay=0.01)),
                  ("hidden_tied_rope", "two train_steps of a tied RoPE model with other sizes",
                   lambda seed: _step_inputs(gpt_config(29, 16, 4, 1, 12, position="rope", norm="rmsnorm",
                                                     mlp="swiglu"), 2, sizes_rng(seed).randint(3, 11), 2, seed))]),
    Piece("07", "next_token_probs", _next_token_probs,
          returns("probs", lambda i: f"next_token_probs(logits {fmt_shape(i['logits'].shape)}, temperature="
                                     f"{i['temperature']}, top_k={i['top_k']})",
                  "logits", temperature="temperature", top_k="top_k"),
          judge=_probs_judge, forbidden=_PROBS,
          visible=[("visible", "next_token_probs of logits (3, 12) at temperature 0.7, no top-k",
                    lambda seed: _probs_inputs(3, 12, 0.7, None, seed)),
                   ("top_k", "next_token_probs of logits (3, 12) at temperature 1.5 with top_k=4",
                    lambda seed: _probs_inputs(3, 12, 1.5, 4, seed))],
          hidden=[("hidden_single", "next_token_probs with batch 1 and top_k=1 (greedy by filtering)",
                   lambda seed: _probs_inputs(1, 9, 1.0, 1, seed)),
                  ("hidden_all", "next_token_probs with top_k = V (nothing filtered)",
                   lambda seed: _probs_inputs(2, 7, 0.5, 7, seed)),
                  ("hidden_sizes", "next_token_probs with other sizes, temperatures and k", _probs_hidden)]),
    Piece("07", "sample_next_token", _sample_next_token, _sample_call, judge=_sample_judge, forbidden=_SAMPLE,
          visible=[("greedy", "sample_next_token at temperature 0 (greedy) on idx (5, 11), longer than the context "
                    "of 8 (the model is fed the last 8)", lambda seed: _sample_inputs(SAMPLER, 5, 11, 0.0, None, seed)),
                   ("visible", "sample_next_token at temperature 0.8 with top_k=5 on idx (6, 4)",
                    lambda seed: _sample_inputs(SAMPLER, 6, 4, 0.8, 5, seed))],
          hidden=[("hidden_single", "sample_next_token on a single token (B=1, T=1), temperature 1.3",
                   lambda seed: _sample_inputs(SAMPLER, 1, 1, 1.3, None, seed)),
                  ("hidden_long", "sample_next_token on idx longer than the context (crop to the last context_length "
                                  "tokens)", lambda seed: _sample_inputs(SAMPLER, 4, 11, 1.0, 10, seed)),
                  # One draw per row can agree with the right one by chance, whatever the probabilities: 64 rows
                  # at a high temperature make a wrong temperature show in every student's draws, not only some.
                  ("hidden_many", "sample_next_token on 64 sequences at temperature 1.5",
                   lambda seed: _sample_inputs(SAMPLER, 64, 3, 1.5, None, seed))]),
)
