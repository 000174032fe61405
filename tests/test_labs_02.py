"""Lab 02 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_roundtrip import (
    BlindStudents,
    RoundTrip,
    Validation,
    blind_students,
    check_named_mistake,
    failures,
)
from reference_routes import copied_references

from gptcourse.grading.cases import CaseId
from gptcourse.grading.classroom import class_report

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
    # lesson 12's flash_attention gives the weights too, through the identity as its values (q scaled for the padding)
    "attention-by-flash-attention": ({"attention": '''
import torch.nn.functional as F
from gptcourse import flash_attention

def attention(q, k, v):
    T, D = q.shape[-2:]
    W = max(T, D)
    flat = lambda x: F.pad(x.reshape(-1, 1, *x.shape[-2:]), (0, W - x.size(-1)))  # (N, 1, T, W)
    eye = torch.eye(T, dtype=q.dtype).expand(*q.shape[:-2], T, T)
    weights = flash_attention(flat(q) * math.sqrt(W / D), flat(k), flat(eye))[..., :T].reshape(*q.shape[:-1], T)
    return weights @ v, weights
'''}, ATTENTION_TESTS | {"test_attention_causal", "test_causal_mask", "test_causal_mask_hidden"}),
    # the tiled attention's own tile mask, for one tile of the whole square (None when nothing is masked, at T = 1)
    "mask-by-tiled-attention": ({"causal_mask": '''
from gptcourse.model.tiled_attention import _allowed

def causal_mask(T):
    mask = _allowed((0, T, 0, T), 0, True, None, None, "cpu")
    return torch.ones(T, T, dtype=torch.bool) if mask is None else mask
'''}, ATTENTION_TESTS | {"test_attention_causal", "test_causal_mask", "test_causal_mask_hidden"}),
    **copied_references(LAB),  # the reference copied by routes the scan does not follow
}

# (a case the mistake fails, what its message says)
DIAGONAL_SAYS = [("02.causal_mask.visible", "the diagonal is masked: every position must see itself"),
                 ("02.attention.visible", "row (0, 0) is NaN. A softmax over scores that are all -inf")]


@pytest.mark.parametrize(("case", "says"), DIAGONAL_SAYS)
def test_a_mask_without_its_diagonal_is_named(case, says):
    check_named_mistake(LAB, WRONG["mask-diagonal-masked"][0], case, says)


# Written blind to the tests (issue 42), as written: student -> the test cells it fails, each case of each cell run
# in-process (`check_blind_student`) and each cell by nbgrader (the round trip). A wrong mask fails the attention
# and the head that use it too. Before issue 42 att-transpose-1-2 got a raw shape error on (B, H, T, D) inputs, and
# no message named head-query-key-swapped or head-scale-by-d-model. att-calls-gptcourse and att-sdpa-output use what
# the lab forbids: the grader's scan of the cells zeroes their piece (`forbidden.find_forbidden`) and the head, which
# calls it.
BLIND_FILE = Path(__file__).with_name("lab02_blind.cells")
MASK_TESTS = {"test_causal_mask", "test_causal_mask_hidden"}
HEAD_TESTS = {"test_AttentionHead", "test_AttentionHead_hidden"}
BLIND_FAILS = {
    **dict.fromkeys(("mask-upper-triangle", "mask-float-ones", "mask-true-means-blocked"),
                    MASK_TESTS | ATTENTION_TESTS | {"test_attention_causal"}),
    "mask-excludes-diagonal": MASK_TESTS | ATTENTION_TESTS,
    **dict.fromkeys(("att-no-scale", "att-scale-by-D"), ATTENTION_TESTS),
    **dict.fromkeys(("att-softmax-over-queries", "att-mask-after-softmax", "att-mask-fills-zero", "att-returns-scores"),
                    ATTENTION_TESTS | {"test_attention_causal"}),
    "att-transpose-1-2": {"test_attention_hidden"},  # right on (B, T, D); only the hidden case is (B, H, T, D)
    **dict.fromkeys(("head-no-bias", "head-query-key-swapped", "head-scale-by-d-model", "head-fused-qkv",
                     "head-subclass-gptcourse"), HEAD_TESTS),
    **dict.fromkeys(("att-calls-gptcourse", "att-sdpa-output"), ATTENTION_TESTS | {"test_attention_causal"}),
    "att-sdpa-math-kernel": ATTENTION_TESTS | {"test_attention_causal"},  # the kernel behind F.sdpa: banned
}
# In the graded kernel gptcourse.causal_mask raises ("not available while lab 02 is graded": the package view), so
# attention and the head, which call the student's mask, fail too; in-process, where the whole package imports,
# they pass: this student is graded by nbgrader alone.
NBGRADER_ONLY = {"mask-calls-gptcourse": MASK_TESTS | ATTENTION_TESTS | {"test_attention_causal"}}


# The class report (`gptcourse report`, grading/classroom/class_report.py) of the round trip's class: each named
# mistake's key (`checks.Mistake`) and the students planted with it, by what their answers do (a student counts
# once per piece, for the first mistake named in it). A mask without its diagonal leaves query 0 no key: attention
# and the head, which use the student's mask, get a NaN row (`softmax.empty_row`); so does a mask whose True means
# blocked (~tril: no diagonal either)
ATTENTION_USERS = ("mask-diagonal-masked", "blind-mask-excludes-diagonal")
PLANTED_MISTAKES = {
    "attention.unscaled": {"no-scaling", "blind-att-no-scale", "forged-verdicts"},
    "attention.scaled_by_d": {"blind-att-scale-by-d"},
    "attention.scaled_by_c": {"blind-head-scale-by-d-model"},
    "attention.softmax_dim": {"softmax-wrong-axis", "blind-att-softmax-over-queries"},
    "attention.mask_after": {"blind-att-mask-after-softmax"},
    "attention.swapped": {"blind-head-query-key-swapped"},
    "02.no_value_projection": {"no-value-projection"},
    "mask.wrong_triangle": {"mask-wrong-triangle", "blind-mask-upper-triangle"},
    "mask.diagonal_masked": set(ATTENTION_USERS),
    "mask.inverted": {"blind-mask-true-means-blocked"},
    "softmax.empty_row": {*ATTENTION_USERS, "blind-mask-true-means-blocked"},
}
# passed every visible case of the piece, failed a hidden one: a transpose that only 4-d inputs show
VISIBLE_NOT_HIDDEN = {"causal_mask": set(), "attention": {"blind-att-transpose-1-2"}, "AttentionHead": set()}
FORGER = "forged-verdicts"


def forged(nb):
    """`nb` with verdict records of the student's own in every cell's metadata and a report of their own: full
    marks, and a mistake no one made."""
    record = {"lab": "02", "piece": "attention", "case": "02.attention.visible", "hidden": False, "passed": True,
              "outcome": "passed", "mistake": "02.forged", "points": 100.0, "max_points": 100.0, "message": "<b>"}
    for cell in nb.cells:
        cell.metadata["gptcourse"] = {"verdicts": [record, record | {"passed": False}]}
    nb.metadata["gptcourse"] = {"report": ["<script>forged</script>"]}
    return nb


# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 15, Validation("softmax-wrong-axis", 3, "02.attention.visible", "softmax over the wrong axis")


class TestLab02(RoundTrip, BlindStudents):
    @pytest.fixture(scope="class")
    @classmethod
    def scores(cls, course):
        """The round trip's class and one student more: no-scaling's answers in a notebook whose metadata holds
        verdict records of its own (`forged`)."""
        course.submit(FORGER, LAB, forged(course.solved(LAB, WRONG["no-scaling"][0])))
        return course.grade_class(cls.LAB, cls.graded())

    @pytest.mark.slow
    def test_class_report_counts_what_was_planted(self, course, scores):
        """`gptcourse report` on the autograded class: every score the gradebook's, each planted mistake with its
        students, the passed-visible-failed-hidden students, the histogram's bins; the forged records ignored."""
        report = class_report.build(course.root, LAB)
        graded = {sub.student: sub for sub in report.graded}
        assert {s: sub.score for s, sub in graded.items()} == {s: sum(cells.values()) for s, cells in scores.items()}
        assert {m.key: set(m.students) for m in report.mistakes()} == PLANTED_MISTAKES
        assert [len(m.students) for m in report.mistakes()] == sorted(map(len, PLANTED_MISTAKES.values()),
                                                                      reverse=True)
        assert {row.piece: set(row.visible_not_hidden) for row in report.pieces()} == VISIBLE_NOT_HIDDEN
        totals = [sum(cells.values()) for cells in scores.values()]
        assert report.histogram() == [(k, k + 1, sum(min(t, 14) == k for t in totals)) for k in range(15)]
        said = {(v.case, v.passed, v.outcome, v.mistake) for v in graded[FORGER].verdicts}
        assert said == {(v.case, v.passed, v.outcome, v.mistake) for v in graded["no-scaling"].verdicts}
        assert not graded[FORGER].lines and graded[FORGER].score == graded["no-scaling"].score < self.TOTAL

    @pytest.mark.slow
    def test_test_cells_show_the_graders_verdict_only(self, course, scores):
        """The grader re-judged each test cell outside the kernel (gptcourse.grading.steps.judge) and rewrote its
        outputs: one line per passing test, or a single CheckFailed holding only the diagnostics."""
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


def test_a_float_mask_is_named_in_the_pieces_that_use_it():
    """nanoGPT's float mask fails attention and the head with torch's TypeError (`~` of a float tensor); their
    messages say what the mask must be (`student.LIKELY_CAUSES`), not torch's words alone."""
    failed = failures(LAB, blind_students(BLIND_FILE)["mask-float-ones"])
    users = {case: message for by_case in failed.values() for case, message in by_case.items()
             if CaseId.parse(case).piece != "causal_mask"}
    assert {CaseId.parse(case).piece for case in users} == {"attention", "AttentionHead"}, failed
    unnamed = {case: message for case, message in users.items() if "a mask must be torch.bool" not in message}
    assert not unnamed, unnamed
