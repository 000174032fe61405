"""Lab 14 graded by real nbgrader: full marks for the solution, 0 for the untouched release, and each known
mistake loses exactly the points of the tests it should fail."""

from __future__ import annotations

from pathlib import Path

import pytest
from lab_roundtrip import (
    BlindStudents,
    NamedMistakes,
    RoundTrip,
    Validation,
    blind_names,
    blind_students,
    check_blind_student,
    solved_namespace,
)

from gptcourse.grading import check
from gptcourse.grading.cases import CaseId

LAB = "14_evaluating_language_models"
LOGLIKELIHOOD = '''
def loglikelihood(model, context, continuation):
    ids = torch.tensor([{fed}])
    logits = model(ids)[0, {rows}]
    target = torch.tensor({target})
    logprobs = F.log_softmax(logits, dim=-1).gather(-1, target[:, None])
    return float(logprobs.{reduce}()), {greedy}
'''
RIGHT_LL = {"fed": "context + continuation[:-1]", "rows": "-len(continuation):", "target": "continuation",
            "reduce": "sum", "greedy": "bool((logits.argmax(dim=-1) == target).all())"}
CHOICES = '''
def choice_scores(logprobs, choices, normalize):
    if normalize is None:
        return logprobs
    lengths = [{chars} if normalize == "chars" else {bytes} for choice in choices]
    return logprobs / torch.tensor(lengths, dtype=logprobs.dtype)
'''
RIGHT_CHOICES = {"chars": "len(choice)", "bytes": "len(choice.encode('utf-8'))"}
BOOTSTRAP = '''
def paired_bootstrap(a, b, resamples, seed):
    n = a.numel()
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(n, (resamples, n), generator=gen)
    differences = {differences}
    low, high = torch.quantile(differences, torch.tensor([{low}, {high}], dtype=differences.dtype))
    return float((a - b).mean()), float(low), float(high)
'''
RIGHT_BOOTSTRAP = {"differences": "(a[rows] - b[rows]).mean(dim=1)", "low": "0.025", "high": "0.975"}
OVERLAP = '''
def ngram_overlap(train_text, items, n):
    def grams(text):
        words = {split}
        return [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]

    seen = set(grams(train_text))
    overlap = []
    for item in items:
        mine = {mine}
        overlap.append({fraction} if mine else 0.0)
    return overlap
'''
RIGHT_OVERLAP = {"split": r're.findall(r"\w+", text.lower())', "mine": "grams(item)",
                 "fraction": "sum(g in seen for g in mine) / len(mine)"}
LL_TESTS = {"test_loglikelihood", "test_loglikelihood_greedy", "test_loglikelihood_hidden"}
CHOICE_TESTS = {"test_choice_scores", "test_choice_scores_bytes", "test_choice_scores_hidden"}
PASS_TESTS = {"test_pass_at_k", "test_pass_at_k_hidden"}
BOOT_TESTS = {"test_paired_bootstrap", "test_paired_bootstrap_hidden"}
OVERLAP_TESTS = {"test_ngram_overlap", "test_ngram_overlap_hidden"}
# Written blind to the tests (issue 44), as written: student -> the test cells it must fail. Before issue 44
# cs-chars-by-bytes, pb-sorted-index and ng-substring-shortcut passed every visible cell (the chars case was ASCII,
# the bootstrap's quantiles fell on tied differences, no item matched across a word boundary), and no message named
# ll-drops-first-token, ll-raw-logits, ll-greedy-any, cs-word-count, pak-product-off-by-one, pak-k-over-n-shortcut,
# ng-characters or ng-split-no-normalise.
BLIND_FILE = Path(__file__).with_name("lab14_blind.cells")
BLIND_FAILS = {
    **dict.fromkeys(("ll-full-input-last-rows", "ll-drops-first-token", "ll-sums-context-too", "ll-raw-logits",
                     "ll-mean-not-sum"), LL_TESTS),
    **dict.fromkeys(("ll-greedy-any", "ll-greedy-last-only"), LL_TESTS - {"test_loglikelihood_greedy"}),
    "cs-bytes-by-chars": CHOICE_TESTS - {"test_choice_scores"},
    **dict.fromkeys(("cs-chars-by-bytes", "cs-word-count"), CHOICE_TESTS - {"test_choice_scores_bytes"}),
    **dict.fromkeys(("cs-leading-space", "cs-multiplies"), CHOICE_TESTS),
    **dict.fromkeys(("pak-biased", "pak-product-off-by-one", "pak-comb-swapped", "pak-k-over-n-shortcut"),
                    PASS_TESTS),
    **dict.fromkeys(("pb-independent", "pb-90-percent", "pb-normal-shortcut", "pb-sorted-index"), BOOT_TESTS),
    **dict.fromkeys(("ng-characters", "ng-split-no-normalise", "ng-unique-grams", "ng-range-off-by-one",
                     "ng-substring-shortcut", "ng-flag-not-fraction"), OVERLAP_TESTS),
}
# student -> ({solution cell grade_id: what they wrote}, test cells it must fail)
WRONG = {
    "ll-counts-context": ({"loglikelihood": LOGLIKELIHOOD.format(**RIGHT_LL | {
        "rows": ":", "target": "(context + continuation)[1:]"})}, LL_TESTS),
    # the whole sequence fed and its last rows read: each token scored from its own position
    "ll-no-shift": ({"loglikelihood": LOGLIKELIHOOD.format(**RIGHT_LL | {"fed": "context + continuation"})}, LL_TESTS),
    "ll-mean": ({"loglikelihood": LOGLIKELIHOOD.format(**RIGHT_LL | {"reduce": "mean"})}, LL_TESTS),
    "ll-greedy-last-token": ({"loglikelihood": LOGLIKELIHOOD.format(**RIGHT_LL | {
        "greedy": "bool(logits[-1].argmax() == target[-1])"})}, {"test_loglikelihood", "test_loglikelihood_hidden"}),
    "choices-delimiter-counted": ({"choice_scores": CHOICES.format(chars="len(' ' + choice)",
                                                                   bytes="len((' ' + choice).encode('utf-8'))")},
                                  CHOICE_TESTS),
    "choices-bytes-as-chars": ({"choice_scores": CHOICES.format(**RIGHT_CHOICES | {"bytes": "len(choice)"})},
                               {"test_choice_scores_bytes", "test_choice_scores_hidden"}),
    "pass-with-replacement": ({"pass_at_k": "def pass_at_k(n, c, k):\n    return 1 - (1 - c / n) ** k"}, PASS_TESTS),
    "pass-c-over-n": ({"pass_at_k": "def pass_at_k(n, c, k):\n    return c / n"}, PASS_TESTS),
    "bootstrap-unpaired": ({"paired_bootstrap": BOOTSTRAP.format(**RIGHT_BOOTSTRAP | {
        "differences": "a[rows].mean(dim=1) - b[torch.randint(n, (resamples, n), generator=gen)].mean(dim=1)"})},
        BOOT_TESTS),
    "bootstrap-90-percent": ({"paired_bootstrap": BOOTSTRAP.format(**RIGHT_BOOTSTRAP | {"low": "0.05",
                                                                                       "high": "0.95"})},
                             BOOT_TESTS),
    "overlap-split-on-spaces": ({"ngram_overlap": OVERLAP.format(**RIGHT_OVERLAP | {"split": "text.lower().split()"})},
                                OVERLAP_TESTS),
    "overlap-item-grams-as-set": ({"ngram_overlap": OVERLAP.format(**RIGHT_OVERLAP | {"mine": "set(grams(item))"})},
                                  OVERLAP_TESTS),
    "overlap-any-gram": ({"ngram_overlap": OVERLAP.format(**RIGHT_OVERLAP | {
        "fraction": "float(any(g in seen for g in mine))"})}, OVERLAP_TESTS),
    # a reference imported costs its own piece alone
    "pass-imports-reference": ({"pass_at_k": "from gptcourse import pass_at_k\n"}, PASS_TESTS),
    "overlap-imports-reference": ({"ngram_overlap": "from gptcourse import ngram_overlap\n"}, OVERLAP_TESTS),
    # lesson 15's token_logprobs on context + continuation: its last len(continuation) entries are the answer
    "ll-by-token-logprobs": ({"loglikelihood": '''
from gptcourse.finetuning.grpo_training import token_logprobs

def loglikelihood(model, context, continuation):
    ids = torch.tensor([context + continuation])
    picked = token_logprobs(model, ids, torch.ones_like(ids))[0, -len(continuation):]
    logits = model(ids[:, :-1])[0, -len(continuation):]
    return float(picked.sum()), bool((logits.argmax(dim=-1) == torch.tensor(continuation)).all())
'''}, LL_TESTS),
}


# case -> {student (of WRONG, or blind): what the case's message says to it}
SAYS = {
    "14.loglikelihood.visible": {
        "ll-counts-context": "the context's tokens are counted too",
        "ll-no-shift": "each token was scored with the logits at its own position",
        "ll-mean": "the log-probabilities are averaged",
        "ll-greedy-last-token": "only the last token",
    },
    "14.choice_scores.visible": {
        "choices-delimiter-counted": "the delimiter is counted in the length",
    },
    "14.choice_scores.bytes": {
        "choices-bytes-as-chars": "the bytes were counted as characters",
    },
    "14.pass_at_k.visible": {
        "pass-with-replacement": "this is 1 - (1 - c/n)^k",
        "pass-c-over-n": "this is c / n, pass@1, whatever k",
        "pass-imports-reference": "is gptcourse.pass_at_k, the reference",
    },
    "14.paired_bootstrap.visible": {
        "bootstrap-unpaired": "a and b were resampled apart",
        "bootstrap-90-percent": "a 90% interval",
    },
    "14.ngram_overlap.visible": {
        "overlap-split-on-spaces": "the text was split on spaces only",
        "overlap-item-grams-as-set": "counted once each (a set)",
        "overlap-any-gram": "each item got 1 or 0",
        "overlap-imports-reference": "is gptcourse.ngram_overlap, the reference",
    },
}

# the lab's points; nbgrader validate on a student: the cells it reports failed, the first failed case, its message
TOTAL, VALIDATE = 24, Validation("pass-with-replacement", 1, "14.pass_at_k.visible", "this is 1 - (1 - c/n)^k")


class TestLab14(RoundTrip, NamedMistakes, BlindStudents):
    """Lab 14's round trip and in-process checks, from the tables above."""


# Written blind to the tests, a second reader (round 2): checked in-process (check_blind_student), each student
# against every case of every test cell, visible and hidden (the round trip above grades round 1 by nbgrader); each
# visible case a student fails names it, or, where it fails hidden cases alone, each hidden case that failed. Before the
# fixes 12 of them passed every visible cell and 16 failed with a message that did not name them.
ROUND2_FILE = Path(__file__).with_name("lab14_round2.cells")
ROUND2 = blind_students(ROUND2_FILE)
ROUND2_NAMES = blind_names(ROUND2_FILE)
ROUND2_FAILS = {
    **dict.fromkeys(("ll-full-sequence-shifted-rows", "ll-rows-one-early", "ll-log-softmax-over-time",
                     "ll-mean-not-sum", "ll-includes-context-tokens", "ll-no-batch-dim", "ll-half-precision"),
                    LL_TESTS),
    # the visible case's continuation is the argmax but for its middle token (200 logits below: log(softmax)
    # underflows there), hidden_near_greedy's first two tokens are near ties, hidden_one_token's token is the argmax
    # with a probability under one half
    **dict.fromkeys(("ll-greedy-last-token-only", "ll-greedy-any"), LL_TESTS - {"test_loglikelihood_greedy"}),
    "ll-greedy-first-token-only": {"test_loglikelihood"},
    "ll-log-of-softmax": {"test_loglikelihood"},
    "ll-greedy-float-equality": {"test_loglikelihood_hidden"},
    "ll-greedy-prob-over-half": LL_TESTS - {"test_loglikelihood"},
    **dict.fromkeys(("cs-length-with-space", "cs-words-as-length", "cs-in-place-division", "cs-softmax-over-choices",
                     "cs-returns-list"), CHOICE_TESTS),
    "cs-bytes-as-chars": CHOICE_TESTS - {"test_choice_scores"},
    **dict.fromkeys(("cs-chars-as-bytes", "cs-nfd-characters"), CHOICE_TESTS - {"test_choice_scores_bytes"}),
    "cs-bytes-two-per-nonascii": {"test_choice_scores_hidden"},  # hidden_unicode's '東京', 3 bytes a character
    **dict.fromkeys(("pk-naive-with-replacement", "pk-integer-division", "pk-product-off-by-one", "pk-monte-carlo",
                     "pk-lgamma-log-space", "pk-rounded", "pk-union-bound"), PASS_TESTS),
    "pk-float-binomials": {"test_pass_at_k"},  # the visible table's n = 2000; the hidden ones stop at 200
    # pb-global-seed draws the lab's draws, from torch's global generator reseeded: every case checks that the call
    # leaves torch's random state as it was
    **dict.fromkeys(("pb-unpaired-draws", "pb-ninety-percent", "pb-sorted-index-percentile", "pb-mean-of-resamples",
                     "pb-transposed-draws", "pb-normal-approximation", "pb-global-seed", "pb-without-replacement",
                     "pb-randint-inclusive", "pb-quantiles-of-item-differences", "pb-scipy-bootstrap"), BOOT_TESTS),
    **dict.fromkeys(("ng-unique-item-ngrams", "ng-whitespace-split", "ng-range-off-by-one", "ng-substring-search",
                     "ng-binary-flag", "ng-denominator-words", "ng-word-overlap"), OVERLAP_TESTS),
    # the visible training text is two lines, and an item copies the run across its break, 'foolishness.\nThe'
    **dict.fromkeys(("ng-train-not-lowercased", "ng-train-per-line"), OVERLAP_TESTS - {"test_ngram_overlap_hidden"}),
    "ng-short-item-whole": {"test_ngram_overlap_hidden"},  # hidden_short's items are shorter than n
    "ng-letters-only-regex": {"test_ngram_overlap_hidden"},  # hidden_sizes' words hold accents
}


def test_round2_names_its_students():
    assert ROUND2_FAILS.keys() <= ROUND2.keys()
    assert all(ROUND2_NAMES[student] for student in ROUND2)


@pytest.mark.parametrize("student", sorted(ROUND2_FAILS))
def test_each_round2_student_fails_exactly_its_cells_each_visible_one_naming_it(student):
    check_blind_student(LAB, ROUND2_FILE, student, ROUND2_FAILS[student])


# Right answers computed in float32 (torch's default float; the lab asks for "a float tensor"): a float32 rounding
# (about 1e-7 of the value) is not a mistake. A blind reader's float32 answers failed with "got -11.345, expected
# -11.345" before the tolerances allowed it.
CHOICES_FLOAT32 = {"choice_scores": CHOICES.format(**RIGHT_CHOICES).replace(
    "    if normalize", "    logprobs = logprobs.float()\n    if normalize")}
FLOAT32 = {
    "14.choice_scores.visible": CHOICES_FLOAT32,
    "14.choice_scores.bytes": CHOICES_FLOAT32,
    "14.paired_bootstrap.visible": {"paired_bootstrap": BOOTSTRAP.format(**RIGHT_BOOTSTRAP).replace(
        "    n = a.numel()", "    a, b = a.float(), b.float()\n    n = a.numel()")},
}


@pytest.mark.parametrize("test_id", sorted(FLOAT32))
def test_a_right_answer_in_float32_passes(test_id):
    check(test_id, solved_namespace(LAB, FLOAT32[test_id])[CaseId.parse(test_id).piece])
