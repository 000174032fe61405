"""Lab 13 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake of DPO loses exactly the points of the tests it should fail."""

from __future__ import annotations

import pytest
from lab_roundtrip import RoundTrip, Validation, check_named_mistake

LAB = "13_preference_optimization"
LOGPS = '''
def sequence_logprobs(model, ids, attention_mask, labels):
    logits = model(ids, attention_mask=attention_mask)
    targets = {targets}[:, 1:]
    logprobs = F.log_softmax(logits[:, :-1], dim=-1)
    picked = logprobs.gather(-1, targets.clamp(min=0)[..., None]).squeeze(-1).masked_fill(targets == -100, 0.0)
    return {ret}
'''
RIGHT_LOGPS = {"targets": "labels", "ret": "picked.sum(-1)"}
DPO = '''
def dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta):
    chosen = beta * ({chosen})
    rejected = beta * ({rejected})
    loss = {loss}
    return loss, chosen.detach(), rejected.detach()
'''
RIGHT_DPO = {"chosen": "policy_chosen - ref_chosen", "rejected": "policy_rejected - ref_rejected",
             "loss": "-F.logsigmoid(chosen - rejected).mean()"}
STEP = '''
def dpo_step(policy, reference, optimizer, batch, beta):
    ids, attention_mask, labels = batch
    policy_chosen, policy_rejected = sequence_logprobs(policy, ids, attention_mask, labels).chunk(2)
    {no_grad}
        ref_chosen, ref_rejected = sequence_logprobs(reference, ids, attention_mask, labels).chunk(2)
    loss, _, _ = dpo_loss(policy_chosen, policy_rejected, ref_chosen, ref_rejected, beta)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss
'''
ADAPTERS = '''
@contextlib.contextmanager
def adapters_disabled(model):
    layers = [m for m in model.modules() if isinstance(m, LoRALinear)]
    for layer in layers:
        layer.enabled = False
    {body}
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
    # right for small margins (and at the first step, where every margin is 0); inf once sigmoid rounds to 0
    "dpo-log-of-sigmoid": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "loss": "-torch.log(torch.sigmoid(chosen - rejected)).mean()"})},
        {"test_dpo_loss_large", "test_dpo_loss_hidden"}),
    # a step from policy == reference has margins of 0, where its gradient is the right one: dpo_step passes
    "dpo-beta-outside": ({"dpo_loss": DPO.format(**RIGHT_DPO | {
        "loss": "-beta * F.logsigmoid(chosen / beta - rejected / beta).mean()"})}, DPO_TESTS),
    "step-reference-gets-gradients": ({"dpo_step": STEP.format(no_grad="if True:")}, STEP_TESTS),
    "adapters-never-restored": ({"adapters_disabled": ADAPTERS.format(body="yield model")}, ADAPTER_TESTS),
    "adapters-not-restored-after-an-error": ({"adapters_disabled": ADAPTERS.format(
        body="yield model\n    for layer in layers:\n        layer.enabled = True")}, ADAPTER_TESTS),
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
