"""Lab 02 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

import pytest
from lab_roundtrip import RoundTrip, Validation, check_named_mistake
from reference_routes import copied_references

LAB = "02_causal_attention"
ATTENTION = '''
def attention(q, k, v):
    T = q.size(-2)
    scores = q @ k.transpose(-2, -1) / {scale}
    scores = scores.masked_fill(~{mask}, float("-inf"))
    weights = scores.softmax(dim={dim})
    return weights @ v, weights
'''
RIGHT = {"scale": "math.sqrt(q.size(-1))", "mask": "causal_mask(T)", "dim": -1}
MASK_WITHOUT_DIAGONAL = "def causal_mask(T):\n    return torch.ones(T, T, dtype=torch.bool).tril(diagonal=-1)\n"
ATTENTION_TESTS = {"test_attention", "test_attention_hidden", "test_AttentionHead", "test_AttentionHead_hidden"}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    # normalising over the queries mixes in later queries: the causal probe catches that leak too
    "softmax-wrong-axis": ({"attention": ATTENTION.format(**RIGHT | {"dim": -2})},
                           ATTENTION_TESTS | {"test_attention_causal"}),
    "mask-wrong-triangle": ({"attention": ATTENTION.format(**RIGHT | {"mask": "torch.ones(T, T).bool().triu()"})},
                            ATTENTION_TESTS | {"test_attention_causal"}),
    "no-scaling": ({"attention": ATTENTION.format(**RIGHT | {"scale": "1"})}, ATTENTION_TESTS),
    # the first query keeps no key: its softmax is NaN, in the mask's tests and in everything that uses the mask
    "mask-diagonal-masked": ({"causal_mask": MASK_WITHOUT_DIAGONAL},
                             ATTENTION_TESTS | {"test_causal_mask", "test_causal_mask_hidden"}),
    "no-value-projection": ({"AttentionHead": '''
class AttentionHead(nn.Module):
    def __init__(self, d_model, d_head):
        super().__init__()
        self.query = nn.Linear(d_model, d_head)
        self.key = nn.Linear(d_model, d_head)
        self.value = nn.Linear(d_model, d_head)

    def forward(self, x):
        return attention(self.query(x), self.key(x), x)
'''}, {"test_AttentionHead", "test_AttentionHead_hidden"}),
    **copied_references(LAB),  # the reference copied by routes the scan does not follow
}

# (a case the mistake fails, what its message says)
SAYS = [("02.causal_mask.visible", "the diagonal is masked: every position must see itself"),
        ("02.attention.visible", "row (0, 0) is NaN. A softmax over scores that are all -inf")]


@pytest.mark.parametrize(("case", "says"), SAYS)
def test_a_mask_without_its_diagonal_is_named(case, says):
    check_named_mistake(LAB, WRONG["mask-diagonal-masked"][0], case, says)


class TestLab02(RoundTrip):
    LAB = LAB
    WRONG = WRONG
    TOTAL = 15
    VALIDATE = Validation('softmax-wrong-axis', 3, (
        'check("02.attention.visible", attention)',
        "softmax over the wrong axis",
    ))

    def test_test_cells_show_the_graders_verdict_only(self, course, scores):
        """The grader re-judged each test cell outside the kernel (gptcourse.grading.judge) and rewrote its outputs:
        one line per passing test, or a single CheckFailed holding only the diagnostics."""
        for student, by_cell in scores.items():
            nb = course.notebook(f"grading/autograded/{student}", LAB)
            for cell in nb.cells:
                grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
                if grade_id not in by_cell:
                    continue
                calls = cell.source.count("check(")
                if by_cell[grade_id] > 0:
                    assert [out.output_type for out in cell.outputs] == ["stream"], (student, grade_id)
                    assert cell.outputs[0].text.count(" passed: ") == calls, (student, grade_id)
                else:
                    [error] = cell.outputs
                    assert error.ename == "CheckFailed" and len(error.traceback) == 1, (student, grade_id)
                    assert "check(" not in error.traceback[0] and "Traceback" not in error.traceback[0]
