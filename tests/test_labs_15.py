"""Lab 15 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake of GRPO loses exactly the points of the tests it should fail; in-process, each mistake's message names it."""

from __future__ import annotations

from pathlib import Path

from lab_roundtrip import BlindStudents, NamedMistakes, RoundTrip, Validation

LAB = "15_reinforcement_learning_with_verifiable_rewards"
ADVANTAGES = '''
def group_advantages(rewards, group_size):
    groups = rewards.view({view})
    advantages = groups - groups.mean(dim=1, keepdim=True)
    if {guard}:
        advantages = advantages / ({std} + {eps})
    return {sign}advantages.reshape(-1)
'''
RIGHT_ADVANTAGES = {"view": "-1, group_size", "guard": "group_size > 1", "std": "groups.std(dim=1, keepdim=True)",
                    "eps": "1e-4", "sign": ""}
KL = '''
def kl_k3(logprobs, ref_logprobs):
    r = {r}
    return {estimate}
'''
RIGHT_KL = {"r": "ref_logprobs - logprobs", "estimate": "torch.exp(r) - r - 1"}
LOSS = '''
def grpo_loss(logprobs, old_logprobs, ref_logprobs, advantages, mask, clip_eps, beta):
    ratio = torch.exp(logprobs - {old})
    adv = advantages[:, None]
    surrogate = {bound}(ratio * adv, {clipped})
    per_token = -surrogate {kl_sign} beta * kl_k3(logprobs, {kl_to})
    return {reduce}
'''
RIGHT_LOSS = {"old": "old_logprobs.detach()", "bound": "torch.min",
              "clipped": "torch.clamp(ratio, 1 - clip_eps, 1 + clip_eps) * adv", "kl_sign": "+",
              "kl_to": "ref_logprobs", "reduce": "((per_token * mask).sum(-1) / mask.sum(-1)).mean()"}
STEP = '''
def grpo_step(policy, reference, optimizer, batch, clip_eps, beta):
    ids, attention_mask, completion_mask, old_logprobs, advantages = batch

    def token_logprobs(model):
        logits = {forward}
        return F.log_softmax({scores}, dim=-1).gather(-1, ids[:, 1:, None]).squeeze(-1)

    logprobs = token_logprobs(policy)
    {reference}
    loss = grpo_loss(logprobs, {old}, ref_logprobs, advantages, completion_mask, clip_eps, beta)
    {update}
    return loss
'''
RIGHT_STEP = {"forward": "model(ids, attention_mask=attention_mask)", "scores": "logits[:, :-1]",
              "reference": "with torch.no_grad():\n        ref_logprobs = token_logprobs(reference)",
              "old": "old_logprobs", "update": "optimizer.zero_grad()\n    loss.backward()\n    optimizer.step()"}


def advantages(**changes: str) -> dict[str, str]:
    return {"group_advantages": ADVANTAGES.format(**RIGHT_ADVANTAGES | changes)}


def kl(**changes: str) -> dict[str, str]:
    return {"kl_k3": KL.format(**RIGHT_KL | changes)}


def loss(**changes: str) -> dict[str, str]:
    return {"grpo_loss": LOSS.format(**RIGHT_LOSS | changes)}


def step(**changes: str) -> dict[str, str]:
    return {"grpo_step": STEP.format(**RIGHT_STEP | changes)}


ADV_TESTS = {"test_group_advantages", "test_group_advantages_hidden"}
ONE_TESTS = {"test_group_advantages_one", "test_group_advantages_hidden"}  # groups of one only
KL_TESTS = {"test_kl_k3", "test_kl_k3_hidden"}
LOSS_TESTS = {"test_grpo_loss", "test_grpo_loss_reference", "test_grpo_loss_hidden"}
STEP_TESTS = {"test_grpo_step", "test_grpo_step_hidden"}  # a step uses the student's grpo_loss and kl_k3
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    "adv-no-eps": (advantages(eps="0"), ADV_TESTS),
    "adv-population-std": (advantages(std="groups.std(dim=1, keepdim=True, unbiased=False)"), ADV_TESTS),
    "adv-batch-mean": (advantages(view="1, -1"), ADV_TESTS | ONE_TESTS),  # groups of one: the batch's std
    "adv-sign-flipped": (advantages(sign="-"), ADV_TESTS),
    "adv-groups-transposed": (advantages(view="group_size, -1"), ADV_TESTS | ONE_TESTS),
    # a group of one: std of one number is NaN; only the groups of one show it
    "adv-groups-of-one-divided": (advantages(guard="True"), ONE_TESTS),
    "kl-wrong-direction": (kl(r="logprobs - ref_logprobs"), KL_TESTS | LOSS_TESTS | STEP_TESTS),
    "kl-k1": (kl(estimate="-r"), KL_TESTS | LOSS_TESTS | STEP_TESTS),
    "kl-detached": (kl(estimate="(torch.exp(r) - r - 1).detach()"), KL_TESTS | LOSS_TESTS | STEP_TESTS),
    # the step's old log-probabilities carry no graph: only the loss's own cases catch it
    "loss-old-not-detached": (loss(old="old_logprobs"), LOSS_TESTS),
    "loss-clip-product": (loss(clipped="torch.clamp(ratio * adv, 1 - clip_eps, 1 + clip_eps)"),
                          LOSS_TESTS | STEP_TESTS),
    "loss-clip-upper-only": (loss(clipped="torch.clamp(ratio, max=1 + clip_eps) * adv"), LOSS_TESTS | STEP_TESTS),
    "loss-max-not-min": (loss(bound="torch.max"), LOSS_TESTS | STEP_TESTS),
    "loss-kl-subtracted": (loss(kl_sign="-"), LOSS_TESTS | STEP_TESTS),
    "loss-kl-to-old": (loss(kl_to="old_logprobs"), LOSS_TESTS | STEP_TESTS),
    "loss-padding-counted": (loss(reduce="per_token.mean()"), LOSS_TESTS | STEP_TESTS),
    "loss-tokens-of-the-batch": (loss(reduce="(per_token * mask).sum() / mask.sum()"), LOSS_TESTS | STEP_TESTS),
    "step-no-zero-grad": (step(update="loss.backward()\n    optimizer.step()"), STEP_TESTS),
    "step-reference-with-graph": (step(reference="ref_logprobs = token_logprobs(reference).detach()"), STEP_TESTS),
    "step-policy-as-reference": (step(reference="ref_logprobs = logprobs.detach()"), STEP_TESTS),
    "step-not-shifted": (step(scores="logits[:, 1:]"), STEP_TESTS),
    "step-old-from-policy": (step(old="logprobs.detach()"), STEP_TESTS),
    "step-no-mask": (step(forward="model(ids)"), STEP_TESTS),
    # a reference imported costs its own piece and the pieces built on it (the loss calls kl_k3, the step the loss)
    "adv-imports-reference": ({"group_advantages": "from gptcourse import group_advantages\n"}, ADV_TESTS | ONE_TESTS),
    "kl-imports-reference": ({"kl_k3": "from gptcourse import kl_k3\n"}, KL_TESTS | LOSS_TESTS | STEP_TESTS),
    "step-imports-reference": ({"grpo_step": "import gptcourse\n\ngrpo_step = gptcourse.grpo_step\n"}, STEP_TESTS),
}

# Written blind to the tests (/work/notes/blind/lab15_blind.cells, by a reader who saw only the student notebook and
# the lesson), as written: student -> the test cells it fails, each case of each cell run in-process
# (`check_blind_student`) and each cell by nbgrader (the round trip). Before this table adv-no-group-of-one-guard
# passed every visible case (no visible group of one); the messages for adv-interleaved-groups,
# adv-nan-to-num-instead-of-eps, loss-padding-counted, step-unshifted-targets and step-attention-mask-as-loss-mask
# named nothing, and loss-ratio-detached was told its old log-probabilities were not detached (its gradient and the
# undetached one agree while the old log-probabilities carry a graph: the loss is now also run without one).
# k3-missing-minus-one passes the step's cells: a constant -1 per token moves no gradient, so the step is right.
# step-calls-package imports gptcourse.grpo_step, which only the step forbids: the scan zeroes the step's cells alone.
BLIND_FILE = Path(__file__).with_name("lab15_blind.cells")
BLIND_FAILS = {
    **dict.fromkeys(("adv-std-without-epsilon", "adv-batch-mean-not-group", "adv-population-std",
                     "adv-interleaved-groups", "adv-dr-grpo-no-std", "adv-nan-to-num-instead-of-eps"), ADV_TESTS),
    "adv-no-group-of-one-guard": ONE_TESTS,
    **dict.fromkeys(("k3-reversed-ratio", "k3-k1-estimator", "k3-no-gradient"), KL_TESTS | LOSS_TESTS | STEP_TESTS),
    "k3-missing-minus-one": KL_TESTS | LOSS_TESTS,
    "loss-old-not-detached": LOSS_TESTS,  # the step's old log-probabilities carry no graph
    **dict.fromkeys(("loss-token-level-mean", "loss-padding-counted", "loss-clip-the-product", "loss-max-not-min",
                     "loss-kl-subtracted", "loss-ratio-without-exp", "loss-one-sided-clip", "loss-ratio-detached"),
                    LOSS_TESTS | STEP_TESTS),
    **dict.fromkeys(("step-reference-from-policy", "step-no-zero-grad", "step-reference-with-grad",
                     "step-no-attention-mask", "step-unshifted-targets", "step-attention-mask-as-loss-mask",
                     "step-old-from-current", "step-zero-grad-after-backward"), STEP_TESTS),
    "step-calls-package": STEP_TESTS,
    # the second blind reading (the students after the reader's line in the file)
    **dict.fromkeys(("adv-sign-flipped", "adv-group-mean-batch-std"), ADV_TESTS),
    "k3-k2-estimator": KL_TESTS | LOSS_TESTS | STEP_TESTS,
    **dict.fromkeys(("loss-ratio-inverted", "loss-clip-the-advantage", "loss-advantage-out-of-min",
                     "loss-padded-length-mean", "loss-kl-unmasked", "loss-sum-over-answers"), LOSS_TESTS | STEP_TESTS),
    **dict.fromkeys(("step-logits-shifted-wrong", "step-log-softmax-over-time", "step-raw-logits"), STEP_TESTS),
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "15.group_advantages.visible": {
        "adv-no-eps": "have all rewards equal, so their std is 0",
        "adv-population-std": "the standard deviation is the population one",
        "adv-batch-mean": "over the whole batch, not over each group",
        "adv-sign-flipped": "the sign is flipped",
        "adv-groups-transposed": "the groups were read as rewards.view(group_size, -1)",
        "adv-imports-reference": "is gptcourse.group_advantages, the reference",
        "adv-interleaved-groups": "the groups were taken as interleaved",
        "adv-nan-to-num-instead-of-eps": "eps is missing from the denominator",
        "adv-group-mean-batch-std": "the std is the whole batch's",
    },
    "15.group_advantages.one": {
        "adv-groups-of-one-divided": "for groups of one",
        "adv-no-group-of-one-guard": "for groups of one",
    },
    "15.kl_k3.visible": {
        "kl-wrong-direction": "the log-ratio is the wrong way round",
        "kl-k1": "this is k1",
        "kl-detached": "the KL estimates do not require grad",
        "kl-imports-reference": "is gptcourse.kl_k3, the reference",
    },
    "15.grpo_loss.visible": {
        "loss-old-not-detached": "the old log-probabilities were not detached",
        "loss-clip-product": "the clip is applied to ratio * advantage",
        "loss-clip-upper-only": "only the upper side is clipped",
        "loss-max-not-min": "max where PPO takes min",
        "loss-padding-counted": "the padding positions are counted",
        "loss-tokens-of-the-batch": "the tokens of the whole batch are averaged together",
        # the blind student loss-padding-counted, under the name the round trip grades it by (WRONG has one of its name)
        "blind-loss-padding-counted": "the padding positions are counted",
        "loss-ratio-detached": "the whole ratio was detached",
        "loss-clip-the-advantage": "the advantage was clipped, not the ratio",
        "loss-advantage-out-of-min": "the advantage was taken out of the min",
        "loss-kl-unmasked": "Mask each token's whole loss, the surrogate and the KL penalty",
        "loss-sum-over-answers": "the answers' losses were summed, not averaged",
    },
    "15.grpo_loss.reference": {
        "loss-kl-subtracted": "the KL penalty is subtracted",
        "loss-kl-to-old": "the KL is measured to the old log-probabilities",
    },
    "15.grpo_step.visible": {
        "step-no-zero-grad": "the gradients left in .grad by the last step were added to",
        "step-reference-with-graph": "the reference's forward pass built a graph",
        "step-policy-as-reference": "the reference model was never run",
        "step-not-shifted": "each token was scored with the logits at its own position",
        "step-old-from-policy": "the batch's old log-probabilities were not used",
        "step-no-mask": "had no attention mask",
        "step-imports-reference": "is gptcourse.grpo_step, the reference",
        "step-unshifted-targets": "the targets are not shifted",
        "step-attention-mask-as-loss-mask": "the prompt's tokens are counted in the loss",
        "step-log-softmax-over-time": "the log_softmax ran over the positions (dim=1)",
        "step-raw-logits": "the raw logits were gathered as log-probabilities",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 19, Validation("loss-clip-upper-only", 3, "15.grpo_loss.visible", "only the upper side is clipped")


class TestLab15(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 15's round trip and in-process checks, from the tables above."""
