"""Lab 09, the training loop by hand: `cross_entropy(logits, targets)`, `adamw_step(param, grad, exp_avg,
exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)`, `lr_at(step, max_lr, min_lr, warmup_steps, total_steps)`,
`clip_grad_norm(parameters, max_norm)`, `accumulate_gradients(model, tokens, micro_batches)`, and a checkpoint's
two halves, `training_state(model, optimizer, generator, step)` and `restore_training_state(state, model,
optimizer, generator)`.

The references are gptcourse's cross_entropy, AdamW, lr_at, clip_grad_norm and lm_loss (the four last behind a
function with the lab's arguments). gptcourse has no checkpoint of the lab's four entries (gptcourse.train's also
holds its settings and history), so the two halves' references are written here, with torch's state_dict and
get_state. The mistakes each diagnosis names are written out below as what they compute.
"""

from __future__ import annotations

import io
import math
import random
from functools import partial
from typing import Any, Literal

import torch
from torch.nn import functional as F

from ...checks import Mistake, check_close, eps_in_log_mistakes, fail, fmt_shape
from ...model.config import GPTConfig
from ...text.corpus import get_batch
from ...training.clipping import clip_grad_norm
from ...training.loop import TrainConfig, lm_loss, lr_at
from ...training.losses import cross_entropy
from ...training.optim import AdamW
from ..cases import Inputs, Outputs, given, sized, tensor_rng
from ..fixtures import (
    LOG_SOFTMAX_FUNCTIONS,
    case_gpt,
    check_close_lazily,
    check_differentiable,
    check_scalar_loss,
    gpt_inputs,
    mistaken,
)
from ..piece import Piece, declare
from ..student import as_number, as_tensor

# each built-in under every name torch gives it: the function, its torch.special and torch._C twins, the module, and
# the Tensor method (`logits.log_softmax(1)` is torch.Tensor.log_softmax bound, `forbidden.calls_to`)
_CROSS_ENTROPY = ("gptcourse.cross_entropy", "gptcourse.training.losses", "torch.nn.functional.cross_entropy",
                  "torch.nn.CrossEntropyLoss", "torch._C._nn.cross_entropy_loss", "torch.nn.functional.nll_loss",
                  "torch.nn.NLLLoss", "torch._C._nn.nll_loss", "torch._C._nn.nll_loss_nd",
                  "torch.nn.functional.log_softmax", "torch.log_softmax", "torch.special.log_softmax",
                  "torch._log_softmax", "torch.nn.LogSoftmax", "torch.Tensor.log_softmax", "torch.logsumexp",
                  "torch.special.logsumexp", "torch.Tensor.logsumexp", *LOG_SOFTMAX_FUNCTIONS,
                  "gptcourse.router_z_loss")  # lesson 16's: a row's logsumexp, squared
# Each piece forbids what computes its own answer, named one by one (the modules gptcourse.training.loop and
# .checkpoint define the references of several pieces). lm_loss is F.cross_entropy behind a model: a model that
# returns the logits makes it the loss, so it is cross_entropy's, as are the other LOG_SOFTMAX_FUNCTIONS.
# accumulate_gradients calls the student's cross_entropy, but the loss is not its point (k micro-batches, each
# loss / k): it does not forbid cross_entropy's references. make_optimizer builds torch's AdamW, the update
# adamw_step writes. The checkpoint's halves are graded apart (each with the reference's other half): each forbids
# the package's half it is.
_ADAMW = ("gptcourse.AdamW", "gptcourse.training.optim", "torch.optim.AdamW", "torch.optim.Adam",
          "torch.optim._functional", "torch.optim._functional.adam", "torch.optim._functional.adamw",
          "torch._fused_adam_", "torch._fused_adamw_", "gptcourse.training.loop.make_optimizer")
_SCHEDULE = ("gptcourse.lr_at", "torch.optim.lr_scheduler")
_CLIP = ("gptcourse.clip_grad_norm", "gptcourse.training.clipping", "torch.nn.utils.clip_grad_norm_",
         "torch.nn.utils.clip_grad_norm", "torch.nn.utils.clip_grads_with_norm_", "torch.nn.utils.get_total_norm")
_ACCUMULATE = ("gptcourse.training.loop.train_step", "gptcourse.train")
_SAVE = ("gptcourse.training.checkpoint.run_state", "gptcourse.save_checkpoint")
_RESTORE = ("gptcourse.training.checkpoint.resume_run", "gptcourse.load_checkpoint")


# ---- cross_entropy(logits (N, V), targets (N,)) -> the mean negative log-likelihood, a 0-dim tensor


def _ce_inputs(n: int, v: int, scale: float, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    return {"logits": torch.randn(n, v, generator=gen) * scale, "targets": torch.randint(0, v, (n,), generator=gen)}


def _ce_call(fn: Any, inputs: Inputs) -> Outputs:
    logits = inputs["logits"].clone().requires_grad_()
    what = f"cross_entropy(logits {fmt_shape(logits.shape)}, targets {fmt_shape(inputs['targets'].shape)})"
    loss = fn(logits, inputs["targets"].clone())
    out = {"loss": as_tensor(loss, what).detach()}
    with torch.no_grad():  # each row's target its largest logit: finite, unless exp(z) itself overflows
        top = fn(inputs["logits"].clone(), inputs["logits"].argmax(-1))
    out["loss_at_argmax"] = as_tensor(top, what).detach()
    if isinstance(loss, torch.Tensor) and loss.requires_grad and loss.numel() == 1:
        (grad,) = torch.autograd.grad(loss, logits)
        out["grad"] = grad
    return out


def _ce_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    z, t = inputs["logits"], inputs["targets"]
    return {
        Mistake("09.ce_summed",
                "the loss is summed over the N rows: average it (divide by N)"): F.cross_entropy(z, t, reduction="sum"),
        Mistake("09.ce_sign_flipped",
                "the sign is flipped: the loss is -log p(target), a positive number"): -F.cross_entropy(z, t),
        Mistake("09.ce_logsumexp_over_rows",
                "the log-sum-exp runs over the rows (dim 0): each row's V scores are normalised on their own, dim=-1"):
            (torch.logsumexp(z, 0)[t] - z.gather(1, t[:, None]).squeeze(1)).mean(),
        Mistake("09.ce_probability_averaged",
                "the probability was averaged, not its log: the loss is -mean(log p), not -log(mean p) or 1 - p"):
            -(z.softmax(-1).gather(1, t[:, None])).mean(),
        Mistake("09.ce_logsumexp_no_shift_back",
                "log-sum-exp without its shift back: log(sum exp(z - m)) needs + m (the row's max) added back"):
            (torch.logsumexp(z, -1) - z.max(-1).values - z.gather(1, t[:, None]).squeeze(1)).mean(),
    } | eps_in_log_mistakes(z.softmax(-1).gather(1, t[:, None]), "p", "row", "a target far below its row's best logit "
                                                                             "has p = 0 in float32. Compute log p "
                                                                             "without forming p: z[target] - "
                                                                             "log-sum-exp(z)")


def _ce_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    loss = got["loss"]
    check_scalar_loss(loss, "the mean over the N rows")
    top = f"{inputs['logits'].abs().max():.0f}"
    if bool(torch.isposinf(loss)) and not bool(torch.isfinite(got["loss_at_argmax"]).all()):
        raise fail(f"the loss is inf for logits as large as {top}, even when every target is its row's largest "
                   "logit (where p is about 1): exp(z) itself overflows float32 past 88, so log(sum exp(z)) is inf. "
                   "Subtract each row's largest logit m before exp and add it back: log(sum exp(z)) = m + "
                   "log(sum exp(z - m)) (log-sum-exp)", mistake="09.ce_exp_overflow")
    if bool(torch.isposinf(loss)):  # no NaN, so no inf / inf: a probability rounded to 0 and its log is -inf
        raise fail(f"the loss is inf for logits as large as {top}: a target far below its row's best logit has "
                   "probability 0 in float32 (exp(z - m) underflows), and log(0) = -inf, so a stable softmax followed "
                   "by log is not enough. Compute log p without forming p: z[target] - m - log(sum exp(z - m)), m "
                   "the row's largest logit (log-sum-exp)", mistake="09.ce_log_of_softmax")
    if not bool(torch.isfinite(loss)):
        raise fail(f"the loss is {float(loss)} for logits as large as {top}: exp() "
                   "overflows float32 past 88. Subtract each row's largest logit m before exp and add it back: "
                   "log(sum exp(z)) = m + log(sum exp(z - m)) (log-sum-exp)", mistake="09.ce_exp_overflow_nan")
    check_close(loss, expected["loss"], "the loss", atol=1e-4, rtol=1e-5, mistakes=partial(_ce_mistakes, inputs))
    check_differentiable("grad" in got, "compute it from the logits with torch operations (not .item() or a detached "
                                        "copy), so that loss.backward() reaches the model")
    check_close(got["grad"], expected["grad"], "the loss's gradient with respect to the logits", atol=1e-6)


# ---- adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay)
#      -> (param, exp_avg, exp_avg_sq) after step number `step` (1, 2, ...)

_HYPER = ("lr", "beta1", "beta2", "eps", "weight_decay")


def _adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                step: int, lr: float, beta1: float, beta2: float, eps: float,
                weight_decay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference: gptcourse's AdamW stepping one tensor, its moments and step count those given."""
    p = torch.nn.Parameter(param.clone())
    optimizer = AdamW([p], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    optimizer.state[p] = {"step": step - 1, "exp_avg": exp_avg.clone(), "exp_avg_sq": exp_avg_sq.clone()}
    p.grad = grad.clone()
    optimizer.step()
    return p.detach(), optimizer.state[p]["exp_avg"], optimizer.state[p]["exp_avg_sq"]


def _adamw_inputs(n: int, steps: int, seed: int, **hyper: float) -> Inputs:
    gen = tensor_rng(seed)
    scales = torch.logspace(-2, 0, n)  # (n,): coordinates with gradients of different sizes
    scales[0] = 1e-6  # and one near eps's scale, where it matters where eps is added
    return {"param": torch.randn(n, generator=gen),
            "grads": [torch.randn(n, generator=gen) * scales for _ in range(steps)]} | hyper


def _adamw_call(fn: Any, inputs: Inputs) -> Outputs:
    p = inputs["param"].clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    trajectory = []
    for t, g in enumerate(inputs["grads"], start=1):
        what = f"adamw_step(param {fmt_shape(p.shape)}, grad, exp_avg, exp_avg_sq, step={t}, ...)"
        out = fn(p.clone(), g.clone(), m.clone(), v.clone(), t, *(inputs[k] for k in _HYPER))
        if not (isinstance(out, tuple | list) and len(out) == 3):
            raise fail(f"{what} returned {type(out).__name__}, expected a tuple (param, exp_avg, exp_avg_sq)")
        p, m, v = (as_tensor(x, what).detach() for x in out)
        trajectory.append(p)
    return {"params": torch.stack(trajectory), "exp_avg": m, "exp_avg_sq": v}  # params (steps, n)


def _wrong_adamw_step(param: torch.Tensor, grad: torch.Tensor, exp_avg: torch.Tensor, exp_avg_sq: torch.Tensor,
                      step: int, lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, *,
                      decay: Literal["first", "gradient", "after", "in_step"] = "first", correct_m: bool = True,
                      correct_v: bool = True, decay_times_lr: bool = True, eps_inside: bool = False,
                      step_offset: int = 0, power: bool = True, eps_before_correction: bool = False
                      ) -> tuple[torch.Tensor, ...]:
    """An adamw_step with one of the usual mistakes, run through the same call as the student's. `decay`: where
    the weight decay goes, "first" (right: the weight is shrunk before the update)."""
    shrink = 1 - (lr * weight_decay if decay_times_lr else weight_decay)
    if decay == "first":
        param = param * shrink
    elif decay == "gradient":
        grad = grad + weight_decay * param  # L2 regularisation folded into the gradient (Adam, not AdamW)
    m = beta1 * exp_avg + (1 - beta1) * grad
    v = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
    step += step_offset
    b1, b2 = (beta1**step, beta2**step) if power else (beta1, beta2)
    m_hat = m / (1 - b1) if correct_m else m
    v_hat = v / (1 - b2) if correct_v else v
    if decay == "in_step":
        m_hat = m_hat + weight_decay * param  # the decay joins the update, and sqrt(v_hat) + eps divides it
    if eps_before_correction:  # the Adam paper's "efficient" order: the corrections folded into the step size
        param = param - lr * (1 - b2) ** 0.5 / (1 - b1) * m / (v.sqrt() + eps)
    else:
        param = param - lr * m_hat / ((v_hat + eps).sqrt() if eps_inside else v_hat.sqrt() + eps)
    return param * shrink if decay == "after" else param, m, v


def _adamw_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    b1 = inputs["beta1"]
    mistakes = {
        "weight decay applied to the gradient, not decoupled: AdamW shrinks the weight itself, param * (1 - lr "
        "* weight_decay), and m and v see the plain gradient": {"decay": "gradient"},
        "weight decay applied after the update: it shrinks the already-updated weight, (param - lr * update) * (1 - "
        "lr * weight_decay), off by lr**2 * weight_decay * update. Shrink the weight first, param * (1 - lr * "
        "weight_decay), then subtract lr * m_hat / (sqrt(v_hat) + eps), in torch.optim.AdamW's order":
            {"decay": "after"},
        "weight decay divided by sqrt(v_hat) + eps: weight_decay * param joined m_hat, so the adaptive scale "
        "rescales the decay too (most where gradients are small). Decoupled decay stays outside the Adam update: "
        "param * (1 - lr * weight_decay), then param - lr * m_hat / (sqrt(v_hat) + eps)": {"decay": "in_step"},
        f"bias correction missing: step 1 is {1 / (1 - b1):.0f}x too small. Divide m by (1 - beta1**step) and "
        "v by (1 - beta2**step)": {"correct_m": False},
        "bias correction missing on both moments: step 1 comes out about 3x too large. Divide m by "
        "(1 - beta1**step) and v by (1 - beta2**step)": {"correct_m": False, "correct_v": False},
        "the second moment's bias correction is missing: divide v by (1 - beta2**step)": {"correct_v": False},
        "the decay misses the learning rate: param * (1 - lr * weight_decay), not param * (1 - weight_decay)":
            {"decay_times_lr": False},
        "eps is inside the square root: sqrt(v_hat) + eps": {"eps_inside": True},
        "eps is added before the bias correction: lr * sqrt(1 - beta2**step) / (1 - beta1**step) * m / (sqrt(v) + "
        "eps), the Adam paper's folded form, scales eps by 1 / sqrt(1 - beta2**step), which shows where a gradient "
        "is as small as eps. The update here is torch.optim.AdamW's: m_hat / (sqrt(v_hat) + eps), eps added after "
        "both corrections": {"eps_before_correction": True},
        "the bias correction uses step + 1: `step` is already 1 at the first update, so divide m by "
        "(1 - beta1**step) and v by (1 - beta2**step)": {"step_offset": 1},
        "the bias correction divides by (1 - beta1) and (1 - beta2), without the step's power: it is right at step "
        "1 only. Divide m by (1 - beta1**step) and v by (1 - beta2**step), which tend to 1 as the moments fill up":
            {"power": False},
    }
    check_close_lazily(got["params"], expected["params"], "the parameters after each step",
                       lambda: mistaken(_adamw_call, _wrong_adamw_step, mistakes, inputs, "params"), atol=1e-6)
    for name in ("exp_avg", "exp_avg_sq"):
        check_close(got[name], expected[name], f"{name} after the last step (the moments before bias correction)",
                    atol=1e-7, rtol=1e-5)


# ---- lr_at(step, max_lr, min_lr, warmup_steps, total_steps) -> the learning rate at 0-based `step`


def _lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """The reference: gptcourse's lr_at, which reads the schedule from a TrainConfig."""
    return lr_at(step, TrainConfig(steps=total_steps, lr=max_lr, min_lr=min_lr, warmup_steps=warmup_steps))


def _wrong_lr_at(step: int, max_lr: float, min_lr: float, warmup_steps: int, total_steps: int, *,
                 warmup_from_zero: bool = False, floor: bool = True, after_warmup: bool = True,
                 hold: bool = True, span: bool = True, warmup_plus_one: bool = False) -> float:
    """An lr_at with one of the usual mistakes, run through the same call as the student's."""
    lo = min_lr if floor else 0.0
    if step < warmup_steps:
        return max_lr * (step if warmup_from_zero else step + 1) / (warmup_steps + warmup_plus_one)
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps) if after_warmup else step / total_steps
    swing = max_lr - lo if span else max_lr
    return lo + 0.5 * (1 + math.cos(math.pi * (min(1.0, progress) if hold else progress))) * swing


def _schedule_call(fn: Any, inputs: Inputs) -> Outputs:
    """The schedule at every step from 0 to total_steps + 4."""
    values = []
    for s in range(inputs["total_steps"] + 5):
        value = fn(s, inputs["max_lr"], inputs["min_lr"], inputs["warmup_steps"], inputs["total_steps"])
        values.append(float(as_number(value, f"lr_at({s}, ...)", "a number")))
    return {"lrs": torch.tensor(values, dtype=torch.float64)}


def _schedule_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    mistakes = {
        "the warmup starts at 0: the first step (step 0) already trains, at max_lr * 1 / warmup_steps, so use "
        "(step + 1) / warmup_steps": {"warmup_from_zero": True},
        "the cosine decays to 0: it ends at min_lr, min_lr + 0.5 * (1 + cos(pi * progress)) * (max_lr - min_lr)":
            {"floor": False},
        "the cosine starts at step 0: it starts after the warmup, progress = (step - warmup_steps) / "
        "(total_steps - warmup_steps)": {"after_warmup": False},
        "after total_steps the cosine climbs back up: hold min_lr from total_steps on (clamp progress to 1)":
            {"hold": False},
        "the cosine swings over max_lr, not max_lr - min_lr, so it starts at max_lr + min_lr: min_lr + 0.5 * (1 + "
        "cos(pi * progress)) * (max_lr - min_lr)": {"span": False},
        "the warmup divides by warmup_steps + 1, so it never reaches max_lr: the last warmup step (step "
        "warmup_steps - 1) trains at max_lr * warmup_steps / warmup_steps, so use (step + 1) / warmup_steps":
            {"warmup_plus_one": True},
    }
    return mistaken(_schedule_call, _wrong_lr_at, mistakes, inputs, "lrs")


@sized
def _schedule_hidden(r: random.Random, seed: int) -> Inputs:
    total = r.randint(12, 60)
    return {"max_lr": r.choice([1e-3, 6e-4, 3e-3]), "min_lr": r.choice([1e-5, 6e-5, 1e-4]),
            "warmup_steps": r.randint(1, total // 3), "total_steps": total}


# ---- clip_grad_norm(parameters, max_norm) -> the global norm before clipping; scales every .grad in place


def _clip_inputs(shapes: list[tuple[int, ...]], max_norm: float, seed: int, without_grad: int | None = None) -> Inputs:
    gen = tensor_rng(seed)
    grads = [torch.randn(s, generator=gen) for s in shapes]
    return {"grads": grads, "max_norm": max_norm, "without_grad": without_grad}


def _clip_call(fn: Any, inputs: Inputs) -> Outputs:
    params = []
    for i, g in enumerate(inputs["grads"]):
        p = torch.zeros(g.shape, requires_grad=True)
        p.grad = None if i == inputs["without_grad"] else g.clone()
        params.append(p)
    norm = fn(params, inputs["max_norm"])
    what = f"clip_grad_norm({len(params)} parameters, max_norm={inputs['max_norm']})"
    if isinstance(norm, int | float) and not isinstance(norm, bool):
        norm = torch.tensor(float(norm))
    return {"norm": as_tensor(norm, what).detach().reshape(-1)[:1].double(),
            "grads": torch.cat([p.grad.flatten() for p in params if p.grad is not None])}


def _clip_mistakes(inputs: Inputs) -> dict[str, torch.Tensor]:
    grads = [g for i, g in enumerate(inputs["grads"]) if i != inputs["without_grad"]]
    c = inputs["max_norm"]
    total = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads]))
    per_tensor = [g * min(1.0, c / (torch.linalg.vector_norm(g).item() + 1e-6)) for g in grads]
    return {
        Mistake("09.clip_not_in_place",
             "the gradients are unchanged: the scaled gradients were bound to a name (g = g * scale) and never reached "
             ".grad. Scale each p.grad in place, p.grad.mul_(scale), since the optimizer reads .grad"):
            torch.cat([g.flatten() for g in grads]),
        Mistake("09.clip_per_tensor",
                "each tensor was clipped on its own: the norm is one number over all gradients together, sqrt(sum of "
                "every squared entry)"): torch.cat([g.flatten() for g in per_tensor]),
        Mistake("09.clip_scaled_up",
                "gradients below max_norm were scaled up: scale only when the norm exceeds max_norm "
        "(by min(1, max_norm / (norm + 1e-6)))"): torch.cat([g.flatten() * c / (total + 1e-6) for g in grads]),
        Mistake("09.clip_norms_added",
                "the norms of the tensors were added: the global norm is sqrt(sum of squares), not a sum of norms"):
            torch.cat([g.flatten() * min(1.0, c / (sum(torch.linalg.vector_norm(h) for h in grads).item() + 1e-6))
                       for g in grads]),
        Mistake("09.clip_by_value",
                "each entry was clamped to [-max_norm, max_norm] (clipping by value): clipping by norm scales every "
                "gradient by the one factor min(1, max_norm / (norm + 1e-6))"):
            torch.cat([g.flatten().clamp(-c, c) for g in grads]),
    }


def _clip_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_close(got["grads"], expected["grads"], "the gradients after clipping", atol=1e-6, rtol=1e-5,
                mistakes=partial(_clip_mistakes, inputs))
    check_close(got["norm"], expected["norm"], "the returned norm", atol=1e-5, rtol=1e-5, mistakes={
        Mistake("09.clip_norm_after",
                "the norm after clipping was returned: return the norm the gradients had before (it shows how large "
        "the spikes were)"): lambda: torch.linalg.vector_norm(expected["grads"]).double().reshape(1)})


@sized
def _clip_hidden(r: random.Random, seed: int) -> Inputs:
    shapes = [tuple(r.randint(1, 5) for _ in range(r.randint(1, 3))) for _ in range(r.randint(2, 5))]
    return _clip_inputs(shapes, r.choice([0.5, 1.0, 2.0]), seed, without_grad=r.randrange(len(shapes)))


# ---- accumulate_gradients(model, tokens (B, T + 1), micro_batches) -> the mean loss; the whole batch's
#      gradient left in every parameter's .grad


def _accumulate_gradients(model: torch.nn.Module, tokens: torch.Tensor, micro_batches: int) -> float:
    """The reference: one backward of gptcourse's lm_loss over the whole batch, the gradient the micro-batches
    must add up to."""
    model.zero_grad()
    loss = lm_loss(model, tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    return loss.item()


def _wrong_accumulation(model: torch.nn.Module, tokens: torch.Tensor, micro_batches: int, *, divide: bool = True,
                        keep: bool = True, zero_first: bool = True, by_seen: bool = False) -> float:
    """An accumulate_gradients with one of the usual mistakes, run through the same call as the student's."""
    if zero_first:
        model.zero_grad()
    losses = []
    for i, piece in enumerate(tokens.chunk(micro_batches)):  # (B / k, T + 1) each
        if not keep:
            model.zero_grad()
        loss = lm_loss(model, piece[:, :-1], piece[:, 1:])
        (loss / (i + 1 if by_seen else micro_batches) if divide else loss).backward()
        losses.append(loss.item())
    return sum(losses) / micro_batches


def _accumulate_inputs(config: GPTConfig, b: int, t: int, micro_batches: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    return gpt_inputs(config, gen) | {"tokens": torch.randint(0, config.vocab_size, (b, t + 1), generator=gen),
                                      "micro_batches": micro_batches}


def _accumulate_call(fn: Any, inputs: Inputs) -> Outputs:
    model = case_gpt(inputs).train()
    for p in model.parameters():  # what a previous step left behind: the function must start from zero
        p.grad = torch.ones_like(p)
    rows: list[int] = []  # the batch size of each forward: accumulation runs micro-batches, never the whole batch
    model.register_forward_pre_hook(lambda module, args: rows.append(int(args[0].size(0))) if args else None)
    tokens, k = inputs["tokens"], inputs["micro_batches"]
    loss = as_number(fn(model, tokens.clone(), k), f"accumulate_gradients(model, tokens {fmt_shape(tokens.shape)}, "
                     f"micro_batches={k})", "the mean loss as a number")
    grads = [(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in model.parameters()]
    return {"grads": torch.cat(grads), "loss": torch.tensor([float(loss)], dtype=torch.float64),
            "largest_forward": max(rows, default=0)}


def _accumulate_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    k = inputs["micro_batches"]
    mistakes = {
        f"the gradient is {k}x too large: divide each micro-batch's loss by micro_batches={k} before "
        "backward(), so the pieces add up to the mean over the batch": {"divide": False},
        "only the last micro-batch's gradient is left: backward() adds to .grad, so zero the gradients once "
        "before the loop, not inside it": {"keep": False},
        "the gradients left in .grad before the call were added to: call model.zero_grad() first":
            {"zero_first": False},
        "each micro-batch's loss was divided by how many micro-batches had been seen (micro_step + 1): the first "
        f"counts {k}x more than the last. Divide every one by micro_batches={k}": {"by_seen": True},
    }
    check_close_lazily(got["grads"], expected["grads"], "the accumulated gradients",
                       lambda: mistaken(_accumulate_call, _wrong_accumulation, mistakes, inputs, "grads"))
    check_close(got["loss"], expected["loss"], "the returned loss", atol=1e-5, mistakes={
        Mistake("09.accumulate_loss_summed", f"the returned loss is the sum over the {k} micro-batches: return their "
                                             "mean"): lambda: expected["loss"] * k})
    rows = -(-inputs["tokens"].size(0) // k)  # the largest of tokens.chunk(k)
    if got["largest_forward"] > rows:
        raise fail(f"the gradients are right, but the model ran on {got['largest_forward']} rows at once, where each "
                   f"of the micro_batches={k} micro-batches has {rows}: the whole batch went through one forward, "
                   "which is the memory accumulation exists to save. Run the model on tokens.chunk(micro_batches) "
                   "one at a time, each loss divided by micro_batches before its backward()",
                   mistake="09.accumulate_one_forward")


@sized
def _accumulate_hidden(r: random.Random, seed: int) -> Inputs:
    k = r.choice([3, 6])
    return _accumulate_inputs(GPTConfig(vocab_size=r.randint(15, 40), d_model=12, n_heads=3, n_layers=2,
                                        context_length=10), 6, r.randint(2, 9), k, seed)


# ---- training_state(model, optimizer, generator, step) -> dict and restore_training_state(state, model,
#      optimizer, generator) -> step. Tested by training k steps, saving, restoring into fresh objects (through
#      torch.save / torch.load, as a file would) and training k more: the weights must be those of 2k steps.

STATE_KEYS = ("model", "optimizer", "generator", "step")


def _training_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, generator: torch.Generator,
                    step: int) -> dict[str, Any]:
    """The reference half that saves: the lab's four entries."""
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
            "step": step}


def _restore_training_state(state: dict[str, Any], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            generator: torch.Generator, *, restore_optimizer: bool = True,
                            restore_generator: bool = True) -> int:
    """The reference half that restores (the flags leave a part out: the usual mistakes)."""
    model.load_state_dict(state["model"])
    if restore_optimizer:
        optimizer.load_state_dict(state["optimizer"])
    if restore_generator:
        generator.set_state(state["generator"])
    return int(state["step"])


def _resume_inputs(config: GPTConfig, b: int, t: int, steps: int, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    return gpt_inputs(config, gen) | {"ids": torch.randint(0, config.vocab_size, (400,), generator=gen), "b": b,
                                      "t": t, "steps": steps, "lr": 0.05,
                                      "data_seed": int(torch.randint(0, 2**31, (1,), generator=gen))}


class _Run:
    """A model, its AdamW (torch's: gptcourse's is what the lab forbids) and the generator that draws its batches:
    the three things a checkpoint holds."""

    def __init__(self, inputs: Inputs) -> None:
        self.inputs = inputs
        self.model = case_gpt(inputs).train()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=inputs["lr"], weight_decay=0.1, foreach=False)
        self.generator = torch.Generator().manual_seed(inputs["data_seed"])

    def train(self, steps: int) -> None:
        for _ in range(steps):
            x, y = get_batch(self.inputs["ids"], self.inputs["b"], self.inputs["t"], self.generator)  # (B, T)
            self.optimizer.zero_grad()
            F.cross_entropy(self.model(x).flatten(0, 1), y.flatten()).backward()
            self.optimizer.step()

    def parameters(self) -> torch.Tensor:
        return torch.cat([p.detach().flatten() for p in self.model.parameters()])


def _through_a_file(state: Any, what: str) -> Any:
    """The state as it comes back from disk: torch.save, then torch.load with weights_only (no pickled code)."""
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)
    except Exception as err:
        raise fail(f"{what} cannot be saved and loaded back with torch.save / torch.load(weights_only=True) "
                   f"({type(err).__name__}: {err}): keep it to tensors, numbers and dicts of them") from None


def _resume(save: Any, restore: Any, inputs: Inputs) -> Outputs:
    """Train, `save` the state, load it back through a file, `restore` it into fresh objects and train on: the
    student's half is checked as it comes (the reference's other half passes those checks)."""
    first = _Run(inputs)
    first.train(inputs["steps"])
    state = save(first.model, first.optimizer, first.generator, inputs["steps"])
    what = "training_state(model, optimizer, generator, step)"
    if not isinstance(state, dict):
        raise fail(f"{what} returned {type(state).__name__}, expected a dict with the keys {STATE_KEYS}")
    missing = [key for key in STATE_KEYS if key not in state]
    if missing:
        raise fail(f"the state has no {missing} entries: a checkpoint needs {STATE_KEYS} (the model's and the "
                   "optimizer's state_dict(), generator.get_state() and the step)", mistake="09.state_missing_entries")
    saved = state["generator"]
    if not (isinstance(saved, torch.Tensor) and torch.equal(saved, first.generator.get_state())):
        global_state = isinstance(saved, torch.Tensor) and torch.equal(saved, torch.get_rng_state())
        raise fail("state['generator'] is " + ("torch's global random state (torch.get_rng_state())" if global_state
                   else "not the data generator's state") + ": the batches come from `generator`, so save "
                                                            "generator.get_state()", mistake="09.state_wrong_generator")
    state = _through_a_file(state, f"the dict {what} returned")
    second = _Run(inputs)
    step = as_number(restore(state, second.model, second.optimizer, second.generator), "restore_training_state(...)",
                     "the step (an int)", kinds=(int,))
    second.train(inputs["steps"])
    return {"parameters": second.parameters(), "step": step}


def _state_call(fn: Any, inputs: Inputs) -> Outputs:
    """The student's training_state, restored by the reference's restore_training_state."""
    return _resume(fn, _restore_training_state, inputs)


def _restore_call(fn: Any, inputs: Inputs) -> Outputs:
    """The student's restore_training_state, of a state the reference's training_state saved."""
    return _resume(_training_state, fn, inputs)


RESUME_MISTAKES = {
    "the optimizer's state was not restored: AdamW's moments (and step count) start from zero again after "
    "resume, so the first steps after it are too large": {"restore_optimizer": False},
    "the data generator's state was not restored: after resume the batches are not the ones the straight run "
    "draws next (save generator.get_state(), restore with generator.set_state(...))": {"restore_generator": False},
}


def _resume_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_close_lazily(got["parameters"], expected["parameters"],
                       f"the weights after {inputs['steps']} steps, save, restore and {inputs['steps']} more",
                       lambda: mistaken(_restore_call, _restore_training_state, RESUME_MISTAKES, inputs,
                                        "parameters"), atol=1e-6)
    if got["step"] != inputs["steps"]:
        raise fail(f"the step restored is {got['step']}, expected {inputs['steps']}: save the step reached and "
                   "return it from restore_training_state", mistake="09.step_not_restored")


_RESUME_HIDDEN = sized(lambda r, seed: _resume_inputs(
    GPTConfig(vocab_size=r.randint(15, 30), d_model=12, n_heads=2, n_layers=r.randint(1, 2), context_length=8,
              position=r.choice(["learned", "rope"])), r.randint(1, 4), r.randint(2, 8), r.randint(1, 3), seed))
SMALL = GPTConfig(vocab_size=23, d_model=16, n_heads=2, n_layers=1, context_length=8)
PIECES = declare(
    Piece("09", "cross_entropy", cross_entropy, _ce_call, judge=_ce_judge,
          forbidden=_CROSS_ENTROPY,
          visible=[("visible", "cross_entropy on logits (6, 10)", lambda seed: _ce_inputs(6, 10, 2.0, seed)),
                   ("large", "cross_entropy on logits (5, 8) scaled x1000 (log-sum-exp needed)",
                    lambda seed: _ce_inputs(5, 8, 1000.0, seed))],
          hidden=[("hidden_single", "cross_entropy on a single row (N=1, V=3)",
                   lambda seed: _ce_inputs(1, 3, 1.0, seed)),
                  ("hidden_sizes", "cross_entropy with other sizes, logits in the hundreds",
                   sized(lambda r, seed: _ce_inputs(r.randint(2, 40), r.randint(2, 60),
                                                    r.choice([200.0, 500.0, 1000.0]), seed)))]),
    Piece("09", "adamw_step", _adamw_step, _adamw_call, judge=_adamw_judge,
          forbidden=_ADAMW,
          visible=[("visible", "three adamw_steps on 12 numbers, lr=0.01, betas (0.9, 0.999), weight_decay=0.1",
                    lambda seed: _adamw_inputs(12, 3, seed, lr=0.01, beta1=0.9, beta2=0.999, eps=1e-8,
                                               weight_decay=0.1)),
                   ("decay", "three adamw_steps on 12 numbers, lr=0.1, weight_decay=0.5 (a 5% shrink a step: where "
                    "the decay goes shows)", lambda seed: _adamw_inputs(12, 3, seed, lr=0.1, beta1=0.9, beta2=0.999,
                                                                       eps=1e-8, weight_decay=0.5))],
          hidden=[("hidden_sizes", "adamw_steps with other sizes, steps and hyper-parameters",
                   sized(lambda r, seed: _adamw_inputs(
                       r.randint(1, 30), r.randint(3, 8), seed, lr=r.choice([0.02, 0.05]),
                       beta1=r.choice([0.8, 0.9]), beta2=r.choice([0.95, 0.99, 0.999]), eps=1e-8,
                       weight_decay=r.choice([0.3, 0.5, 1.0]))))]),
    Piece("09", "lr_at", _lr_at, _schedule_call, mistakes=_schedule_mistakes,
          label="the learning rates at steps 0 .. total_steps + 4", atol=1e-12, rtol=1e-9,
          forbidden=_SCHEDULE,
          visible=[("visible", "lr_at over 24 steps, warmup 4, max_lr 1e-3, min_lr 1e-4",
                    given(max_lr=1e-3, min_lr=1e-4, warmup_steps=4, total_steps=24))],
          hidden=[("hidden_sizes", "lr_at with other lengths, warmups and rates", _schedule_hidden)]),
    Piece("09", "clip_grad_norm", clip_grad_norm, _clip_call, judge=_clip_judge,
          forbidden=_CLIP,
          visible=[("visible", "clip_grad_norm of three gradients (3, 4), (5,), (2, 2) to max_norm 1.0",
                    lambda seed: _clip_inputs([(3, 4), (5,), (2, 2)], 1.0, seed)),
                   ("below", "clip_grad_norm when the norm is already below max_norm (nothing changes)",
                    lambda seed: _clip_inputs([(3, 4), (5,)], 100.0, seed))],
          hidden=[("hidden_sizes", "clip_grad_norm with other shapes, one parameter without a gradient",
                   _clip_hidden)]),
    Piece("09", "accumulate_gradients", _accumulate_gradients, _accumulate_call, judge=_accumulate_judge,
          forbidden=_ACCUMULATE,
          visible=[("visible", "accumulate_gradients of tokens (4, 7) in 2 micro-batches",
                    lambda seed: _accumulate_inputs(SMALL, 4, 6, 2, seed))],
          hidden=[("hidden_sizes", "accumulate_gradients with 3 or 6 micro-batches of 6 rows", _accumulate_hidden)]),
    Piece("09", "training_state", _training_state, _state_call, judge=_resume_judge, forbidden=_SAVE,
          visible=[("visible", "training_state after 2 AdamW steps, restored and trained 2 more",
                    lambda seed: _resume_inputs(SMALL, 3, 8, 2, seed))],
          hidden=[("hidden_sizes", "training_state with other sizes and step counts", _RESUME_HIDDEN)]),
    Piece("09", "restore_training_state", _restore_training_state, _restore_call, judge=_resume_judge,
          forbidden=_RESTORE,
          visible=[("visible", "restore_training_state into a fresh model, AdamW and generator, then 2 more steps",
                    lambda seed: _resume_inputs(SMALL, 3, 8, 2, seed))],
          hidden=[("hidden_sizes", "restore_training_state with other sizes and step counts", _RESUME_HIDDEN)]),
)
