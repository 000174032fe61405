"""Lab 07 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_roundtrip import (
    BlindStudents,
    NamedMistakes,
    RoundTrip,
    Validation,
    blind_students,
    failures,
)

LAB = "07_training_and_generation"
STEP = '''
def train_step(model, optimizer, tokens, grad_clip):
    {zero}
    loss = next_token_loss(model, tokens)
    loss.backward()
    {clip}
    optimizer.step()
    return loss.item()
'''
RIGHT_STEP = {"zero": "optimizer.zero_grad()", "clip": "torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)"}
PROBS = '''
def next_token_probs(logits, temperature=1.0, top_k=None):
    {scale}
    if top_k is not None:
        kth = torch.topk(logits, top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits {keep} kth, float("-inf"))
    return {softmax}
'''
RIGHT_PROBS = {"scale": "logits = logits / temperature", "keep": "<", "softmax": "logits.softmax(dim=-1)"}
SAMPLE = '''
def sample_next_token(model, idx, temperature=1.0, top_k=None, generator=None):
    logits = model(idx[:, -model.config.context_length:])[:, {position}]
    if temperature == 0:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(next_token_probs(logits, temperature, top_k), 1, generator=generator)
'''
STEP_TESTS = {"test_train_step", "test_train_step_twice", "test_train_step_hidden"}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # train_step uses the loss, so the steps go wrong too
    "targets-not-shifted": ({"next_token_loss": "def next_token_loss(model, tokens):\n    x = tokens[:, :-1]\n"
                                     "    return F.cross_entropy(model(x).flatten(0, 1), x.flatten())"},
                            {"test_next_token_loss", "test_next_token_loss_hidden"} | STEP_TESTS),
    # the shifted pair shifted once more, next-next-token prediction (huggingface/transformers#37830)
    "targets-shifted-twice": ({"next_token_loss": "def next_token_loss(model, tokens):\n    x, y = tokens[:, :-1], "
                                       "tokens[:, 1:]\n    return F.cross_entropy(model(x)[:, :-1].flatten(0, 1), "
                                       "y[:, 1:].flatten())"},
                              {"test_next_token_loss", "test_next_token_loss_hidden"} | STEP_TESTS),
    # a single step from fresh gradients is right; the second adds the first step's gradients
    "no-zero-grad": ({"train_step": STEP.format(**RIGHT_STEP | {"zero": "pass"})},
                     {"test_train_step_twice", "test_train_step_hidden"}),
    "no-clip": ({"train_step": STEP.format(**RIGHT_STEP | {"clip": "pass"})}, STEP_TESTS),
    # multinomial renormalises, so the draws follow temperature 1: a few draws may agree by chance, 64 at
    # temperature 1.5 do not (the visible case's draws, from its id's seed, happen to differ too)
    "temperature-after-softmax": ({"next_token_probs": PROBS.format(**RIGHT_PROBS | {
        "scale": "pass", "softmax": "logits.softmax(dim=-1) / temperature"})},
        {"test_next_token_probs", "test_next_token_probs_top_k", "test_next_token_probs_hidden",
         "test_sample_next_token", "test_sample_next_token_hidden"}),
    # sample_next_token uses next_token_probs: the visible case (top_k=5) draws from k - 1 tokens
    "top-k-keeps-k-minus-1": ({"next_token_probs": PROBS.format(**RIGHT_PROBS | {"keep": "<="})},
                              {"test_next_token_probs_top_k", "test_next_token_probs_hidden",
                               "test_sample_next_token"}),
    # torch.multinomial without generator=: draws from the global random state, right or wrong by chance
    "sample-without-generator": ({"sample_next_token": SAMPLE.format(position=-1).replace(", generator=generator)",
                                                                                         ")")},
                                 {"test_sample_next_token", "test_sample_next_token_hidden"}),
    # the whole idx fed: the model refuses more than context_length tokens
    "sample-without-crop": ({"sample_next_token": SAMPLE.format(position=-1).replace(
        "idx[:, -model.config.context_length:]", "idx")},
        {"test_sample_next_token_greedy", "test_sample_next_token_hidden"}),
    "first-position": ({"sample_next_token": SAMPLE.format(position=0)},
                       {"test_sample_next_token_greedy", "test_sample_next_token", "test_sample_next_token_hidden"}),
    # softmax(logits / temperature**2) (RL-Align/RL-Kernel#81); this student's visible draws agree by chance
    "temperature-twice": ({"next_token_probs": PROBS.format(**RIGHT_PROBS | {
        "scale": "logits = logits / temperature / temperature"})},
        {"test_next_token_probs", "test_next_token_probs_top_k", "test_next_token_probs_hidden",
         "test_sample_next_token_hidden"}),
    # a right sampler whose cell checks the student's next_token_probs against the course's filter_logits (a stub in
    # the graded kernel: the check raises after the def): the scan sees gptcourse.filter_logits, next_token_probs'
    # reference, which sample_next_token does not forbid (the filter is not its point), so only the probabilities'
    # cells are lost
    "sample-cell-checks-probs-against-the-course": (
        {"sample_next_token": SAMPLE.format(position=-1) + "\n\nimport gptcourse\n\n_z = torch.randn(2, 9)\n"
                              "assert torch.allclose(next_token_probs(_z, 1.0, 3), "
                              "gptcourse.filter_logits(_z, top_k=3).softmax(dim=-1))\n"},
        {"test_next_token_probs", "test_next_token_probs_top_k", "test_next_token_probs_hidden"}),
    # the sampler calls the course's filter_logits in place of the student's next_token_probs: the scan zeroes
    # next_token_probs alone, as above, but the graded kernel has no filter_logits (every reference the lab forbids
    # is a stub there), so each sampling cell that reaches it fails with its error; greedy returns before it
    "sample-calls-the-course-filter": (
        {"sample_next_token": "import gptcourse\n" + SAMPLE.format(position=-1).replace(
            "next_token_probs(logits, temperature, top_k)",
            "gptcourse.filter_logits(logits / temperature, top_k=top_k).softmax(dim=-1)")},
        {"test_next_token_probs", "test_next_token_probs_top_k", "test_next_token_probs_hidden",
         "test_sample_next_token", "test_sample_next_token_hidden"}),
    # lesson 16's router keeps the top k of each row and takes their softmax (it passed every cell before
    # next_token_probs forbade it); a stub in the graded kernel, so the sampler fails where it cuts to the top k
    "probs-from-the-moe-router": ({"next_token_probs": '''
from gptcourse import top_k_routing

def next_token_probs(logits, temperature=1.0, top_k=None):
    logits = logits / temperature
    if top_k is None:
        return logits.softmax(dim=-1)
    weights, chosen = top_k_routing(logits, top_k, "topk_then_softmax")  # (B, k) each: the k best, renormalised
    return torch.zeros_like(logits).scatter(-1, chosen, weights.to(logits.dtype))
'''}, {"test_next_token_probs", "test_next_token_probs_top_k", "test_next_token_probs_hidden",
          "test_sample_next_token", "test_sample_next_token_hidden"}),
    # lesson 11's fine-tuning loss does the shift for the student (it passed every cell before the loss forbade it);
    # train_step calls this loss, which is a stub in the graded kernel, so the steps fail too
    "loss-from-the-finetuning-loss": (
        {"next_token_loss": "def next_token_loss(model, tokens):\n    from gptcourse import masked_lm_loss\n"
                            "    logits = model(tokens[:, :-1])\n"
                            "    return masked_lm_loss(torch.cat([logits, logits[:, -1:]], 1), tokens)"},
        {"test_next_token_loss", "test_next_token_loss_hidden"} | STEP_TESTS),
}
LOSS_TESTS = {"test_next_token_loss", "test_next_token_loss_hidden"}
PROBS_TESTS = {"test_next_token_probs", "test_next_token_probs_top_k", "test_next_token_probs_hidden"}
TOP_K_TESTS = {"test_next_token_probs_top_k", "test_next_token_probs_hidden"}
SAMPLE_TESTS = {"test_sample_next_token_greedy", "test_sample_next_token", "test_sample_next_token_hidden"}
# Written blind to the tests (issue 42), as written, graded in-process (check_blind_student) and by nbgrader (the
# round trip): student -> the test cells
# it must fail (train_step and sample_next_token call the student's loss and probabilities). Before the
# fix sample-greedy-by-tiny-temperature passed every cell (a draw at temperature 1e-6 is the argmax, but it moves
# the generator), and loss-transposed-targets, step-clip-value, step-loss-after-update,
# probs-temperature-after-softmax and probs-topk-batch-threshold got only "largest error ... at index ...".
# uses-reference-filter calls gptcourse.filter_logits, next_token_probs' reference, and gptcourse.generate,
# sample_next_token's: the grader's scan zeroes both pieces.
BLIND_FILE = Path(__file__).with_name("lab07_blind.cells")
BLIND_FAILS = {
    **dict.fromkeys(("loss-no-shift", "loss-double-softmax", "loss-sum", "loss-transposed-targets"),
                    LOSS_TESTS | STEP_TESTS),
    "step-no-zero-grad": STEP_TESTS - {"test_train_step"},
    **dict.fromkeys(("step-clip-after-update", "step-clip-value", "step-zero-grad-before-step",
                     "step-loss-after-update"), STEP_TESTS),
    # multinomial renormalises: p ** (1 / temperature) draws as softmax(logits / temperature) does
    "probs-temperature-after-softmax": PROBS_TESTS,
    "probs-temperature-multiplies": PROBS_TESTS | SAMPLE_TESTS - {"test_sample_next_token_greedy"},
    "probs-topk-strict": TOP_K_TESTS | {"test_sample_next_token"},
    **dict.fromkeys(("probs-topk-batch-threshold", "probs-topk-zero-probs"), TOP_K_TESTS),
    "sample-first-position": SAMPLE_TESTS,
    **dict.fromkeys(("sample-no-generator", "sample-categorical"), SAMPLE_TESTS - {"test_sample_next_token_greedy"}),
    "sample-no-crop": {"test_sample_next_token_greedy", "test_sample_next_token_hidden"},
    "sample-greedy-by-tiny-temperature": {"test_sample_next_token_greedy"},
    "uses-reference-filter": PROBS_TESTS | SAMPLE_TESTS,
}


@pytest.mark.parametrize("student", ["loss-no-shift", "loss-double-softmax", "loss-sum", "loss-transposed-targets"])
def test_a_wrong_next_token_loss_is_named_where_train_step_uses_it(student):
    """A train_step built on the student's wrong next_token_loss fails; its message names next_token_loss with
    the value it gives against the mean cross-entropy (the judge's own lm_loss), not only a diff of parameters."""
    steps = failures(LAB, blind_students(BLIND_FILE)[student])
    messages = {case: message for cell in STEP_TESTS for case, message in steps.get(cell, {}).items()}
    assert messages and all("your next_token_loss gives " in message and "fix next_token_loss first" in message
                            for message in messages.values()), messages


def test_a_right_next_token_loss_is_not_blamed_for_a_wrong_train_step():
    failed = failures(LAB, blind_students(BLIND_FILE)["step-no-zero-grad"])
    assert failed and not [m for by_case in failed.values() for m in by_case.values() if "next_token_loss" in m]


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "07.sample_next_token.visible": {
        "sample-without-generator": "the generator was not used",
    },
    "07.sample_next_token.greedy": {
        "sample-without-crop": "sequence length 11 exceeds context_length=8",
    },
    "07.next_token_probs.visible": {
        "temperature-twice": "the temperature is applied twice",
    },
    "07.next_token_loss.visible": {
        "targets-shifted-twice": "the targets are shifted twice",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 24, Validation("no-zero-grad", 1, "07.train_step.twice",
                                 "the gradients accumulate from one step to the next")


class TestLab07(RoundTrip, NamedMistakes, BlindStudents):
    @pytest.mark.slow
    def test_a_graded_train_step_names_the_wrong_loss_it_builds_on(self, course, scores):
        """In the graded kernel (the package view of lab 07), train_step's case finds the student's own
        next_token_loss: the grader's message names it."""
        [error] = self.autograded_cell(course, "targets-not-shifted", "test_train_step").outputs
        assert "your next_token_loss gives " in error.evalue and "fix next_token_loss first" in error.evalue, \
            error.evalue
