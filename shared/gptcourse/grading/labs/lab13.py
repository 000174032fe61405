"""Lab 13, preference optimisation: `sequence_logprobs(model, ids, attention_mask, labels)`, `dpo_loss(policy_chosen,
policy_rejected, ref_chosen, ref_rejected, beta)`, `dpo_step(policy, reference, optimizer, batch, beta)` and the
context manager `adapters_disabled(model)`.

`sequence_logprobs` is given a stand-in model that returns fixed logits when it is given the batch's attention mask
(and other logits without it), so its cases are tensors alone; `dpo_step` and `adapters_disabled` run a one-layer
GPT (with gptcourse's LoRA layers for the latter). Padded batches come on the right, on the left and mixed, with
responses of one token; the DPO losses at margins of 1000 and at extreme betas. Each piece's point is measured in
the kernel while the student's code runs: the mask the model was given; whether the rewards carry a graph; how
often the reference ran, whether it built a graph and whether the policy's stale gradients were cleared (the
reference is not the policy, so margins are not 0); each adapter's own state before, inside and after the block.
The references are gptcourse's functions of the same names, which the lab forbids.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch.nn import functional as F

from ...checks import Mistake, check_close, check_shape, fail, fmt_shape
from ...finetuning.dpo import dpo_loss
from ...finetuning.dpo_training import dpo_step
from ...finetuning.log_likelihood import sequence_logprobs
from ...finetuning.lora import LoRALinear, adapters_disabled, add_lora
from ...finetuning.losses import IGNORE_INDEX, response_labels
from ...model.config import GPTConfig
from ...model.gpt import GPT
from ..cases import Inputs, Outputs, sizes_rng, tensor_rng
from ..fixtures import (
    LOG_SOFTMAX_FUNCTIONS,
    STALE_GRADIENTS,
    check_reference_step,
    check_stepped_policy,
    mistaken,
    policy_and_reference,
    reference_step_outputs,
    update_by_hand,
)
from ..piece import Piece, declare
from ..student import as_tensor, as_tensors

# Each piece forbids its own references and those of the pieces it calls (the step calls the student's
# sequence_logprobs and dpo_loss): a student who imports the reference step loses the step alone, one who imports
# dpo_loss loses it and the step. By name in finetuning.dpo and dpo_training: their records (DPOLoss,
# PreferencePair) hold no reference logic, and a learner may build them.
_LOGPS = ("gptcourse.finetuning.log_likelihood", *LOG_SOFTMAX_FUNCTIONS)  # lesson 15's token_logprobs too
_DPO = ("gptcourse.dpo_loss",)
_STEP = ("gptcourse.dpo_step", "gptcourse.train_dpo", *_LOGPS, *_DPO)
_ADAPTERS = ("gptcourse.adapters_disabled", "gptcourse.finetuning.reference")
TINY = GPTConfig(vocab_size=13, context_length=12, d_model=16, n_heads=2, n_layers=1, mlp="relu")


def _padded_batch(lengths: list[int], prompts: list[int], t: int, sides: list[str], vocab: int,
                  seed: int) -> dict[str, torch.Tensor]:
    """ids, attention_mask and response labels (B, T): row b has lengths[b] real tokens, the first prompts[b] of
    them its prompt, padded on sides[b] with the id 0."""
    gen = tensor_rng(seed)
    ids = torch.zeros(len(lengths), t, dtype=torch.long)
    mask = torch.zeros(len(lengths), t, dtype=torch.long)
    for b, (n, side) in enumerate(zip(lengths, sides, strict=True)):
        span = slice(0, n) if side == "right" else slice(t - n, t)
        ids[b, span] = torch.randint(1, vocab, (n,), generator=gen)
        mask[b, span] = 1
    return {"ids": ids, "mask": mask, "labels": response_labels(ids, torch.tensor(prompts), mask)}


def _rows(b: int, t: int, side: str, seed: int, vocab: int = TINY.vocab_size,
          shortest_response: int = 1) -> dict[str, torch.Tensor]:
    """B rows, one of full length T; prompts of 1..3 tokens; "mixed" pads right and left in turn."""
    r = sizes_rng(seed)
    lengths = [t] + [r.randint(shortest_response + 1, t) for _ in range(b - 1)]
    prompts = [r.randint(1, min(3, n - shortest_response)) for n in lengths]
    sides = [side if side != "mixed" else ("right", "left")[i % 2] for i in range(b)]
    return _padded_batch(lengths, prompts, t, sides, vocab, seed)


# ---- sequence_logprobs(model, ids, attention_mask, labels) -> (B,)


class _MaskedLogits:
    """A stand-in model that records the attention mask of each call (`given`): with the batch's mask it returns
    `logits` (B, T, V); without it, or with another one, `unmasked`, whose left-padded rows differ at their real
    positions, as a causal model's do when its real tokens attend to the pads before them."""

    def __init__(self, logits: torch.Tensor, mask: torch.Tensor, unmasked: torch.Tensor) -> None:
        self.logits, self.mask, self.unmasked = logits, mask, unmasked
        self.given: list[str] = []

    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        right = isinstance(attention_mask, torch.Tensor) and attention_mask.shape == self.mask.shape and \
            torch.equal(attention_mask.long(), self.mask)
        self.given.append("none" if attention_mask is None else "right" if right else "other")
        return (self.logits if right else self.unmasked).clone()


def _logps_inputs(b: int, t: int, v: int, side: str, seed: int, one_token: bool = False) -> Inputs:
    batch = _rows(b, t, side, seed, vocab=v)
    if one_token:  # every row's response is its last real token
        real = batch["mask"].sum(-1)
        batch = _padded_batch(real.tolist(), (real - 1).tolist(), t, [side] * b, v, seed)
    gen = tensor_rng(seed + 1)
    logits = torch.randn(b, t, v, generator=gen) * 2
    left = batch["mask"][:, 0] == 0  # (B,): the rows whose pads come first
    unmasked = logits + left[:, None, None] * torch.randn(b, t, v, generator=gen)
    return {**batch, "logits": logits, "unmasked": unmasked, "sizes": {"B": b}}


def _logps_call(fn: Any, inputs: Inputs) -> Outputs:
    ids, mask, labels = (inputs[k].clone() for k in ("ids", "mask", "labels"))
    model = _MaskedLogits(inputs["logits"], inputs["mask"], inputs["unmasked"])
    what = f"sequence_logprobs(model, ids {fmt_shape(ids.shape)}, attention_mask, labels)"
    logps = as_tensor(fn(model, ids, mask, labels), what)
    return {"logps": logps, "mask_given": next((g for g in model.given if g != "right"), "right")}


def _logprobs(logits: torch.Tensor, labels: torch.Tensor, *, shift: int = 1, mean: bool = False,
              probs: bool = False, dim: int = -1, zeroed: bool = True) -> torch.Tensor:
    """The summed log-probabilities (B,) by hand, with a switch per known mistake: label t read from the logits
    at t - shift (1 is right), averaged over the response, probabilities instead of their logs, the softmax over
    another axis, the -100 positions (read as token 0) left in the sum."""
    t = logits.size(1)
    scores, targets = logits[:, :t - shift], labels[:, shift:]  # (B, T - shift, V), (B, T - shift)
    if shift < 0:  # label t read from the logits at t + 1
        scores, targets = logits[:, -shift:], labels[:, :t + shift]
    picked = (F.softmax if probs else F.log_softmax)(scores, dim=dim).gather(-1, targets.clamp(min=0)[..., None])
    picked = picked.squeeze(-1).masked_fill((targets == IGNORE_INDEX) & zeroed, 0.0)  # (B, T - shift)
    return picked.sum(-1) / (targets != IGNORE_INDEX).sum(-1) if mean else picked.sum(-1)


def _logps_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    if got["mask_given"] != "right":
        raise fail("the model was not given the attention mask" + (
            " (it was given another one)" if got["mask_given"] == "other" else "") +
            ": call model(ids, attention_mask=attention_mask). Without it the real tokens attend to the pads: "
            "the logits of a left-padded row change at every real position")
    logits, labels, ids, mask = inputs["logits"], inputs["labels"], inputs["ids"], inputs["mask"]
    check_shape(got["logps"], "B", inputs["sizes"], "the log-probabilities")
    check_close(got["logps"], expected["logps"], "the log-probabilities", atol=1e-4, mistakes={
        Mistake("13.logps_averaged", "the log-probabilities are averaged over the response's tokens: sum them, the "
                                     "log-probability of a sequence is the sum of its tokens'"):
            partial(_logprobs, logits, labels, mean=True),
        Mistake("13.logps_prompt_counted", "the prompt's tokens are counted: only the labelled tokens (labels != "
                                           "-100) belong to the response"):
            lambda: _logprobs(logits, ids.masked_fill(mask == 0, IGNORE_INDEX)),
        Mistake("13.logps_unshifted", "label t is read from the logits at t: the logits at position t - 1 predict "
                                      "the token at t, so compare logits[:, :-1] with labels[:, 1:]"):
            partial(_logprobs, logits, labels, shift=0),
        Mistake("13.logps_shifted_wrong_way", "label t is read from the logits at t + 1 (logits[:, 1:] with "
                                              "labels[:, :-1]): the logits at position t - 1 predict the token at t, "
                                              "so compare logits[:, :-1] with labels[:, 1:]"):
            partial(_logprobs, logits, labels, shift=-1),
        Mistake("13.logps_probabilities_summed", "the probabilities are summed, not their logs: use log_softmax"):
            partial(_logprobs, logits, labels, probs=True),
        Mistake("13.logps_softmax_over_positions", "the softmax runs over the positions (dim=1): each position's "
                                                   "logits are a distribution over the vocabulary, "
                                                   "log_softmax(dim=-1)"): partial(_logprobs, logits, labels, dim=1),
        Mistake("13.logps_ignored_counted", "the -100 positions are counted: the clamped label 0 is gathered there, "
                                            "so every prompt and pad position adds log p(token 0); zero those "
                                            "entries after the gather (where labels == -100)"):
            partial(_logprobs, logits, labels, zeroed=False),
    })


def _logps_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _logps_inputs(r.randint(2, 5), r.randint(5, 10), r.randint(5, 13), "mixed", seed)


# ---- dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta) -> (loss, chosen_rewards,
# rejected_rewards)

LOGP_NAMES = ("policy_chosen", "policy_rejected", "ref_chosen", "ref_rejected")


def _dpo_inputs(b: int, beta: float, scale: float, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    logps = {name: -torch.rand(b, generator=gen) * 30 for name in LOGP_NAMES}
    if scale > 0:  # margins of about +-scale: sigmoid of the worst rounds to 0 in float32
        logps["policy_chosen"][0] -= scale / beta
        if b > 1:
            logps["policy_chosen"][1] += scale / beta
    return {**logps, "beta": beta}


def _dpo_call(fn: Any, inputs: Inputs) -> Outputs:
    args = [inputs[name].clone().requires_grad_(name.startswith("policy")) for name in LOGP_NAMES]
    beta = inputs["beta"]
    what = f"dpo_loss(4 log-probabilities {fmt_shape(args[0].shape)}, beta={beta:g})"
    result = fn(*args, beta)
    loss, chosen, rejected = as_tensors(tuple(result) if isinstance(result, tuple) else result,
                                        ("loss", "chosen_rewards", "rejected_rewards"), what)
    differentiable = isinstance(result[0], torch.Tensor) and result[0].requires_grad
    rewards_graph = any(r.requires_grad for r in result[1:])  # as_tensors checked they are tensors
    return {"loss": loss, "chosen_rewards": chosen, "rejected_rewards": rejected, "differentiable": differentiable,
            "rewards_graph": rewards_graph}


def _dpo_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    loss = got["loss"]
    if loss.dim() != 0:
        raise fail(f"the loss has shape {fmt_shape(loss.shape)}, expected a single number: average over the pairs")
    if not bool(torch.isfinite(loss)):
        raise fail("the loss is inf or NaN: for a margin far below zero sigmoid(margin) rounds to 0 and log(0) is "
                   "-inf. Use F.logsigmoid(margin), which never forms sigmoid(margin)")
    check_close(loss.double(), expected["loss"].double(), "the loss", atol=1e-5,
                mistakes=partial(_dpo_mistakes, inputs))
    if not got["differentiable"]:
        raise fail("the loss does not require grad: return the tensor computed from the policy's log-probabilities, "
                   "not .item() or a detached copy")
    for name in ("chosen_rewards", "rejected_rewards"):
        check_close(got[name].double(), expected[name].double(), f"the {name}", atol=1e-4,
                    mistakes=partial(_reward_mistakes, inputs, name))
    if got["rewards_graph"]:
        raise fail("the rewards require grad: return them detached (beta * log_ratio.detach(), or .detach() on "
                   "the product). They are for reporting; a reward that carries the graph keeps the step's "
                   "activations alive in every log that holds it, and a loss built from it would train on it")


def _log_ratios(inputs: Inputs) -> tuple[torch.Tensor, ...]:
    """(policy chosen, policy rejected, chosen log-ratio, rejected log-ratio), in float64."""
    pc, pr, rc, rr = (inputs[name].double() for name in LOGP_NAMES)
    return pc, pr, pc - rc, pr - rr


def _dpo_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    """The losses the usual mistakes give ({why: loss}), for a loss that is wrong."""
    pc, pr, chosen, rejected = _log_ratios(inputs)
    beta = inputs["beta"]
    margin = beta * (chosen - rejected)
    return {
        Mistake("13.dpo_swapped", "chosen and rejected are swapped: the loss must be small when the chosen "
                                  "answer's log-ratio is the larger, -logsigmoid(beta * (chosen log-ratio - rejected "
                                  "log-ratio))"): -F.logsigmoid(-margin).mean(),
        Mistake("13.dpo_no_reference", "the reference is missing: each log-ratio is log pi(y) - log pi_ref(y), the "
                                       "policy's minus the reference's"): -F.logsigmoid(beta * (pc - pr)).mean(),
        Mistake("13.dpo_beta_on_loss", "beta multiplies the loss, not the margin: -logsigmoid(beta * margin)"):
            -beta * F.logsigmoid(chosen - rejected).mean(),
        Mistake("13.dpo_no_beta", "beta is missing: -logsigmoid(beta * margin)"):
            -F.logsigmoid(chosen - rejected).mean(),
        Mistake("13.dpo_beta_divides", "beta divides the log-ratios: it multiplies them, the implicit reward is beta "
                                       "* (log pi - log pi_ref)"): -F.logsigmoid((chosen - rejected) / beta).mean(),
        Mistake("13.dpo_beta_on_chosen_only", "beta multiplies the chosen log-ratio only: it scales both, "
                                              "-logsigmoid(beta * (chosen log-ratio - rejected log-ratio))"):
            -F.logsigmoid(beta * chosen - rejected).mean(),
        Mistake("13.dpo_beta_on_rejected_only", "beta multiplies the rejected log-ratio only: it scales both, "
                                                "-logsigmoid(beta * (chosen log-ratio - rejected log-ratio))"):
            -F.logsigmoid(chosen - beta * rejected).mean(),
        Mistake("13.dpo_summed", "the loss is summed over the pairs: average it with .mean()"):
            -F.logsigmoid(margin).sum(),
    }


def _reward_mistakes(inputs: Inputs, name: str) -> dict[str, torch.Tensor]:
    """The `name` rewards ("chosen_rewards" or "rejected_rewards") the usual mistakes give, for ones that are wrong."""
    pc, pr, chosen, rejected = _log_ratios(inputs)
    return {
        Mistake("13.reward_no_beta", "the implicit reward is beta times the log-ratio, beta * (log pi - log "
                                     "pi_ref)"): chosen if name == "chosen_rewards" else rejected,
        Mistake("13.reward_no_reference", "the implicit reward is beta times the log-ratio of the policy to the "
                                          "*reference*"): inputs["beta"] * (pc if name == "chosen_rewards" else pr)}


def _dpo_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _dpo_inputs(r.randint(1, 8), r.choice([1e-3, 50.0]), 0.0, seed)


# ---- dpo_step(policy, reference, optimizer, batch, beta): one update, the reference untouched


def _step_inputs(b: int, t: int, side: str, beta: float, seed: int) -> Inputs:
    batch = _rows(2 * b, t, side, seed)
    return {**batch, "beta": beta, "seed": seed}


def _step_models(inputs: Inputs) -> tuple[GPT, GPT]:
    """The policy and its drifted reference (`policy_and_reference`) of a step's case."""
    return policy_and_reference(TINY, inputs["seed"], 0.03)  # margins beta * m of about +-1


def _step_call(fn: Any, inputs: Inputs) -> Outputs:
    policy, reference = _step_models(inputs)
    batch = tuple(inputs[k].clone() for k in ("ids", "mask", "labels"))
    return reference_step_outputs(policy, reference, lambda opt: fn(policy, reference, opt, batch, inputs["beta"]))


def _by_hand_step(policy: GPT, reference: GPT, optimizer: torch.optim.Optimizer,
                  batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor], beta: float, *, zero_grad: bool = True,
                  halves: str = "chunk") -> None:
    """dpo_step by hand, with a switch per known mistake: the stale gradients kept; the rows split into chosen
    and rejected the wrong way ("swapped": the rejected first; "interleaved": even rows and odd rows)."""
    ids, mask, labels = batch
    split = {"chunk": lambda x: x.chunk(2), "swapped": lambda x: x.chunk(2)[::-1],
             "interleaved": lambda x: (x[0::2], x[1::2])}[halves]
    policy_logps = sequence_logprobs(policy, ids, mask, labels)  # (2B,)
    with torch.no_grad():
        ref_logps = sequence_logprobs(reference, ids, mask, labels)  # (2B,)
    loss = dpo_loss(*split(policy_logps), *split(ref_logps), beta).loss
    update_by_hand(optimizer, loss, zero_grad)


STEP_MISTAKES = {
    STALE_GRADIENTS: {"zero_grad": False},
    "chosen and rejected are swapped: the batch holds the B chosen rows first, then the B rejected ones, so "
    "chosen, rejected = logps.chunk(2)": {"halves": "swapped"},
    "the rows are split into even and odd ones: the batch holds the B chosen rows first, then the B rejected "
    "ones, so chosen, rejected = logps.chunk(2)": {"halves": "interleaved"},
}


def _step_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_reference_step(got, _step_models(inputs)[0], never_run=(
        "its log-probabilities come from `reference` (here it differs from the policy). With the policy in its "
        "place every margin is 0 and the loss does not hold the policy near the reference"), unmasked=(
        "run the policy and the reference with model(ids, attention_mask=attention_mask), or the real tokens "
        "attend to the pads"))
    check_stepped_policy(got, expected, lambda: mistaken(_step_call, _by_hand_step, STEP_MISTAKES, inputs, "policy"),
                         "dpo_step calls your sequence_logprobs and dpo_loss")


# ---- adapters_disabled(model): a context manager; inside, every LoRALinear computes its base layer alone


class _Interrupted(Exception):
    pass


LORA_TARGETS = ("qkv", "out", "fc_in")


def _lora_inputs(b: int, t: int, seed: int) -> Inputs:
    return {"ids": torch.randint(0, TINY.vocab_size, (b, t), generator=tensor_rng(seed)), "seed": seed}


def _lora_states(layers: list[LoRALinear]) -> torch.Tensor:
    """(L, 2): each adapter's (enabled, scaling)."""
    return torch.tensor([[float(layer.enabled), float(layer.scaling)] for layer in layers], dtype=torch.float64)


def _lora_call(fn: Any, inputs: Inputs) -> Outputs:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(inputs["seed"])
        model = add_lora(GPT(TINY), rank=2, alpha=4.0, targets=LORA_TARGETS).eval()
        layers = [getattr(m, name) for name in LORA_TARGETS for m in model.modules()
                  if isinstance(getattr(m, name, None), LoRALinear)]  # (qkv, out, fc_in)
        with torch.no_grad():
            for layer in layers:
                layer.B.normal_(0, 0.5)  # as if trained
    layers[1].enabled = False  # switched off before the block: it must be off after it too
    layers[2].scaling = 0.0  # an adapter scaled to nothing before the block: still 0 after it
    ids = inputs["ids"]
    what = "the model inside `with adapters_disabled(model):`"
    with torch.no_grad():
        with fn(model) as yielded:
            inside = as_tensor(model(ids), what)
            inside_states = _lora_states(layers)
        after = as_tensor(model(ids), "the model after the with block")
        after_states = _lora_states(layers)
        try:
            with fn(model):
                raise _Interrupted
        except _Interrupted:
            pass
        after_error = as_tensor(model(ids), "the model after a with block left by an error")
    return {"inside": inside, "after": after, "after_error": after_error, "inside_states": inside_states,
            "after_states": after_states, "error_states": _lora_states(layers),
            "yielded": "model" if yielded is model else "none" if yielded is None else type(yielded).__name__}


def _check_restored(got: torch.Tensor, before: torch.Tensor, when: str, how: str) -> None:
    """Each adapter's (enabled, scaling) after the block is what it was before it; `how` says how to restore."""
    for (enabled, scaling), (was_enabled, was_scaling), target in zip(got.tolist(), before.tolist(), LORA_TARGETS,
                                                                       strict=True):
        if enabled < was_enabled:
            raise fail(f"the adapters stay off {when}: the adapter on {target} is still disabled. {how}")
        if enabled > was_enabled:
            raise fail(f"{when}, the adapter on {target} is on, but it was already off before the block: restore "
                       "each layer's own previous value (states = [layer.enabled for layer in layers], saved before "
                       "switching them off), rather than setting every adapter to True")
        if scaling != was_scaling:
            raise fail(f"{when}, the adapter on {target} has scaling = {scaling:g}, but it was {was_scaling:g} "
                       "before the block: leave .scaling alone (switch .enabled), or give each layer back its own "
                       "value rather than a constant such as alpha / rank")


def _lora_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    adapted, base = expected["after"], expected["inside"]
    if torch.equal(got["inside_states"], expected["after_states"]):  # inside the block, as before it
        if got["yielded"] not in ("model", "none"):
            raise fail(f"inside the block the model's own adapters are still on: the block was given another "
                       f"{got['yielded']} (a copy?). Switch off the adapters of the model itself, in place: a copy "
                       "costs a second model, the very thing the reference-by-disabling avoids")
        raise fail("no adapter was switched off inside the block: find every LoRALinear with model.modules(), "
                   "which is recursive (model.children() sees only the model's direct children, and the adapters "
                   "sit inside its blocks), and set .enabled = False on each")
    check_close(got["inside"], base, "the logits inside the with block", atol=1e-5, mistakes={
        Mistake("13.adapters_still_on", "the adapters are still on inside the block: set every LoRALinear's "
                                        ".enabled to False"): lambda: adapted})
    before = expected["after_states"]
    _check_restored(got["after_states"], before, "after the block",
                    "Set each layer's .enabled back to its own value when the block ends")
    _check_restored(got["error_states"], before, "when the block is left by an error",
                    "Restore them in a finally clause (try: yield ... finally: ...)")
    check_close(got["after"], adapted, "the logits after the with block", atol=1e-5)
    check_close(got["after_error"], adapted, "the logits after a with block left by an error", atol=1e-5)


PIECES = declare(
    Piece("13", "sequence_logprobs", sequence_logprobs, _logps_call, judge=_logps_judge, forbidden=_LOGPS,
          visible=[("visible", "sequence_logprobs of a right-padded batch (B, T, V) = (3, 7, 11)",
                    lambda seed: _logps_inputs(3, 7, 11, "right", seed)),
                   ("left", "sequence_logprobs of a left-padded batch (B, T, V) = (4, 6, 9)",
                    lambda seed: _logps_inputs(4, 6, 9, "left", seed))],
          hidden=[("hidden_one_token", "sequence_logprobs of responses one token long",
                   lambda seed: _logps_inputs(3, 6, 7, "left", seed, one_token=True)),
                  ("hidden_mixed", "sequence_logprobs with other sizes, rows padded on either side", _logps_hidden)]),
    Piece("13", "dpo_loss", dpo_loss, _dpo_call, judge=_dpo_judge, forbidden=_DPO,
          visible=[("visible", "dpo_loss of 6 pairs, beta = 0.1", lambda seed: _dpo_inputs(6, 0.1, 0.0, seed)),
                   ("large", "dpo_loss with margins of about -1000 and +1000 (sigmoid rounds to 0: log-sigmoid "
                    "needed), beta = 0.5", lambda seed: _dpo_inputs(5, 0.5, 1000.0, seed))],
          hidden=[("hidden_large", "dpo_loss with margins of about +-1000, beta = 2",
                   lambda seed: _dpo_inputs(4, 2.0, 1000.0, seed)),
                  ("hidden_beta", "dpo_loss with beta = 0.001 or 50, one pair or several", _dpo_hidden)]),
    Piece("13", "dpo_step", dpo_step, _step_call, judge=_step_judge, forbidden=_STEP,
          visible=[("visible", "dpo_step on 2 pairs (4 rows, padded on the right and on the left in turn), beta = 0.5, "
                               "SGD with lr = 1, a reference that is not the policy, stale gradients in the policy's "
                               ".grad",
                    lambda seed: _step_inputs(2, 8, "mixed", 0.5, seed))],
          hidden=[("hidden_left", "dpo_step on 3 left-padded pairs, beta = 2",
                   lambda seed: _step_inputs(3, 7, "left", 2.0, seed))]),
    Piece("13", "adapters_disabled", adapters_disabled, _lora_call, judge=_lora_judge, forbidden=_ADAPTERS,
          visible=[("visible", "adapters_disabled on a one-layer GPT with LoRA on qkv, out and fc_in (out switched off "
                               "and fc_in's scaling 0 before the block), ids (2, 6)",
                    lambda seed: _lora_inputs(2, 6, seed))],
          hidden=[("hidden_sizes", "adapters_disabled with other ids", lambda seed: _lora_inputs(3, 9, seed))]),
)
