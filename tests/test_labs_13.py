"""Lab 13 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake of DPO loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "13_preference_optimization"
LOGPS = '''
def sequence_logprobs(model, ids, attention_mask, labels):
    logits = model(ids, attention_mask=attention_mask)
    targets = labels{cut}
    logprobs = F.log_softmax({scores}, dim={dim})
    picked = logprobs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1).masked_fill(targets == -100, 0.0)
    return picked.sum(-1)
'''
RIGHT_LOGPS = {"cut": "[:, 1:]", "scores": "logits[:, :-1]", "dim": "-1"}
DPO = '''
def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    chosen = beta * ({chosen})
    rejected = beta * ({rejected})
    loss = {loss}
    return loss, chosen.detach(), rejected.detach()
'''
RIGHT_DPO = {"chosen": "policy_chosen - ref_chosen", "rejected": "policy_rejected - ref_rejected",
             "loss": "-F.logsigmoid(chosen - rejected).mean()"}
ADAPTERS = '''
@contextlib.contextmanager
def adapters_disabled(model):
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for layer in layers:
        layer.enabled = False
    {body}
'''
# disabled by scaling each update to 0, then every scaling set back to the constant alpha / rank
ADAPTERS_BY_SCALING = '''
@contextlib.contextmanager
def adapters_disabled(model):
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for layer in layers:
        layer.scaling = 0.0
    try:
        yield model
    finally:
        for layer in layers:
            layer.scaling = layer.alpha / layer.rank
'''


LOGPS_TESTS = {"test_sequence_logprobs", "test_sequence_logprobs_left", "test_sequence_logprobs_hidden"}
DPO_TESTS = {"test_dpo_loss", "test_dpo_loss_large", "test_dpo_loss_hidden"}
STEP_TESTS = {"test_dpo_step", "test_dpo_step_hidden"}  # a step uses the student's two functions above
ADAPTER_TESTS = {"test_adapters_disabled", "test_adapters_disabled_hidden"}
# Written blind to the tests (issue 42), as written: student -> the test cells it must fail, each case of each cell
# run in-process (`check_blind_student`, since issue 43) and each cell by nbgrader (the round trip). Before issue 42
# step-reference-from-policy, step-no-zero-grad, step-reference-detached, logps-no-mask, dpo-rewards-not-detached
# and adapters-all-enabled-after passed every cell (the step's reference was a copy of the policy, its policy had
# no stale gradients, the model ignored the mask, no adapter started off), and nothing named adapters-children-only,
# adapters-on-a-copy, dpo-beta-divides, dpo-beta-one-side or logps-pads-counted.
BLIND_FILE = Path(__file__).with_name("lab13_blind.cells")
BLIND_FAILS = {
    **dict.fromkeys(("logps-averaged", "logps-not-shifted", "logps-no-mask", "logps-pads-counted",
                     "logps-prompt-counted"), LOGPS_TESTS | STEP_TESTS),
    **dict.fromkeys(("dpo-beta-divides", "dpo-beta-one-side", "dpo-chosen-rejected-swapped",
                     "dpo-summed-over-pairs"), DPO_TESTS | STEP_TESTS),
    # right for small margins (a step's are a few nats); inf once sigmoid rounds to 0
    "dpo-log-of-sigmoid": {"test_dpo_loss_large", "test_dpo_loss_hidden"},
    "dpo-rewards-not-detached": DPO_TESTS,
    **dict.fromkeys(("step-reference-from-policy", "step-reference-detached", "step-reference-gets-gradients",
                     "step-no-zero-grad", "step-zero-grad-after-backward", "step-halves-interleaved"), STEP_TESTS),
    **dict.fromkeys(("adapters-all-enabled-after", "adapters-children-only", "adapters-on-a-copy",
                     "adapters-not-restored-after-an-error"), ADAPTER_TESTS),
}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    "dpo-no-reference": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "chosen": "policy_chosen", "rejected": "policy_rejected"})}, DPO_TESTS | STEP_TESTS),
    # passed dpo_step while the step's reference was a copy of the policy (margins of 0, where its gradient is right)
    "dpo-beta-outside": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "loss": "-beta * F.logsigmoid(chosen / beta - rejected / beta).mean()"})}, DPO_TESTS | STEP_TESTS),
    "logps-shifted-the-other-way": ({"sequence_logprobs": LOGPS.format(**RIGHT_LOGPS | {
        "cut": "[:, :-1]", "scores": "logits[:, 1:]"})}, LOGPS_TESTS | STEP_TESTS),
    "logps-softmax-over-positions": ({"sequence_logprobs": LOGPS.format(**RIGHT_LOGPS | {"dim": "1"})},
                                     LOGPS_TESTS | STEP_TESTS),
    "adapters-scaling-reset": ({"adapters_disabled": ADAPTERS_BY_SCALING}, ADAPTER_TESTS),
    "adapters-never-restored": ({"adapters_disabled": ADAPTERS.format(body="yield model")}, ADAPTER_TESTS),
    # a reference imported costs its own piece and the step, which calls the student's dpo_loss and sequence_logprobs
    "dpo-imports-reference": ({"dpo_loss": "from gptcourse import dpo_loss\n"}, DPO_TESTS | STEP_TESTS),
    "adapters-imports-reference": ({"adapters_disabled": "from gptcourse import adapters_disabled\n"},
                                   ADAPTER_TESTS),
    # lesson 15's token_logprobs shifts and takes the log-softmax: the labelled ones summed are the answer
    "logps-by-token-logprobs": ({"sequence_logprobs": '''
from gptcourse.finetuning.grpo_training import token_logprobs

def sequence_logprobs(model, ids, attention_mask, labels):
    picked = token_logprobs(model, ids, attention_mask)  # (B, T-1)
    return picked.masked_fill(labels[:, 1:] == -100, 0.0).sum(dim=-1)
'''}, LOGPS_TESTS | STEP_TESTS),
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "13.sequence_logprobs.visible": {
        "logps-averaged": "the log-probabilities are averaged",
        "logps-not-shifted": "label t is read from the logits at t:",
        "logps-no-mask": "the model was not given the attention mask",
        "logps-pads-counted": "the -100 positions are counted",
        "logps-prompt-counted": "the prompt's tokens are counted",
        "logps-shifted-the-other-way": "label t is read from the logits at t + 1",
        "logps-softmax-over-positions": "the softmax runs over the positions",
    },
    "13.dpo_loss.visible": {
        "dpo-beta-divides": "beta divides the log-ratios",
        "dpo-beta-one-side": "beta multiplies the chosen log-ratio only",
        "dpo-chosen-rejected-swapped": "chosen and rejected are swapped",
        "dpo-summed-over-pairs": "the loss is summed over the pairs",
        "dpo-no-reference": "the reference is missing",
        "dpo-beta-outside": "beta multiplies the loss, not the margin",
        "dpo-rewards-not-detached": "the rewards require grad",
        "dpo-imports-reference": "is gptcourse.dpo_loss, the reference",
    },
    "13.dpo_loss.large": {
        "dpo-log-of-sigmoid": "Use F.logsigmoid(margin)",
    },
    "13.dpo_step.visible": {
        "step-reference-gets-gradients": "the reference received gradients",
        "step-reference-from-policy": "the reference model was never run",
        "step-reference-detached": "the reference's forward pass built a graph",
        "step-no-zero-grad": "the gradients left in .grad by the last step were added to",
        "step-zero-grad-after-backward": "the policy's parameters did not change",
        "step-halves-interleaved": "the rows are split into even and odd ones",
    },
    "13.adapters_disabled.visible": {
        "adapters-all-enabled-after": "rather than setting every adapter to True",
        "adapters-children-only": "no adapter was switched off inside the block",
        "adapters-on-a-copy": "(a copy?)",
        "adapters-scaling-reset": "rather than a constant such as alpha / rank",
        "adapters-never-restored": "the adapters stay off after the block",
        "adapters-not-restored-after-an-error": "the adapters stay off when the block is left by an error",
        "adapters-imports-reference": "is gptcourse.adapters_disabled, the reference",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 20, Validation("blind-dpo-log-of-sigmoid", 1, "13.dpo_loss.large", "Use F.logsigmoid(margin)")


class TestLab13(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 13's round trip and in-process checks, from the tables above."""
