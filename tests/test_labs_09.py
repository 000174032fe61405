"""Lab 09 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation, check_named_mistake

LAB = "09_training_by_hand"
NAIVE_CROSS_ENTROPY = '''
def cross_entropy(logits, targets):
    probs = logits.exp() / logits.exp().sum(dim=-1, keepdim=True)
    return -probs.gather(1, targets[:, None]).log().mean()
'''
EPS_CROSS_ENTROPY = '''
def cross_entropy(logits, targets):
    probs = (logits - logits.max(dim=-1, keepdim=True).values).exp()
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return -(probs.gather(1, targets[:, None]) + 1e-9).log().mean()
'''
ADAMW = '''
def adamw_step(param, grad, exp_avg, exp_avg_sq, step, lr, beta1, beta2, eps, weight_decay):
    {decay}
    exp_avg = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad * grad
    m_hat = exp_avg{correction}
    v_hat = exp_avg_sq / (1 - beta2**step)
    return {update}, exp_avg, exp_avg_sq
'''
RIGHT_ADAMW = {"decay": "param = param * (1 - lr * weight_decay)", "correction": " / (1 - beta1**step)",
               "update": "param - lr * m_hat / (v_hat.sqrt() + eps)"}
ADAMW_TESTS = {"test_adamw_step", "test_adamw_step_decay", "test_adamw_step_hidden"}
LR_AT = '''
def lr_at(step, max_lr, min_lr, warmup_steps, total_steps):
    if step < warmup_steps:
        return max_lr * {warmup} / warmup_steps
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * {swing}
'''
RIGHT_LR_AT = {"warmup": "(step + 1)", "swing": "(max_lr - min_lr)"}
PER_TENSOR_CLIP = '''
def clip_grad_norm(parameters, max_norm):
    norms = []
    for p in parameters:
        if p.grad is not None:
            norms.append(p.grad.norm())
            p.grad.mul_(min(1.0, max_norm / (norms[-1].item() + 1e-6)))
    return torch.stack(norms).norm()
'''
CLIP_BY_VALUE = '''
def clip_grad_norm(parameters, max_norm):
    grads = [p.grad for p in parameters if p.grad is not None]
    norm = torch.cat([g.flatten() for g in grads]).norm()
    for g in grads:
        g.clamp_(-max_norm, max_norm)
    return norm
'''
UNDIVIDED_ACCUMULATION = '''
def accumulate_gradients(model, tokens, micro_batches):
    model.zero_grad()
    losses = []
    for piece in tokens.chunk(micro_batches):
        loss = cross_entropy(model(piece[:, :-1]).flatten(0, 1), piece[:, 1:].flatten())
        loss.backward()
        losses.append(loss.item())
    return sum(losses) / micro_batches
'''
# a stable softmax, then its log: a target far below its row's best logit has probability 0, and log(0) = -inf
SOFTMAX_THEN_LOG = '''
def cross_entropy(logits, targets):
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    probs = shifted.exp() / shifted.exp().sum(dim=-1, keepdim=True)
    return -probs.gather(1, targets[:, None]).log().mean()
'''
SEEN_ACCUMULATION = '''
def accumulate_gradients(model, tokens, micro_batches):
    model.zero_grad()
    losses = []
    for micro_step, piece in enumerate(tokens.chunk(micro_batches)):
        loss = cross_entropy(model(piece[:, :-1]).flatten(0, 1), piece[:, 1:].flatten())
        (loss / (micro_step + 1)).backward()
        losses.append(loss.item())
    return sum(losses) / micro_batches
'''
# the whole batch in one forward and backward: the same gradient, none of the memory accumulation saves
WHOLE_BATCH_ACCUMULATION = '''
def accumulate_gradients(model, tokens, micro_batches):
    model.zero_grad()
    loss = cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    return loss.item()
'''
FORGETFUL_RESTORE = '''
def restore_training_state(state, model, optimizer, generator):
    model.load_state_dict(state["model"])
    generator.set_state(state["generator"])
    return state["step"]
'''
GLOBAL_RNG_STATE = '''
def training_state(model, optimizer, generator, step):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "generator": torch.get_rng_state(),
            "step": step}
'''
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # fine for small logits; nan once exp() overflows
    "no-log-sum-exp": ({"cross_entropy": NAIVE_CROSS_ENTROPY},
                       {"test_cross_entropy_large", "test_cross_entropy_hidden"}),
    # the eps keeps the loss finite, and caps it: wrong wherever a target's probability rounds to 0, and off in
    # accumulate_gradients (which uses the student's cross_entropy) where one target's is 2e-9, as in its visible case
    "log-plus-eps": ({"cross_entropy": EPS_CROSS_ENTROPY}, {"test_cross_entropy_large", "test_cross_entropy_hidden",
                                                            "test_accumulate_gradients"}),
    "coupled-decay": ({"adamw_step": ADAMW.format(**RIGHT_ADAMW | {"decay": "grad = grad + weight_decay * param"})},
                      ADAMW_TESTS),
    # off by lr**2 * weight_decay * update a step: within the first visible case's tolerance (lr=0.01,
    # weight_decay=0.1); the decay case catches it, and so does the hidden case this student draws (lr=0.05)
    "decay-after-update": ({"adamw_step": ADAMW.format(**RIGHT_ADAMW | {
        "decay": "pass", "update": f"({RIGHT_ADAMW['update']}) * (1 - lr * weight_decay)"})},
        ADAMW_TESTS - {"test_adamw_step"}),
    "decay-divided-by-sqrt-v": ({"adamw_step": ADAMW.format(**RIGHT_ADAMW | {
        "decay": "pass", "update": "param - lr * (m_hat + weight_decay * param) / (v_hat.sqrt() + eps)"})},
        ADAMW_TESTS),
    "no-bias-correction": ({"adamw_step": ADAMW.format(**RIGHT_ADAMW | {"correction": ""})}, ADAMW_TESTS),
    "bias-correction-step-plus-one": ({"adamw_step": ADAMW.format(**RIGHT_ADAMW | {
        "decay": RIGHT_ADAMW["decay"] + "\n    step = step + 1"})}, ADAMW_TESTS),
    "warmup-from-zero": ({"lr_at": LR_AT.format(**RIGHT_LR_AT | {"warmup": "step"})},
                         {"test_lr_at", "test_lr_at_hidden"}),
    "cosine-over-max-lr": ({"lr_at": LR_AT.format(**RIGHT_LR_AT | {"swing": "max_lr"})},
                           {"test_lr_at", "test_lr_at_hidden"}),
    # below max_norm nothing is clipped, so that test passes
    "per-tensor-clip": ({"clip_grad_norm": PER_TENSOR_CLIP}, {"test_clip_grad_norm", "test_clip_grad_norm_hidden"}),
    "clip-by-value": ({"clip_grad_norm": CLIP_BY_VALUE}, {"test_clip_grad_norm", "test_clip_grad_norm_hidden"}),
    "undivided-accumulation": ({"accumulate_gradients": UNDIVIDED_ACCUMULATION},
                               {"test_accumulate_gradients", "test_accumulate_gradients_hidden"}),
    "accumulation-in-one-batch": ({"accumulate_gradients": WHOLE_BATCH_ACCUMULATION},
                                  {"test_accumulate_gradients", "test_accumulate_gradients_hidden"}),
    "restore-without-optimizer": ({"restore_training_state": FORGETFUL_RESTORE},
                                  {"test_restore_training_state", "test_restore_training_state_hidden"}),
    "global-rng-state": ({"training_state": GLOBAL_RNG_STATE}, {"test_training_state", "test_training_state_hidden"}),
    # finite for ordinary logits; inf once a target's probability underflows (accumulate_gradients' case is mild)
    "softmax-then-log": ({"cross_entropy": SOFTMAX_THEN_LOG},
                         {"test_cross_entropy_large", "test_cross_entropy_hidden"}),
    # 1 - beta instead of 1 - beta**step: right at step 1 only (with betas (0.9, 0.99) it equals no correction at all)
    "bias-correction-without-power": ({"adamw_step": ADAMW.format(**RIGHT_ADAMW | {
        "correction": " / (1 - beta1)", "update": "param - lr * m_hat / ((exp_avg_sq / (1 - beta2)).sqrt() + eps)"})},
        ADAMW_TESTS),
    # (step + 1) / (warmup_steps + 1), written as the template allows
    "warmup-over-warmup-plus-one": ({"lr_at": LR_AT.format(**RIGHT_LR_AT | {
        "warmup": "(step + 1) * warmup_steps / (warmup_steps + 1)"})}, {"test_lr_at", "test_lr_at_hidden"}),
    "accumulation-divided-by-seen": ({"accumulate_gradients": SEEN_ACCUMULATION},
                                     {"test_accumulate_gradients", "test_accumulate_gradients_hidden"}),
    # the Adam paper's folded step size: eps lands before the corrections; only a gradient near eps shows it
    "eps-before-correction": ({"adamw_step": ADAMW.format(**RIGHT_ADAMW | {
        "update": "param - lr * (1 - beta2**step) ** 0.5 / (1 - beta1**step) * exp_avg / (exp_avg_sq.sqrt() + eps)"})},
        ADAMW_TESTS),
    # the micro-batches' loss from torch's cross_entropy, not the student's cross_entropy: cross_entropy's
    # reference, which accumulate_gradients does not forbid (the loss is not its point) and which is no stub in the
    # graded kernel (torch's), so only cross_entropy's cells are lost
    "accumulation-with-torch-cross-entropy": (
        {"accumulate_gradients": UNDIVIDED_ACCUMULATION.replace(
            "cross_entropy(", "torch.nn.functional.cross_entropy(").replace(
            "loss.backward()", "(loss / micro_batches).backward()")},
        {"test_cross_entropy", "test_cross_entropy_large", "test_cross_entropy_hidden"}),
    # the same with the course's lm_loss, which cross_entropy forbids too (F.cross_entropy behind a model): the scan
    # zeroes cross_entropy alone, but the graded kernel has no lm_loss (every reference the lab forbids is a stub
    # there), so accumulate_gradients fails with its error
    "accumulation-with-the-course-loss": (
        {"accumulate_gradients": "from gptcourse.training.loop import lm_loss\n" + UNDIVIDED_ACCUMULATION.replace(
            "cross_entropy(model(piece[:, :-1]).flatten(0, 1), piece[:, 1:].flatten())",
            "lm_loss(model, piece[:, :-1], piece[:, 1:])").replace("loss.backward()",
                                                                  "(loss / micro_batches).backward()")},
        {"test_cross_entropy", "test_cross_entropy_large", "test_cross_entropy_hidden", "test_accumulate_gradients",
         "test_accumulate_gradients_hidden"}),
    # lesson 11's fine-tuning loss, fed the N rows as one sequence shifted by a padding row: it passed every cell
    # before cross_entropy forbade it (fixtures.LOG_SOFTMAX_FUNCTIONS); accumulate_gradients calls this
    # cross_entropy, whose masked_lm_loss is a stub in the graded kernel
    "ce-from-the-finetuning-loss": (
        {"cross_entropy": "def cross_entropy(logits, targets):\n    from gptcourse import masked_lm_loss\n"
                          "    pad = torch.zeros_like(logits[:1])  # (1, V): the row the shift drops\n"
                          "    return masked_lm_loss(torch.cat([logits, pad])[None], "
                          "torch.cat([targets[:1], targets])[None])"},
        {"test_cross_entropy", "test_cross_entropy_large", "test_cross_entropy_hidden", "test_accumulate_gradients",
         "test_accumulate_gradients_hidden"}),
    # lesson 16's router z-loss of one row is its logsumexp squared (>= 100 after shifting the row's max to 10, so
    # the square root's gradient stays finite): it passed every cell before cross_entropy forbade it
    "ce-from-the-router-z-loss": ({"cross_entropy": '''
from gptcourse import router_z_loss

def cross_entropy(logits, targets):
    m = logits.max(dim=-1, keepdim=True).values - 10  # (N, 1): after the shift each row's logsumexp is >= 10
    log_sum_exp = torch.stack([router_z_loss(row[None]).sqrt() for row in logits - m]) + m.squeeze(-1)  # (N,)
    return (log_sum_exp - logits.gather(1, targets[:, None]).squeeze(1)).mean()
'''}, {"test_cross_entropy", "test_cross_entropy_large", "test_cross_entropy_hidden", "test_accumulate_gradients",
          "test_accumulate_gradients_hidden"}),
}


@pytest.mark.parametrize("seed", range(12))
def test_the_hidden_case_shows_decay_after_the_update(seed, monkeypatch):
    """At lr=1e-3 the decay's order moves a weight by lr**2 * weight_decay, inside the tolerance: the hidden
    case's learning rates and decays are large enough that every draw shows it (at 1e-3 most draws passed)."""
    monkeypatch.setenv("GPTCOURSE_HIDDEN_SEEDS", f"09.adamw_step.hidden_sizes={seed}")
    check_named_mistake(LAB, WRONG["decay-after-update"][0], "09.adamw_step.hidden_sizes",
                        "weight decay applied after the update")


# Written blind to the tests (docs/readings: the blind students of labs 06-11), checked in-process against every test
# cell, hidden included, and graded by nbgrader in the round trip. Before the fixes ce-naive-exp was told that a
# stable softmax followed by log underflows (its exp(z) overflows) and clip-not-in-place got a bare "times 3.083".
# ce-uses-logsumexp and adam-uses-torch-optim, right values from what the lab forbids, are zeroed by the grader's
# scan of the cells (`forbidden.find_forbidden`); ce-log-softmax-method and ce-logsumexp-method, the Tensor methods
# of the functions the lab forbids, by the kernel's record of the calls (`forbidden.calls_to`).
BLIND_FILE = Path(__file__).with_name("lab09_blind.cells")
# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "09.accumulate_gradients.visible": {
        "accumulation-in-one-batch": "the model ran on 4 rows at once, where each of the micro_batches=2 "
                                     "micro-batches has 2",
        "undivided-accumulation": "the gradient is 2x too large",
        "accumulation-divided-by-seen": "divided by how many micro-batches had been seen (micro_step + 1)",
    },
    "09.cross_entropy.large": {
        "no-log-sum-exp": "exp() overflows float32 past 88",
        "log-plus-eps": "log(p + 1e-09) caps each row's loss at -log(1e-09) = 20.7",
        "softmax-then-log": "a stable softmax followed by log is not enough",
    },
    "09.adamw_step.visible": {
        "coupled-decay": "weight decay applied to the gradient, not decoupled",
        "decay-divided-by-sqrt-v": "weight decay divided by sqrt(v_hat) + eps",
        "no-bias-correction": "bias correction missing: step 1 is 10x too small",
        "bias-correction-step-plus-one": "the bias correction uses step + 1",
        "bias-correction-without-power": "the bias correction divides by (1 - beta1) and (1 - beta2), without the "
                                         "step's power",
        "eps-before-correction": "eps is added before the bias correction",
    },
    "09.adamw_step.decay": {
        "decay-after-update": "weight decay applied after the update: it shrinks the already-updated weight",
    },
    "09.lr_at.visible": {
        "warmup-from-zero": "the warmup starts at 0",
        "cosine-over-max-lr": "the cosine swings over max_lr, not max_lr - min_lr",
        "warmup-over-warmup-plus-one": "the warmup divides by warmup_steps + 1",
    },
    "09.clip_grad_norm.visible": {
        "per-tensor-clip": "each tensor was clipped on its own",
        "clip-by-value": "each entry was clamped to [-max_norm, max_norm]",
    },
    "09.restore_training_state.visible": {
        "restore-without-optimizer": "the optimizer's state was not restored",
    },
    "09.training_state.visible": {
        "global-rng-state": "torch's global random state",
    },
}

CE, ACCUMULATE = {"test_cross_entropy", "test_cross_entropy_large"}, {"test_accumulate_gradients"}
BLIND_FAILS = {
    # fine for ordinary logits: only the large cases overflow (or, with the batch's max, underflow)
    **dict.fromkeys(("ce-naive-exp", "ce-global-max"),
                    frozenset({"test_cross_entropy_large", "test_cross_entropy_hidden"})),
    # accumulate_gradients' loss is the student's cross_entropy: its gradient is off by the max's (that piece's
    # message cannot name a mistake made in another; only the student's own piece's visible cells must)
    "ce-forgets-max-back": CE | ACCUMULATE | {"test_cross_entropy_hidden", "test_accumulate_gradients_hidden"},
    # within the first visible case's tolerance (lr=0.01, weight_decay=0.1)
    "adam-decay-after": {"test_adamw_step_decay", "test_adamw_step_hidden"},
    **dict.fromkeys(("adam-l2-in-grad", "adam-no-bias-correction", "adam-eps-inside-sqrt"),
                    frozenset({"test_adamw_step", "test_adamw_step_decay", "test_adamw_step_hidden"})),
    **dict.fromkeys(("lr-warmup-from-zero", "lr-no-clamp", "lr-progress-from-zero"),
                    frozenset({"test_lr_at", "test_lr_at_hidden"})),
    **dict.fromkeys(("clip-per-tensor", "clip-returns-after", "clip-not-in-place"),
                    frozenset({"test_clip_grad_norm", "test_clip_grad_norm_hidden"})),
    "clip-always-scale": {"test_clip_grad_norm_below"},  # the other cases' norms are above max_norm
    **dict.fromkeys(("accum-no-divide", "accum-returns-sum", "accum-zero-grad-each-piece"),
                    frozenset({"test_accumulate_gradients", "test_accumulate_gradients_hidden"})),
    "state-no-generator": {"test_training_state", "test_training_state_hidden", "test_restore_training_state",
                           "test_restore_training_state_hidden"},
    "restore-skips-optimizer": {"test_restore_training_state", "test_restore_training_state_hidden"},
    "state-optimizer-params-only": {"test_training_state", "test_training_state_hidden"},
    "ce-uses-logsumexp": CE | {"test_cross_entropy_hidden"},  # accumulate_gradients gets right values from it
    "adam-uses-torch-optim": {"test_adamw_step", "test_adamw_step_decay", "test_adamw_step_hidden"},
    **dict.fromkeys(("ce-log-softmax-method", "ce-logsumexp-method", "ce-special-log-softmax", "ce-log-softmax-module",
                     "ce-nll-loss-module"), frozenset(CE | {"test_cross_entropy_hidden"})),
    "adam-functional-adamw": {"test_adamw_step", "test_adamw_step_decay", "test_adamw_step_hidden"},
}


# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 34, Validation("no-bias-correction", 2, "09.adamw_step.visible",
                                 "bias correction missing: step 1 is 10x too small")


class TestLab09(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 09's round trip and in-process checks, from the tables above."""

    @pytest.mark.slow
    def test_the_graders_records_name_the_eps_in_the_log_by_its_key(self, course, scores):
        """The judge's verdict records in the autograded notebooks, as `gptcourse report` reads them, key the eps
        inside the log (`checks.eps_in_log_mistakes`) and a by-hand switch (`fixtures.switch_key`)."""
        from gptcourse.grading.classroom import class_report

        named = {m.key: set(m.students) for m in class_report.build(course.root, LAB).mistakes()}
        assert "log-plus-eps" in named.get("loss.eps_in_log", set()), named
        assert "coupled-decay" in named.get("09.adamw_step:decay=gradient", set()), named
