"""Lab 15, reinforcement learning with verifiable rewards (GRPO): `group_advantages(rewards, group_size)`,
`kl_k3(logprobs, ref_logprobs)`, `grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta)`
and `grpo_step(policy, reference, optimizer, batch, clip_eps, beta)`.

The advantages' groups are laid out one after another and include groups whose rewards are all equal (their
advantages are 0, never NaN) and groups of one. The loss's cases put the importance ratio past both ends of the
clip range with advantages of both signs, give the padding positions values that would swamp any sum they entered,
use a reference far from the policy, and pass old log-probabilities that carry a graph back to the policy's (as
`old = logprobs` would), so that only a loss that detaches them has the right gradient. `grpo_step` runs a
one-layer GPT whose reference and old log-probabilities differ from the policy's, with stale gradients in .grad.
The references are gptcourse's functions of the same names (the loss's with loss_type="grpo", its stats dropped),
which the lab forbids.
"""

from __future__ import annotations

from functools import cache, partial
from typing import Any

import torch
from torch.nn import functional as F

from ...checks import Mistake, check_close, check_shape, fail, fmt_shape
from ...finetuning.group_baseline import group_advantages
from ...finetuning.grpo_objective import grpo_loss
from ...finetuning.grpo_training import grpo_step, token_logprobs
from ...finetuning.kl_estimators import kl_k3
from ...model.config import GPTConfig
from ...model.gpt import GPT
from ..cases import Inputs, Outputs, sizes_rng, tensor_rng
from ..fixtures import (
    STALE_GRADIENTS,
    check_differentiable,
    check_reference_step,
    check_scalar_loss,
    check_stepped_policy,
    mistaken,
    part_of,
    policy_and_reference,
    reference_step_outputs,
    update_by_hand,
)
from ..piece import Piece, declare
from ..student import as_tensor

# Each piece forbids its own references and those of the pieces it calls (the step calls the student's grpo_loss, which
# calls their kl_k3): a student who imports the reference step loses the step alone, one who imports kl_k3 loses it
# and the two pieces built on it.
_ADVANTAGES = ("gptcourse.group_advantages", "gptcourse.finetuning.group_baseline")
_KL = ("gptcourse.kl_k3", "gptcourse.finetuning.kl_estimators")
_LOSS = ("gptcourse.grpo_loss", "gptcourse.finetuning.grpo_objective", *_KL)
_STEP = ("gptcourse.grpo_step", "gptcourse.train_grpo", "gptcourse.token_logprobs",
         "gptcourse.finetuning.grpo_training", *_LOSS)
EPS = 1e-4  # the advantages' epsilon, TRL's
HUGE_LOSS = 1e6  # no loss of the cases' real tokens comes near it; the pads' e^30 ratios and KL terms pass it
TINY = GPTConfig(vocab_size=11, context_length=12, d_model=16, n_heads=2, n_layers=1, mlp="relu")


# ---- group_advantages(rewards (N,), group_size) -> advantages (N,)


def _adv_inputs(rewards: list[float], group_size: int) -> Inputs:
    return {"rewards": torch.tensor(rewards), "group_size": group_size, "sizes": {"N": len(rewards)}}


def _adv_call(fn: Any, inputs: Inputs) -> Outputs:
    rewards, g = inputs["rewards"].clone(), inputs["group_size"]
    what = f"group_advantages(rewards {fmt_shape(rewards.shape)}, group_size={g})"
    return {"advantages": as_tensor(fn(rewards, g), what)}


def _advantages(rewards: torch.Tensor, g: int, *, eps: float = EPS, unbiased: bool = True, scale: bool = True,
                over: str = "group", batch_std: bool = False, sign: int = 1,
                nan_to_zero: bool = False) -> torch.Tensor:
    """The advantages by hand, with a switch per known mistake: the population std (`unbiased`), no division by
    the std, the mean and std over the whole batch, over rewards.view(G, -1)'s rows or its columns (the groups
    taken as interleaved) (`over`), each group's mean but the whole batch's std (`batch_std`), the sign flipped,
    the NaN of all-equal groups set to 0 (`nan_to_zero`, with eps 0: nan_to_num in place of eps)."""
    n = rewards.numel()
    groups = {"group": rewards.view(-1, g), "batch": rewards.view(1, n), "transposed": rewards.view(g, -1),
              "interleaved": rewards.view(g, -1).t()}[over]  # (P, G): one row per group (or what the mistake takes)
    centred = groups - groups.mean(dim=1, keepdim=True)
    if scale and groups.size(1) > 1:
        spread = rewards.std(unbiased=unbiased) if batch_std else groups.std(dim=1, keepdim=True, unbiased=unbiased)
        centred = centred / (spread + eps)
    if nan_to_zero:
        centred = torch.nan_to_num(centred, nan=0.0)
    return (sign * (centred.t() if over == "interleaved" else centred)).reshape(-1)


ADV_MISTAKES = {
    Mistake("15.adv_sign_flipped",
            "the sign is flipped: an answer better than its group's mean gets a positive advantage, reward - mean"):
        {"sign": -1},
    Mistake("15.adv_not_scaled",
            "the advantages are not divided by the group's standard deviation (plus eps = 1e-4)"):
        {"scale": False},
    Mistake("15.adv_population_std",
            "the standard deviation is the population one (unbiased=False, divides by G): use torch's default "
            ".std(), Bessel-corrected (divides by G - 1), as TRL and the DeepSeekMath paper do"):
        {"unbiased": False},
    Mistake("15.adv_over_batch",
            "the mean and the std are over the whole batch, not over each group: each prompt's answers are compared "
            "with each other, rewards.view(-1, group_size) then the mean and std over dim=1"):
        {"over": "batch"},
    Mistake("15.adv_groups_transposed",
            "the groups were read as rewards.view(group_size, -1), group_size rows of N / group_size rewards: each "
            "group is a row of rewards.view(-1, group_size), its group_size answers one after another"):
        {"over": "transposed"},
    Mistake("15.adv_groups_interleaved",
            "the groups were taken as interleaved, answer j of every prompt together (the columns of "
            "rewards.view(group_size, -1)): each group is group_size answers one after another, a row of "
            "rewards.view(-1, group_size), the mean and std over dim=1"):
        {"over": "interleaved"},
    Mistake("15.adv_batch_std",
            "the mean is each group's but the std is the whole batch's: divide each group by its own std, "
            "groups.std(dim=1, keepdim=True) + 1e-4 with groups = rewards.view(-1, group_size)"):
        {"batch_std": True},
    Mistake("15.adv_no_eps_nan_to_zero",
            "eps is missing from the denominator: the NaN of the groups whose rewards are all equal was set to 0 (as "
            "nan_to_num does), but every other group is divided by its bare std too; divide every group by (std + "
            "1e-4), which also gives the all-equal groups their 0"):
        {"eps": 0.0, "nan_to_zero": True},
}


def _adv_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    advantages, rewards, g = got["advantages"], inputs["rewards"], inputs["group_size"]
    check_shape(advantages, "N", inputs["sizes"], "the advantages")
    if not bool(torch.isfinite(advantages).all()):
        groups = rewards.view(-1, g)
        if g == 1:
            raise fail("the advantages hold NaN for groups of one: the std of a single reward is NaN (0 / 0 with "
                       "Bessel's G - 1). A group of one has nothing to compare with: its advantage is 0 (reward - "
                       "mean only, no division, when group_size == 1)")
        uniform = [p for p, row in enumerate(groups) if bool((row == row[0]).all())]
        raise fail(f"the advantages hold NaN or inf: group(s) {uniform} have all rewards equal, so their std is 0; "
                   "divide by (std + 1e-4), and such a group's advantages are exactly 0 (it teaches nothing)")
    mistakes = {why: cache(partial(_advantages, rewards, g, **flags)) for why, flags in ADV_MISTAKES.items()}
    check_close(advantages, expected["advantages"], "the advantages", atol=1e-4, mistakes=mistakes)
    # An all-equal group's float32 mean is off by up to ~1e-8, which / 1e-4 is up to ~1e-4: hence atol=1e-4 above.
    # Elsewhere eps missing moves each advantage by eps / std >= 1.4e-4 of itself (std <= 0.71 for rewards in
    # [0, 1]): the groups whose rewards differ are compared again, tighter than that.
    differ = ~(rewards.view(-1, g) == rewards.view(-1, g)[:, :1]).all(dim=1).repeat_interleave(g)  # (N,)
    check_close(advantages[differ], expected["advantages"][differ], "the advantages of the groups whose rewards "
                "differ", atol=1e-6, rtol=1e-5, mistakes={why: partial(part_of, wrong, differ)
                                                          for why, wrong in mistakes.items()})


def _adv_drawn(p: int, g: int, seed: int, uniform: tuple[int, ...] = ()) -> Inputs:
    """P groups of G rewards each 0, 0.1 (the format alone) or 1 (solved), the groups `uniform` all one value."""
    gen = tensor_rng(seed)
    rewards = torch.tensor([0.0, 0.1, 1.0])[torch.randint(0, 3, (p, g), generator=gen)]  # (P, G)
    for group in uniform:
        rewards[group] = rewards[group, 0]
    if g > 1:  # every other group with two different rewards at least
        for group in set(range(p)) - set(uniform):
            rewards[group, :2] = torch.tensor([0.0, 1.0])[torch.randperm(2, generator=gen)]
    return _adv_inputs(rewards.flatten().tolist(), g)


def _adv_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    p, g = r.randint(2, 5), r.randint(2, 9)
    return _adv_drawn(p, g, seed, uniform=(r.randrange(p),))


# ---- kl_k3(logprobs, ref_logprobs) -> per-token KL estimates, the shape of the inputs


def _kl_inputs(shape: tuple[int, ...], spread: float, seed: int) -> Inputs:
    gen = tensor_rng(seed)
    logprobs = -torch.rand(shape, generator=gen) * 4  # (B, T): log-probabilities of sampled tokens
    ref = logprobs + (torch.rand(shape, generator=gen) * 2 - 1) * spread  # both above and below the policy's
    return {"logprobs": logprobs, "ref_logprobs": ref, "sizes": dict(zip("BT", shape, strict=False))}


def _kl_call(fn: Any, inputs: Inputs) -> Outputs:
    logprobs = inputs["logprobs"].clone().requires_grad_()
    what = f"kl_k3(logprobs {fmt_shape(logprobs.shape)}, ref_logprobs)"
    kl = fn(logprobs, inputs["ref_logprobs"].clone())
    if not isinstance(kl, torch.Tensor):
        raise fail(f"{what} returned {type(kl).__name__}, expected a torch.Tensor")
    grad = torch.autograd.grad(kl.sum(), logprobs, allow_unused=True)[0] if kl.requires_grad else None
    return {"kl": as_tensor(kl, what), "grad": torch.zeros_like(logprobs) if grad is None else grad,
            "differentiable": kl.requires_grad}


def _k3(logprobs: torch.Tensor, ref: torch.Tensor, *, estimator: str = "k3", direction: int = 1) -> torch.Tensor:
    """Per-token KL estimates by hand: k3 (right), k1, k2 or |k1| (`estimator`), log r taken the wrong way round
    (`direction` -1: log policy - log reference)."""
    r = direction * (ref - logprobs)  # log(ref / policy) at the policy's samples
    return {"k3": torch.exp(r) - r - 1, "k1": -r, "k2": r**2 / 2, "abs": r.abs(), "no -1": torch.exp(r) - r}[estimator]


KL_MISTAKES = {
    Mistake("15.kl_ratio_reversed",
            "the log-ratio is the wrong way round: r = ref_logprobs - logprobs (log reference / policy at the "
            "policy's samples), then exp(r) - r - 1; with r = logprobs - ref_logprobs the estimate is not of "
            "KL(policy || reference)"):
        {"direction": -1},
    Mistake("15.kl_k1",
            "this is k1, logprobs - ref_logprobs: unbiased too, but negative for about half the tokens; k3 is exp(r) "
            "- r - 1 with r = ref_logprobs - logprobs, never negative"):
        {"estimator": "k1"},
    Mistake("15.kl_k2",
            "this is k2, r^2 / 2: always positive but biased; k3 is exp(r) - r - 1"):
        {"estimator": "k2"},
    Mistake("15.kl_abs_k1",
            "this is |k1|, the absolute log-ratio: biased; k3 is exp(r) - r - 1"):
        {"estimator": "abs"},
    Mistake("15.kl_no_minus_one",
            "the - 1 is missing: k3 is exp(r) - r - 1 (0 where the policy and the reference agree)"):
        {"estimator": "no -1"},
}


def _kl_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    logprobs, ref = inputs["logprobs"], inputs["ref_logprobs"]
    if got["kl"].shape != expected["kl"].shape:
        raise fail(f"the KL estimates have shape {fmt_shape(got['kl'].shape)}, expected "
                   f"{fmt_shape(expected['kl'].shape)}: one per token, elementwise, nothing averaged")
    mistakes = {why: partial(_k3, logprobs, ref, **flags) for why, flags in KL_MISTAKES.items()}  # if it is wrong
    check_close(got["kl"], expected["kl"], "the per-token KL estimates", atol=1e-5, mistakes=mistakes)
    if not got["differentiable"]:
        raise fail("the KL estimates do not require grad: compute them from `logprobs` with torch operations (no "
                   ".item(), .detach() or numpy), so that the penalty's gradient reaches the policy")
    check_close(got["grad"], expected["grad"], "the gradient of the KL estimates with respect to logprobs", atol=1e-5)


def _kl_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    return _kl_inputs((r.randint(1, 6), r.randint(1, 40)), r.choice([0.5, 3.0, 12.0]), seed)


# ---- grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta) -> the loss (a scalar)

LOSS_ARGS = ("logprobs", "old_logprobs", "ref_logprobs", "advantages", "mask")


def _loss_inputs(lengths: list[int], t: int, clip_eps: float, beta: float, seed: int, far: float = 0.5) -> Inputs:
    """Rows of `lengths` real tokens padded to T (the pads hold values of +-30, which swamp any sum they enter);
    old log-probabilities up to `far` nats from the policy's, so the ratio passes 1 +- eps on both sides; a
    reference up to 1 nat away; advantages of both signs."""
    gen = tensor_rng(seed)
    b = len(lengths)
    mask = (torch.arange(t)[None, :] < torch.tensor(lengths)[:, None]).float()  # (B, T)
    logprobs = -torch.rand(b, t, generator=gen) * 3
    old = logprobs + (torch.rand(b, t, generator=gen) * 2 - 1) * far
    # the first answer (advantage > 0) has a ratio e^0.4 and the last (advantage < 0) e^-0.5: each past 1 +- eps
    old[0, 0], old[-1, 0] = logprobs[0, 0] - 0.4, logprobs[-1, 0] + 0.5
    ref = logprobs + (torch.rand(b, t, generator=gen) * 2 - 1)
    pads = mask == 0
    logprobs = logprobs.masked_fill(pads, 0.0)
    old = old.masked_fill(pads, -30.0)  # a ratio of e^30 on the pads
    ref = ref.masked_fill(pads, 30.0)
    advantages = torch.randn(b, generator=gen)
    advantages[0], advantages[-1] = abs(advantages[0]) + 0.5, -abs(advantages[-1]) - 0.5
    return {"logprobs": logprobs, "old_logprobs": old, "ref_logprobs": ref, "advantages": advantages, "mask": mask,
            "clip_eps": clip_eps, "beta": beta, "sizes": {"B": b, "T": t}}


def _loss_call(fn: Any, inputs: Inputs) -> Outputs:
    """The old log-probabilities arrive as `logprobs + (old - logprobs)`: numbers as given, with a graph back to
    `logprobs`, as `old_logprobs = logprobs` on the batch's first update would have. Only a loss that detaches them
    gets the right gradient. The loss is called a second time with old log-probabilities that carry no graph
    (`grad_plain`): a wrong gradient there is not the old log-probabilities' doing."""
    what = f"grpo_loss(logprobs {fmt_shape(inputs['logprobs'].shape)}, ..., clip_eps={inputs['clip_eps']}, " \
           f"beta={inputs['beta']})"

    def run(graph: bool) -> tuple[torch.Tensor, torch.Tensor, bool]:
        logprobs = inputs["logprobs"].clone().requires_grad_()
        old = logprobs + (inputs["old_logprobs"] - inputs["logprobs"]) if graph else inputs["old_logprobs"].clone()
        loss = fn(logprobs, old, *(inputs[k].clone() for k in LOSS_ARGS[2:]), inputs["clip_eps"], inputs["beta"])
        if not isinstance(loss, torch.Tensor):
            raise fail(f"{what} returned {type(loss).__name__}, expected the loss, a torch.Tensor")
        grad = torch.autograd.grad(loss.sum(), logprobs, allow_unused=True)[0] if loss.requires_grad else None
        return as_tensor(loss, what), torch.zeros_like(logprobs) if grad is None else grad, loss.requires_grad

    loss, grad, differentiable = run(graph=True)
    grad_plain = run(graph=False)[1]
    return {"loss": loss, "grad": grad, "grad_plain": grad_plain, "differentiable": differentiable}


def _reference_loss(*args: Any) -> torch.Tensor:
    """gptcourse's grpo_loss returns (loss, stats); the lab's returns the loss alone."""
    return grpo_loss(*args, loss_type="grpo")[0]


def _loss_by_hand(logprobs: torch.Tensor, old: torch.Tensor, ref: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor,
                  clip_eps: float, beta: float, *, detach_old: bool = True, detach_ratio: bool = False,
                  clip: str = "ratio", bound: str = "min",
                  ratio: str = "exp", kl: str = "k3", kl_sign: int = 1, reduce: str = "sequence",
                  kl_to: str = "ref", kl_weight: float = 1.0) -> torch.Tensor:
    """The loss by hand, with a switch per known mistake: the old log-probabilities not detached, or the whole
    ratio detached (`detach_ratio`); the clip on the
    wrong term, on one side, or missing (`clip`); max for min (`bound`); the ratio as a log-ratio or inverted; the
    KL the wrong way round, missing, subtracted (`kl_weight` -1), or to the old policy; the tokens averaged another
    way (`reduce`). `bound` "outside" takes the advantage out of the min, A min(ratio, clipped ratio), which is
    the min only where A > 0."""
    old = old.detach() if detach_old else old
    adv = adv[:, None]  # (B, 1)
    r = {"exp": torch.exp(logprobs - old), "log": logprobs - old, "inverted": torch.exp(old - logprobs)}[ratio]
    r = r.detach() if detach_ratio else r
    unclipped = r * adv
    clipped = {"ratio": torch.clamp(r, 1 - clip_eps, 1 + clip_eps) * adv,
               "product": torch.clamp(r * adv, 1 - clip_eps, 1 + clip_eps),
               "advantage": r * torch.clamp(adv, 1 - clip_eps, 1 + clip_eps),
               "upper": torch.clamp(r, max=1 + clip_eps) * adv, "none": unclipped}[clip]
    if bound == "outside":
        per_token = -adv * torch.min(r, torch.clamp(r, 1 - clip_eps, 1 + clip_eps))  # (B, T)
    else:
        per_token = -(torch.min if bound == "min" else torch.max)(unclipped, clipped)  # (B, T)
    target = {"ref": ref, "old": old.detach()}[kl_to]
    estimate = _k3(logprobs, target.detach(), estimator=kl, direction=1 if kl_sign == 1 else -1) \
        if kl_sign != 0 else torch.zeros_like(logprobs)
    per_token = per_token + kl_weight * beta * estimate
    if reduce == "sequence":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).mean()
    if reduce == "tokens":
        return (per_token * mask).sum() / mask.sum()
    if reduce == "padded":  # every position, pads too
        return per_token.mean(-1).mean()
    if reduce == "length T":
        return ((per_token * mask).sum(-1) / mask.size(1)).mean()
    if reduce == "answers summed":
        return ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1)).sum()
    return (per_token * mask).sum(-1).mean()  # "sum": the sequence's sum


LOSS_MISTAKES = {
    Mistake("15.loss_old_not_detached",
            "the old log-probabilities were not detached: they are the sampling policy's, a constant of the loss. "
            "With a graph back to logprobs (old_logprobs = logprobs on a batch's first update) the ratio's gradient "
            "cancels; use old_logprobs.detach()"):
        {"detach_old": False},
    Mistake("15.loss_ratio_detached",
            "the whole ratio was detached (exp(logprobs - old_logprobs).detach()): the surrogate has no gradient and "
            "only the KL penalty trains the policy; detach old_logprobs alone, exp(logprobs - old_logprobs.detach())"):
        {"detach_ratio": True},
    Mistake("15.loss_clip_product",
            "the clip is applied to ratio * advantage, not to the ratio: clamp(ratio, 1 - eps, 1 + eps) * advantage"):
        {"clip": "product"},
    Mistake("15.loss_clip_upper_only",
            "only the upper side is clipped: clamp(ratio, 1 - eps, 1 + eps) bounds it below too (it matters when the "
            "advantage is negative)"):
        {"clip": "upper"},
    Mistake("15.loss_no_clip",
            "the ratio is not clipped: -min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A)"):
        {"clip": "none"},
    Mistake("15.loss_clip_advantage",
            "the advantage was clipped, not the ratio: ratio * clamp(A, 1 - eps, 1 + eps); the clip bounds the "
            "ratio, clamp(ratio, 1 - eps, 1 + eps) * A"):
        {"clip": "advantage"},
    Mistake("15.loss_advantage_outside_min",
            "the advantage was taken out of the min, A * min(ratio, clipped ratio): right where A > 0, but a "
            "negative A turns the min into a max, so negative advantages were clipped on the wrong side (below 1 - "
            "eps instead of above 1 + eps); keep A inside, min(ratio * A, clamp(ratio, 1 - eps, 1 + eps) * A)"):
        {"bound": "outside"},
    Mistake("15.loss_max_for_min",
            "max where PPO takes min: the surrogate is min(ratio * A, clipped ratio * A), the pessimistic bound, and "
            "the loss its negative"):
        {"bound": "max"},
    Mistake("15.loss_log_ratio",
            "the ratio is the log-ratio: ratio = exp(logprobs - old_logprobs)"):
        {"ratio": "log"},
    Mistake("15.loss_ratio_inverted",
            "the ratio is inverted: ratio = exp(logprobs - old_logprobs), the policy over the one that sampled"):
        {"ratio": "inverted"},
    Mistake("15.loss_kl_reversed",
            "the KL's log-ratio is the wrong way round: k3 = exp(r) - r - 1 with r = ref_logprobs - logprobs"):
        {"kl_sign": -1},
    Mistake("15.loss_no_kl",
            "the KL penalty is missing: add beta * k3 per token"):
        {"kl_sign": 0},
    Mistake("15.loss_kl_subtracted",
            "the KL penalty is subtracted: add + beta * k3, so that the loss grows as the policy leaves the "
            "reference"):
        {"kl_weight": -1.0},
    Mistake("15.loss_kl_to_old",
            "the KL is measured to the old log-probabilities: it is to the reference (ref_logprobs), the model "
            "before any training, not the policy that sampled"):
        {"kl_to": "old"},
    Mistake("15.loss_tokens_averaged",
            "the tokens of the whole batch are averaged together (TRL's 'bnpo'): GRPO averages each answer's tokens, "
            "then the answers"):
        {"reduce": "tokens"},
    Mistake("15.loss_padding_counted",
            "the padding positions are counted: average each row over its real tokens, (per_token * mask).sum(-1) / "
            "mask.sum(-1), then over the rows"):
        {"reduce": "padded"},
    Mistake("15.loss_divided_by_t",
            "each row is divided by T, the padded length, not by its own number of real tokens, mask.sum(-1)"):
        {"reduce": "length T"},
    Mistake("15.loss_tokens_summed",
            "each answer's tokens are summed, not averaged: (per_token * mask).sum(-1) / mask.sum(-1)"):
        {"reduce": "sum"},
    Mistake("15.loss_answers_summed",
            "the answers' losses were summed, not averaged: the loss grows with the number of answers B; average "
            "each answer's tokens, then the answers, .mean()"):
        {"reduce": "answers summed"},
}


def _loss_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_scalar_loss(got["loss"], "average each answer's tokens, then the answers")
    args = [inputs[k] for k in LOSS_ARGS] + [inputs["clip_eps"], inputs["beta"]]
    if not bool(torch.isfinite(got["loss"])):
        raise fail("the loss is inf or NaN: the padding positions hold values that must never enter it (here "
                   "ratios of e^30); multiply each token's loss by the mask before summing, or use "
                   "masked_fill, and divide by the real tokens")
    if float(got["loss"].abs()) > HUGE_LOSS:
        raise fail(f"the loss is {float(got['loss']):.4g}, where the answers' real tokens give a few units at most: "
                   "the padding positions are counted (they hold ratios and KL terms of about e^30 here). Mask each "
                   "token's whole loss, the surrogate and the KL penalty, before summing, (per_token * mask).sum(-1), "
                   "and divide by the real tokens, mask.sum(-1)")
    mistakes = {why: partial(_loss_by_hand, *args, **flags) for why, flags in LOSS_MISTAKES.items()}
    check_close(got["loss"], expected["loss"], "the loss", atol=1e-5, mistakes=mistakes)
    check_differentiable(got["differentiable"], "compute it from `logprobs` with torch operations, without .item() "
                                                "or .detach() on the policy's log-probabilities")

    pads = inputs["mask"] == 0
    if bool((got["grad"][pads] != 0).any()):
        raise fail("the loss has a gradient at the padding positions: they are not tokens of any answer; mask "
                   "each token's loss before summing (the tokens' loss times the mask)")
    wrong = {why: cache(partial(_loss_call, partial(_loss_by_hand, **flags), inputs))
             for why, flags in LOSS_MISTAKES.items()}
    for grad in ("grad_plain", "grad"):  # old log-probabilities without a graph first: the ratio's own gradient
        check_close(got[grad], expected[grad], "the gradient of the loss with respect to logprobs", atol=1e-5,
                    mistakes={why: partial(part_of, outputs, grad) for why, outputs in wrong.items()})


def _loss_hidden(seed: int) -> Inputs:
    r = sizes_rng(seed)
    b, t = r.randint(1, 5), r.randint(2, 9)
    return _loss_inputs([t] + [r.randint(1, t) for _ in range(b - 1)], t, r.choice([0.1, 0.28]),
                        r.choice([0.0, 0.02, 1.0]), seed)


def _loss_long(seed: int) -> Inputs:
    r = sizes_rng(seed)
    t = r.randint(40, 64)
    return _loss_inputs([t, 1, r.randint(2, t), r.randint(2, t)], t, 0.2, 0.1, seed, far=1.0)


# ---- grpo_step(policy, reference, optimizer, batch, clip_eps, beta): one update, the reference untouched


def _step_inputs(prompt_lengths: list[int], answer_lengths: list[int], clip_eps: float, beta: float,
                 seed: int) -> Inputs:
    """A batch of answers laid out after their prompts, padded on the right; advantages of both signs (the old
    log-probabilities are added by `_with_old`)."""
    gen = tensor_rng(seed)
    lengths = [p + a for p, a in zip(prompt_lengths, answer_lengths, strict=True)]
    t = max(lengths)
    ids = torch.zeros(len(lengths), t, dtype=torch.long)
    attention_mask = torch.zeros(len(lengths), t, dtype=torch.long)
    completion_mask = torch.zeros(len(lengths), t - 1)
    for row, (p, n) in enumerate(zip(prompt_lengths, lengths, strict=True)):
        ids[row, :n] = torch.randint(1, TINY.vocab_size, (n,), generator=gen)
        attention_mask[row, :n] = 1
        completion_mask[row, p - 1 : n - 1] = 1.0  # position j predicts token j + 1
    advantages = torch.randn(len(lengths), generator=gen)
    advantages[0], advantages[-1] = abs(advantages[0]) + 0.5, -abs(advantages[-1]) - 0.5
    return {"ids": ids, "attention_mask": attention_mask, "completion_mask": completion_mask,
            "advantages": advantages, "clip_eps": clip_eps, "beta": beta, "seed": seed}


def _step_models(inputs: Inputs) -> tuple[GPT, GPT]:
    """The policy and its drifted reference (`policy_and_reference`) of a step's case."""
    return policy_and_reference(TINY, inputs["seed"], 0.05)


def _old_logprobs(inputs: Inputs) -> torch.Tensor:
    """The sampling policy's log-probabilities (N, T - 1): the policy's, moved by up to 0.6 nats (ratios past
    1 +- eps both ways), 0 off the answers."""
    policy, _ = _step_models(inputs)
    with torch.no_grad():
        logps = token_logprobs(policy, inputs["ids"], inputs["attention_mask"])
    noise = (torch.rand(logps.shape, generator=tensor_rng(inputs["seed"] + 1)) * 2 - 1) * 0.6
    mask, advantages = inputs["completion_mask"], inputs["advantages"]
    for row, shift in ((int(advantages.argmax()), -0.5), (int(advantages.argmin()), 0.6)):  # clipped both ways
        noise[row, int(mask[row].nonzero()[0])] = shift
    return (logps + noise) * mask


def _step_call(fn: Any, inputs: Inputs) -> Outputs:
    policy, reference = _step_models(inputs)
    batch = tuple(inputs[k].clone() for k in ("ids", "attention_mask", "completion_mask", "old_logprobs",
                                              "advantages"))
    return reference_step_outputs(policy, reference, lambda opt: fn(policy, reference, opt, batch, inputs["clip_eps"],
                                                                     inputs["beta"]))


def _by_hand_step(policy: GPT, reference: GPT, optimizer: torch.optim.Optimizer, batch: tuple[torch.Tensor, ...],
                  clip_eps: float, beta: float, *, zero_grad: bool = True, shift: int = 1,
                  targets: str = "next", old_from_policy: bool = False, loss_mask: str = "completion",
                  normalise: str = "vocabulary") -> None:
    """grpo_step by hand, with a switch per known mistake: the stale gradients kept; each token read from the
    logits at its own position (`shift` 0), or the logits[:, :-1] gathered at ids[:, :-1] (`targets` "current");
    the batch's old log-probabilities replaced by the policy's own; the attention mask as the loss's mask, prompt
    included (`loss_mask`); the log_softmax over the positions, or none, the raw logits gathered (`normalise`)."""
    ids, attention_mask, completion_mask, old_logprobs, advantages = batch
    mask = completion_mask if loss_mask == "completion" else attention_mask[:, 1:].float()  # (N, T - 1)
    target = ids[:, 1:] if targets == "next" else ids[:, :-1]  # (N, T - 1)

    def logprobs_of(model: GPT) -> torch.Tensor:
        logits = model(ids, attention_mask=attention_mask)  # (N, T, V)
        scores = logits[:, :-1] if shift == 1 else logits[:, 1:]  # (N, T - 1, V)
        scores = {"vocabulary": F.log_softmax(scores, dim=-1), "positions": F.log_softmax(scores, dim=1),
                  "none": scores}[normalise]  # (N, T - 1, V)
        return scores.gather(-1, target[..., None]).squeeze(-1)  # (N, T - 1)

    logprobs = logprobs_of(policy)
    with torch.no_grad():
        ref = logprobs_of(reference)
    old = logprobs.detach() if old_from_policy else old_logprobs
    loss = _reference_loss(logprobs, old, ref, advantages, mask, clip_eps, beta)
    update_by_hand(optimizer, loss, zero_grad)


STEP_MISTAKES = {
    STALE_GRADIENTS: {"zero_grad": False},
    "each token was scored with the logits at its own position: the logits at position j predict the token at "
    "j + 1, so log_softmax(logits[:, :-1]) gathered at ids[:, 1:]":
        {"shift": 0},
    "the batch's old log-probabilities were not used: the ratio compares the policy with the one that sampled "
    "(batch[3]); with the policy's own log-probabilities it is 1 and nothing is ever clipped":
        {"old_from_policy": True},
    "the targets are not shifted: log_softmax(logits[:, :-1]) was gathered at ids[:, :-1], each token scored as "
    "its own prediction; the logits at position j predict the token at j + 1, so gather at ids[:, 1:]":
        {"targets": "current"},
    "the prompt's tokens are counted in the loss: attention_mask[:, 1:] covers the prompt as well as the answer; "
    "the loss's mask is completion_mask (batch[2]), 1 on the answer's tokens only":
        {"loss_mask": "attention"},
    "the log_softmax ran over the positions (dim=1), not the vocabulary: a token's log-probability is normalised "
    "over the V tokens it could have been, F.log_softmax(logits[:, :-1], dim=-1)":
        {"normalise": "positions"},
    "the raw logits were gathered as log-probabilities: take F.log_softmax(logits[:, :-1], dim=-1) first, so that "
    "each position's scores become log-probabilities over the vocabulary":
        {"normalise": "none"},
}


def _step_judge(got: Outputs, expected: Outputs, inputs: Inputs) -> None:
    check_reference_step(got, _step_models(inputs)[0], never_run=None if inputs["beta"] == 0 else (
        "the KL penalty is to the reference's log-probabilities (here it differs from the policy); the policy or "
        "the old log-probabilities in its place hold the policy near the wrong model"), unmasked=(
        "run the policy and the reference with model(ids, attention_mask=attention_mask)"))
    check_stepped_policy(got, expected, lambda: mistaken(_step_call, _by_hand_step, STEP_MISTAKES, inputs, "policy"),
                         "grpo_step calls your grpo_loss (and through it kl_k3)")


def _with_old(inputs: Inputs) -> Inputs:
    return inputs | {"old_logprobs": _old_logprobs(inputs)}


def _step_case(prompts: list[int], answers: list[int], clip_eps: float, beta: float) -> Any:
    return lambda seed: _with_old(_step_inputs(prompts, answers, clip_eps, beta, seed))


PIECES = declare(
    Piece("15", "group_advantages", group_advantages, _adv_call, judge=_adv_judge, forbidden=_ADVANTAGES,
          visible=[("visible", "group_advantages of 3 groups of 4 rewards (0, 0.1 or 1), the second group all equal",
                    lambda seed: _adv_drawn(3, 4, seed, uniform=(1,))),
                   ("one", "group_advantages of 4 groups of one answer each (group_size = 1)",
                    lambda seed: _adv_drawn(4, 1, seed))],
          hidden=[("hidden_sizes", "group_advantages with other group sizes and numbers of groups", _adv_hidden),
                  ("hidden_one", "group_advantages with groups of one", lambda seed: _adv_drawn(5, 1, seed)),
                  ("hidden_all_equal", "group_advantages where every group's rewards are all equal",
                   lambda seed: _adv_drawn(3, 3, seed, uniform=(0, 1, 2)))]),
    Piece("15", "kl_k3", kl_k3, _kl_call, judge=_kl_judge, forbidden=_KL,
          visible=[("visible", "kl_k3 of log-probabilities (B, T) = (3, 5), the reference's up to 2 nats above and "
                               "below the policy's", lambda seed: _kl_inputs((3, 5), 2.0, seed))],
          hidden=[("hidden_sizes", "kl_k3 with other sizes, references 0.5 to 12 nats away", _kl_hidden)]),
    Piece("15", "grpo_loss", _reference_loss, _loss_call, judge=_loss_judge, forbidden=_LOSS,
          visible=[("visible", "grpo_loss of 4 answers padded to T = 6, ratios past both ends of 1 +- 0.2 and "
                    "advantages of both signs, beta = 0.04, old log-probabilities that carry a graph (detach them)",
                    lambda seed: _loss_inputs([6, 3, 5, 2], 6, 0.2, 0.04, seed)),
                   ("reference", "grpo_loss with beta = 0.5 and a reference up to 1 nat from the policy",
                    lambda seed: _loss_inputs([5, 5, 4], 5, 0.2, 0.5, seed))],
          hidden=[("hidden_sizes", "grpo_loss with other sizes, eps and beta (0 included)", _loss_hidden),
                  ("hidden_long", "grpo_loss of answers 1 to 64 tokens long, ratios further from 1", _loss_long)]),
    Piece("15", "grpo_step", grpo_step, _step_call, judge=_step_judge, forbidden=_STEP,
          visible=[("visible", "grpo_step on 4 answers (prompts of 2 or 3 tokens, answers of 1 to 5, padded on the "
                               "right), clip_eps = 0.2, beta = 0.1, SGD with lr = 1, a reference and old "
                               "log-probabilities that differ from the policy's, stale gradients in the policy's .grad",
                    _step_case([2, 3, 2, 3], [5, 1, 3, 4], 0.2, 0.1))],
          hidden=[("hidden_sizes", "grpo_step on 3 answers of other lengths, beta = 1",
                   _step_case([1, 4, 2], [6, 2, 1], 0.1, 1.0))]),
)
