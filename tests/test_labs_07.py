"""Lab 07 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

import pytest

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
STEP_TESTS = {"test_step", "test_step_twice", "test_step_hidden"}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # train_step uses the loss, so the steps go wrong too
    "targets-not-shifted": ({"loss": "def next_token_loss(model, tokens):\n    x = tokens[:, :-1]\n"
                                     "    return F.cross_entropy(model(x).flatten(0, 1), x.flatten())"},
                            {"test_loss", "test_loss_hidden"} | STEP_TESTS),
    # a single step from fresh gradients is right; the second adds the first step's gradients
    "no-zero-grad": ({"step": STEP.format(**RIGHT_STEP | {"zero": "pass"})}, {"test_step_twice", "test_step_hidden"}),
    "no-clip": ({"step": STEP.format(**RIGHT_STEP | {"clip": "pass"})}, STEP_TESTS),
    # the sampled ids happen to agree (multinomial renormalises), the probabilities do not
    "temperature-after-softmax": ({"probs": PROBS.format(**RIGHT_PROBS | {
        "scale": "pass", "softmax": "logits.softmax(dim=-1) / temperature"})},
        {"test_probs", "test_probs_top_k", "test_probs_hidden"}),
    "top-k-keeps-k-minus-1": ({"probs": PROBS.format(**RIGHT_PROBS | {"keep": "<="})},
                              {"test_probs_top_k", "test_probs_hidden"}),
    "first-position": ({"sample": SAMPLE.format(position=0)},
                       {"test_sample_greedy", "test_sample", "test_sample_hidden"}),
}

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def scores(course):
    return course.grade_class(LAB, WRONG)


def test_solution_scores_full_marks(course, scores):
    assert scores["solution"] == course.expected_scores(LAB)


def test_untouched_release_scores_zero(course, scores):
    assert scores["untouched"] == course.expected_scores(LAB, set(course.expected_scores(LAB)))


@pytest.mark.parametrize("student", WRONG)
def test_each_mistake_loses_exactly_its_tests(course, scores, student):
    assert scores[student] == course.expected_scores(LAB, WRONG[student][1])


def test_validate_reports_success_and_the_failing_test(course):
    assert "Success! Your notebook passes all the tests." in course.validate("lab07-solved", course.solved(LAB))
    report = course.validate("lab07-no-zero-grad", course.solved(LAB, WRONG["no-zero-grad"][0]))
    assert "VALIDATION FAILED ON 1 CELL(S)" in report
    assert 'check("07.step.twice", train_step)' in report
    assert "the gradients accumulate from one step to the next" in report
