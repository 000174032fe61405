"""Lab 13 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake of DPO loses exactly the points of the tests it should fail."""

from __future__ import annotations

import pytest
from lab_roundtrip import RoundTrip, Validation, check_named_mistake

LAB = "13_preference_optimization"
LOGPS = '''
def sequence_logprobs(model, ids, attention_mask, labels):
    logits = {call}
    targets = {targets}{cut}
    logprobs = F.log_softmax({scores}, dim={dim})
    picked = logprobs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1).masked_fill(targets == -100, 0.0)
    return {ret}
'''
RIGHT_LOGPS = {"call": "model(ids, attention_mask=attention_mask)", "targets": "labels", "cut": "[:, 1:]",
               "scores": "logits[:, :-1]", "dim": "-1", "ret": "picked.sum(-1)"}
DPO = '''
def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    chosen = beta * ({chosen})
    rejected = beta * ({rejected})
    loss = {loss}
    return loss, {rewards}
'''
RIGHT_DPO = {"chosen": "policy_chosen - ref_chosen", "rejected": "policy_rejected - ref_rejected",
             "loss": "-F.logsigmoid(chosen - rejected).mean()", "rewards": "chosen.detach(), rejected.detach()"}
STEP = '''
def dpo_step(policy, reference, optimizer, batch, beta):
    ids, attention_mask, labels = batch
    policy_chosen, policy_rejected = sequence_logprobs(policy, ids, attention_mask, labels){split}
    {no_grad}
        ref_chosen, ref_rejected = sequence_logprobs({reference}, ids, attention_mask, labels){detach}{split}
    loss, _, _ = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
    {zero_grad}
    loss.backward()
    optimizer.step()
    return loss
'''
RIGHT_STEP = {"split": ".chunk(2)", "no_grad": "with torch.no_grad():", "reference": "reference", "detach": "",
              "zero_grad": "optimizer.zero_grad()"}
ADAPTERS = '''
@contextlib.contextmanager
def adapters_disabled(model):
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for layer in layers:
        layer.enabled = False
    {body}
'''
# each layer's own state restored, but only when the block ends normally
ADAPTERS_WITHOUT_FINALLY = '''
@contextlib.contextmanager
def adapters_disabled(model):
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    states = [layer.enabled for layer in layers]
    for layer in layers:
        layer.enabled = False
    yield model
    for layer, state in zip(layers, states):
        layer.enabled = state
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
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # right on responses of one token (the hidden one-token case), wrong on the others
    "logps-averaged": ({"sequence_logprobs": LOGPS.format(**RIGHT_LOGPS | {
        "ret": "picked.sum(-1) / (targets != -100).sum(-1)"})}, LOGPS_TESTS | STEP_TESTS),
    "logps-prompt-counted": ({"sequence_logprobs": LOGPS.format(**RIGHT_LOGPS | {
        "targets": "ids.masked_fill(attention_mask == 0, -100)"})}, LOGPS_TESTS | STEP_TESTS),
    "dpo-chosen-rejected-swapped": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "loss": "-F.logsigmoid(rejected - chosen).mean()"})}, DPO_TESTS | STEP_TESTS),
    "dpo-no-reference": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "chosen": "policy_chosen", "rejected": "policy_rejected"})}, DPO_TESTS | STEP_TESTS),
    # right for small margins (a step's are a few nats); inf once sigmoid rounds to 0
    "dpo-log-of-sigmoid": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "loss": "-torch.log(torch.sigmoid(chosen - rejected)).mean()"})},
        {"test_dpo_loss_large", "test_dpo_loss_hidden"}),
    # passed dpo_step while the step's reference was a copy of the policy (margins of 0, where its gradient is right)
    "dpo-beta-outside": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "loss": "-beta * F.logsigmoid(chosen / beta - rejected / beta).mean()"})}, DPO_TESTS | STEP_TESTS),
    "step-reference-gets-gradients": ({"dpo_step": STEP.format(**RIGHT_STEP | {"no_grad": "if True:"})}, STEP_TESTS),
    # issue 42's shortcuts: each passed every cell while the case's reference was a copy of the policy, its model
    # ignored the mask, its policy had no stale gradients and every adapter started enabled
    "step-reference-from-policy": ({"dpo_step": STEP.format(**RIGHT_STEP | {"reference": "policy"})}, STEP_TESTS),
    "step-reference-detached": ({"dpo_step": STEP.format(**RIGHT_STEP | {"no_grad": "if True:",
                                                                         "detach": ".detach()"})}, STEP_TESTS),
    "step-no-zero-grad": ({"dpo_step": STEP.format(**RIGHT_STEP | {"zero_grad": "pass"})}, STEP_TESTS),
    "step-halves-interleaved": ({"dpo_step": STEP.format(**RIGHT_STEP | {"split": ".reshape(-1, 2).T"})},
                                STEP_TESTS),
    "logps-no-mask": ({"sequence_logprobs": LOGPS.format(**RIGHT_LOGPS | {"call": "model(ids)"})},
                      LOGPS_TESTS | STEP_TESTS),
    "logps-shifted-the-other-way": ({"sequence_logprobs": LOGPS.format(**RIGHT_LOGPS | {
        "cut": "[:, :-1]", "scores": "logits[:, 1:]"})}, LOGPS_TESTS | STEP_TESTS),
    "logps-softmax-over-positions": ({"sequence_logprobs": LOGPS.format(**RIGHT_LOGPS | {"dim": "1"})},
                                     LOGPS_TESTS | STEP_TESTS),
    "dpo-rewards-not-detached": ({"dpo_loss": DPO.format(**RIGHT_DPO | {"rewards": "chosen, rejected"})}, DPO_TESTS),
    "adapters-all-enabled-after": ({"adapters_disabled": ADAPTERS.format(body="try:\n        yield model\n    "
                                                                         "finally:\n        for layer in layers:\n"
                                                                         "            layer.enabled = True")},
                                   ADAPTER_TESTS),
    "adapters-scaling-reset": ({"adapters_disabled": ADAPTERS_BY_SCALING}, ADAPTER_TESTS),
    "adapters-never-restored": ({"adapters_disabled": ADAPTERS.format(body="yield model")}, ADAPTER_TESTS),
    "adapters-not-restored-after-an-error": ({"adapters_disabled": ADAPTERS_WITHOUT_FINALLY}, ADAPTER_TESTS),
}
# student -> (a case their code fails, what its message says)
SAYS = {
    "logps-averaged": ("13.sequence_logprobs.visible", "the log-probabilities are averaged"),
    "logps-prompt-counted": ("13.sequence_logprobs.visible", "the prompt's tokens are counted"),
    "dpo-chosen-rejected-swapped": ("13.dpo_loss.visible", "chosen and rejected are swapped"),
    "dpo-no-reference": ("13.dpo_loss.visible", "the reference is missing"),
    "dpo-log-of-sigmoid": ("13.dpo_loss.large", "Use F.logsigmoid(margin)"),
    "dpo-beta-outside": ("13.dpo_loss.visible", "beta multiplies the loss, not the margin"),
    "step-reference-gets-gradients": ("13.dpo_step.visible", "the reference received gradients"),
    "step-reference-from-policy": ("13.dpo_step.visible", "the reference model was never run"),
    "step-reference-detached": ("13.dpo_step.visible", "the reference's forward pass built a graph"),
    "step-no-zero-grad": ("13.dpo_step.visible", "the gradients left in .grad by the last step were added to"),
    "step-halves-interleaved": ("13.dpo_step.visible", "the rows are split into even and odd ones"),
    "logps-no-mask": ("13.sequence_logprobs.visible", "the model was not given the attention mask"),
    "logps-shifted-the-other-way": ("13.sequence_logprobs.visible", "label t is read from the logits at t + 1"),
    "logps-softmax-over-positions": ("13.sequence_logprobs.visible", "the softmax runs over the positions"),
    "dpo-rewards-not-detached": ("13.dpo_loss.visible", "the rewards require grad"),
    "adapters-all-enabled-after": ("13.adapters_disabled.visible", "rather than setting every adapter to True"),
    "adapters-scaling-reset": ("13.adapters_disabled.visible", "rather than a constant such as alpha / rank"),
    "adapters-never-restored": ("13.adapters_disabled.visible", "the adapters stay off after the block"),
    "adapters-not-restored-after-an-error": ("13.adapters_disabled.visible",
                                             "the adapters stay off when the block is left by an error"),
}


class TestLab13(RoundTrip):
    LAB = LAB
    WRONG = WRONG
    TOTAL = 20
    VALIDATE = Validation("dpo-log-of-sigmoid", 1, (
        'check("13.dpo_loss.large", dpo_loss)',
        "Use F.logsigmoid(margin)",
    ))


@pytest.mark.parametrize("student", sorted(SAYS))
def test_each_named_mistake_gets_its_message(student):
    check_named_mistake(LAB, WRONG[student][0], *SAYS[student])
