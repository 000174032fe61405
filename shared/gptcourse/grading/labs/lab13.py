"""Lab 13, preference optimisation: `sequence_logprobs(model, ids, attention_mask, labels)`, `dpo_loss(policy_chosen,
policy_rejected, ref_chosen, ref_rejected, beta)`, `dpo_step(policy, reference, optimizer, batch, beta)` and the
context manager `adapters_disabled(model)`.

`sequence_logprobs` is given a stand-in model that returns fixed logits, so its cases are tensors alone; `dpo_step`
and `adapters_disabled` run a one-layer GPT (with gptcourse's LoRA layers for the latter). Padded batches come on
the right, on the left and (hidden) mixed, with responses of one token; the DPO losses at margins of 1000 and at
extreme betas. The references are gptcourse's functions of the same names, which the lab forbids.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.nn import functional as F

from ...checks import check_close, fail, fmt_shape
from ...finetuning.dpo import dpo_loss
from ...finetuning.dpo_training import dpo_step
from ...finetuning.log_likelihood import sequence_logprobs
from ...finetuning.lora import LoRALinear, adapters_disabled, add_lora
from ...finetuning.losses import IGNORE_INDEX, response_labels
from ...model.config import GPTConfig
from ...model.gpt import GPT
from ..cases import Inputs, Outputs, sizes_rng, tensor_rng
from ..fixtures import flat_parameters
from ..piece import Piece, declare
from ..student import as_tensor, as_tensors

# By name in finetuning.dpo and dpo_training: their records (DPOLoss, PreferencePair) hold no reference logic, and a
# learner may build them.
FORBIDDEN = ("gptcourse.sequence_logprobs", "gptcourse.dpo_loss", "gptcourse.dpo_step", "gptcourse.train_dpo",
             "gptcourse.adapters_disabled", "gptcourse.finetuning.log_likelihood", "gptcourse.finetuning.reference")
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


class _FixedLogits:
    """A stand-in model: whatever it is given, it returns these logits (B, T, V)."""

    def __init__(self, logits: torch.Tensor) -> None:
        self.logits = logits

    def __call__(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        return self.logits.clone()


def _logps_inputs(b: int, t: int, v: int, side: str, seed: int, one_token: bool = False) -> Inputs:
    batch = _rows(b, t, side, seed, vocab=v)
    if one_token:  # every row's response is its last real token
        real = batch["mask"].sum(-1)
        batch = _padded_batch(real.tolist(), (real - 1).tolist(), t, [side] * b, v, seed)
    logits = torch.randn(b, t, v, generator=tensor_rng(seed + 1)) * 2
    return {**batch, "logits": logits, "sizes": {"B": b}}


def _logps_call(fn: Any, inputs: Inputs) -> Outputs:
    ids, mask, labels = (inputs[k].clone() for k in ("ids", "mask", "labels"))
    what = f"sequence_logprobs(model, ids {fmt_shape(ids.shape)}, attention_mask, labels)"
    return {"logps": as_tensor(fn(_FixedLogits(inputs["logits"]), ids, mask, labels), what)}


def _logps_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    model, ids, mask, labels = _FixedLogits(inputs["logits"]), inputs["ids"], inputs["mask"], inputs["labels"]
    summed = sequence_logprobs(model, ids, mask, labels)
    counted = (labels[:, 1:] != IGNORE_INDEX).sum(-1)
    logprobs = F.log_softmax(inputs["logits"], dim=-1)
    unshifted = logprobs.gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    return {
        "the log-probabilities are averaged over the response's tokens: sum them, the log-probability of a "
        "sequence is the sum of its tokens'": summed / counted,
        "the prompt's tokens are counted: only the labelled tokens (labels != -100) belong to the response":
            sequence_logprobs(model, ids, mask, ids.masked_fill(mask == 0, IGNORE_INDEX)),
        "label t is read from the logits at t: the logits at position t - 1 predict the token at t, so compare "
        "logits[:, :-1] with labels[:, 1:]": unshifted.masked_fill(labels == IGNORE_INDEX, 0).sum(-1),
        "the probabilities are summed, not their logs: use log_softmax": F.softmax(inputs["logits"][:, :-1], -1)
        .gather(-1, labels[:, 1:].clamp(min=0)[..., None]).squeeze(-1).masked_fill(labels[:, 1:] == IGNORE_INDEX, 0)
        .sum(-1),
    }


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
    return {"loss": loss, "chosen_rewards": chosen, "rejected_rewards": rejected, "differentiable": differentiable}


def _dpo_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    loss = got["loss"]
    if loss.dim() != 0:
        raise fail(f"the loss has shape {fmt_shape(loss.shape)}, expected a single number: average over the pairs")
    pc, pr, rc, rr = (inputs[name].double() for name in LOGP_NAMES)
    beta = inputs["beta"]
    chosen, rejected = pc - rc, pr - rr
    margin = beta * (chosen - rejected)
    if not bool(torch.isfinite(loss)):
        raise fail("the loss is inf or NaN: for a margin far below zero sigmoid(margin) rounds to 0 and log(0) is "
                   "-inf. Use F.logsigmoid(margin), which never forms sigmoid(margin)")
    mistakes = {
        "chosen and rejected are swapped: the loss must be small when the chosen answer's log-ratio is the larger, "
        "-logsigmoid(beta * (chosen log-ratio - rejected log-ratio))": -F.logsigmoid(-margin).mean(),
        "the reference is missing: each log-ratio is log pi(y) - log pi_ref(y), the policy's minus the "
        "reference's": -F.logsigmoid(beta * (pc - pr)).mean(),
        "beta multiplies the loss, not the margin: -logsigmoid(beta * margin)":
            -beta * F.logsigmoid(chosen - rejected).mean(),
        "beta is missing: -logsigmoid(beta * margin)": -F.logsigmoid(chosen - rejected).mean(),
        "the loss is summed over the pairs: average it with .mean()": -F.logsigmoid(margin).sum(),
    }
    check_close(loss.double(), expected["loss"].double(), "the loss", atol=1e-5, mistakes=mistakes)
    if not got["differentiable"]:
        raise fail("the loss does not require grad: return the tensor computed from the policy's log-probabilities, "
                   "not .item() or a detached copy")
    for name, ratio in (("chosen_rewards", chosen), ("rejected_rewards", rejected)):
        check_close(got[name].double(), expected[name].double(), f"the {name}", atol=1e-4, mistakes={
            "the implicit reward is beta times the log-ratio, beta * (log pi - log pi_ref)": ratio,
            "the implicit reward is beta times the log-ratio of the policy to the *reference*": beta * (
                pc if name == "chosen_rewards" else pr)})


def _dpo_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _dpo_inputs(r.randint(1, 8), r.choice([1e-3, 50.0]), 0.0, seed)


# ---- dpo_step(policy, reference, optimizer, batch, beta): one update, the reference untouched


def _step_inputs(b: int, t: int, side: str, beta: float, seed: int) -> Inputs:
    batch = _rows(2 * b, t, side, seed)
    return {**batch, "beta": beta, "seed": seed}


def _step_call(fn: Any, inputs: Inputs) -> Outputs:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(inputs["seed"])
        policy = GPT(TINY)
    reference = copy.deepcopy(policy)  # trainable on purpose: a step must not give it gradients
    before = flat_parameters(reference)
    optimizer = torch.optim.SGD(policy.parameters(), lr=1.0)
    batch = tuple(inputs[k].clone() for k in ("ids", "mask", "labels"))
    fn(policy, reference, optimizer, batch, inputs["beta"])
    return {"policy": flat_parameters(policy), "reference_changed": not torch.equal(flat_parameters(reference), before),
            "reference_grads": any(p.grad is not None for p in reference.parameters())}


def _step_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    if got["reference_changed"]:
        raise fail("the reference model changed: it must stay what the policy was before training; give the "
                   "optimizer the policy's parameters only, and never step the reference")
    if got["reference_grads"]:
        raise fail("the reference received gradients: compute its log-probabilities under torch.no_grad(), so that "
                   "it is a constant of the loss (and costs no memory for a backward pass)")
    check_close(got["policy"], expected["policy"], "the policy's parameters after the step", atol=1e-5)


# ---- adapters_disabled(model): a context manager; inside, every LoRALinear computes its base layer alone


class _Interrupted(Exception):
    pass


def _lora_inputs(b: int, t: int, seed: int) -> Inputs:
    return {"ids": torch.randint(0, TINY.vocab_size, (b, t), generator=tensor_rng(seed)), "seed": seed}


def _lora_call(fn: Any, inputs: Inputs) -> Outputs:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(inputs["seed"])
        model = add_lora(GPT(TINY), rank=2, alpha=4.0, targets=("qkv", "fc_in")).eval()
        with torch.no_grad():
            for layer in model.modules():
                if isinstance(layer, LoRALinear):
                    layer.B.normal_(0, 0.5)  # as if trained
    ids = inputs["ids"]
    what = "the model inside `with adapters_disabled(model):`"
    with torch.no_grad():
        with fn(model):
            inside = as_tensor(model(ids), what)
        after = as_tensor(model(ids), "the model after the with block")
        try:
            with fn(model):
                raise _Interrupted
        except _Interrupted:
            pass
        after_error = as_tensor(model(ids), "the model after a with block left by an error")
    return {"inside": inside, "after": after, "after_error": after_error}


def _lora_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    adapted, base = expected["after"], expected["inside"]
    check_close(got["inside"], base, "the logits inside the with block", atol=1e-5, mistakes={
        "the adapters are still on inside the block: set every LoRALinear's .enabled to False": adapted})
    check_close(got["after"], adapted, "the logits after the with block", atol=1e-5, mistakes={
        "the adapters stay off after the block: set each layer's .enabled back when the block ends": base})
    check_close(got["after_error"], adapted, "the logits after a with block left by an error", atol=1e-5, mistakes={
        "the adapters stay off when the block is left by an error: restore them in a finally clause "
        "(try: yield ... finally: ...)": base})


PIECES = declare(
    Piece("13", "sequence_logprobs", sequence_logprobs, _logps_call, mistakes=_logps_mistakes,
          label="the log-probabilities", shape="B", atol=1e-4, forbidden=FORBIDDEN,
          visible=[("visible", "sequence_logprobs of a right-padded batch (B, T, V) = (3, 7, 11)",
                    lambda seed: _logps_inputs(3, 7, 11, "right", seed)),
                   ("left", "sequence_logprobs of a left-padded batch (B, T, V) = (4, 6, 9)",
                    lambda seed: _logps_inputs(4, 6, 9, "left", seed))],
          hidden=[("hidden_one_token", "sequence_logprobs of responses one token long",
                   lambda seed: _logps_inputs(3, 6, 7, "left", seed, one_token=True)),
                  ("hidden_mixed", "sequence_logprobs with other sizes, rows padded on either side", _logps_hidden)]),
    Piece("13", "dpo_loss", dpo_loss, _dpo_call, judge=_dpo_judge, forbidden=FORBIDDEN,
          visible=[("visible", "dpo_loss of 6 pairs, beta = 0.1", lambda seed: _dpo_inputs(6, 0.1, 0.0, seed)),
                   ("large", "dpo_loss with margins of about -1000 and +1000 (sigmoid rounds to 0: log-sigmoid "
                    "needed), beta = 0.5", lambda seed: _dpo_inputs(5, 0.5, 1000.0, seed))],
          hidden=[("hidden_large", "dpo_loss with margins of about +-1000, beta = 2",
                   lambda seed: _dpo_inputs(4, 2.0, 1000.0, seed)),
                  ("hidden_beta", "dpo_loss with beta = 0.001 or 50, one pair or several", _dpo_hidden)]),
    Piece("13", "dpo_step", dpo_step, _step_call, judge=_step_judge, forbidden=FORBIDDEN,
          visible=[("visible", "dpo_step on 2 pairs (4 rows, right-padded), beta = 0.5, SGD with lr = 1",
                    lambda seed: _step_inputs(2, 8, "right", 0.5, seed))],
          hidden=[("hidden_left", "dpo_step on 3 left-padded pairs, beta = 2",
                   lambda seed: _step_inputs(3, 7, "left", 2.0, seed))]),
    Piece("13", "adapters_disabled", adapters_disabled, _lora_call, judge=_lora_judge, forbidden=FORBIDDEN,
          visible=[("visible", "adapters_disabled on a one-layer GPT with LoRA on qkv and fc_in, ids (2, 6)",
                    lambda seed: _lora_inputs(2, 6, seed))],
          hidden=[("hidden_sizes", "adapters_disabled with other ids", lambda seed: _lora_inputs(3, 9, seed))]),
)
