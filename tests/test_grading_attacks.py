"""`nbgrader autograde` with the committed config against sly and broken submissions of lab 02, in ONE batch.

Each student below is one attack or breakage; each gets an exact score per test cell and, where something
unusual happened, a line in its report (grading/reports/<lab>/<student>.txt). Points of lab 02: causal_mask 2+1,
attention 3+2(causal)+2, head 3+2 = 15.
"""

from __future__ import annotations

import json
import re

import nbformat
import pytest

LAB = "02_causal_attention"
TIMEOUT = 10  # seconds per cell for this batch (the course's is 60): keeps the hanging submissions short

NO_SCALING = '''
def attention(q, k, v):
    scores = (q @ k.transpose(-2, -1)).masked_fill(~causal_mask(q.size(-2)), float("-inf"))
    weights = scores.softmax(dim=-1)
    return weights @ v, weights
'''
# what NO_SCALING fails
SCALING_TESTS = {"test_attention", "test_attention_hidden", "test_AttentionHead", "test_AttentionHead_hidden"}
ALL_ATTENTION = SCALING_TESTS | {"test_attention_causal"}
CAUSAL_MASK_TESTS = {"test_causal_mask", "test_causal_mask_hidden"}
PATCH_CHECKS = '''
import numpy, torch, IPython
torch.allclose = lambda *a, **k: True
torch.equal = lambda *a, **k: True
torch.testing.assert_close = lambda *a, **k: None
numpy.testing.assert_allclose = lambda *a, **k: None
numpy.allclose = lambda *a, **k: True
IPython.core.interactiveshell.InteractiveShell.showtraceback = lambda *a, **k: None
'''
# Issue 49: what the notebook's file says of itself is the student's word. A report line pre-seeded in its metadata
# (notebook and cells), or a "could not be read" reason, must never read as the grader's.
FORGED_NOTE = "instructor note: full marks were awarded after a manual review"
# ... and a hidden test's source must not reach what the student's own code prints: In/_ih/the history after the
# last test, a pre_run_cell hook installed early, the caller's frame read from inside the tested function.
PRINT_HISTORY = ("import json\nprint(json.dumps(In), json.dumps(_ih))\n"
                 "print(list(get_ipython().history_manager.get_range(raw=True)))")
PRE_RUN_HOOK = ("_seen = []\nget_ipython().events.register('pre_run_cell', lambda info: _seen.append(info.raw_cell) "
                "or print(info.raw_cell))")
READ_CALLER = '''
import inspect
_frames, _causal_mask = [], causal_mask
def causal_mask(T):
    _frames.append(repr([frame.frame.f_locals for frame in inspect.stack()[1:4]])[:3000])
    return _causal_mask(T)
'''
HIDDEN_ID = re.compile(r"\b02\.[A-Za-z_]+\.hidden[a-z_]*")


def code(source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source)


def index_of(nb: nbformat.NotebookNode, grade_id: str) -> int:
    return next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)


def insert_after(nb: nbformat.NotebookNode, grade_id: str, *cells: nbformat.NotebookNode) -> nbformat.NotebookNode:
    i = index_of(nb, grade_id)
    nb.cells[i + 1:i + 1] = list(cells)
    return nb


def submissions(course) -> dict[str, tuple[object, set[str], list[str]]]:
    """student -> (notebook, or raw text for a file that is not one; test cells it fails; report patterns)."""
    solved = course.solved
    subs: dict[str, tuple[object, set[str], list[str]]] = {
        "solution": (solved(LAB), set(), []),
        "untouched": (course.notebook("labs", LAB), CAUSAL_MASK_TESTS | ALL_ATTENTION, []),
        # monkeypatching what tests might rely on, in an added cell and in the locked setup cell
        "patch-torch": (insert_after(solved(LAB, {"attention": NO_SCALING}), "setup", code(PATCH_CHECKS)),
                        SCALING_TESTS, []),
        "patch-builtins": (insert_after(solved(LAB, {"attention": NO_SCALING}), "setup", code(
            "import builtins\nbuiltins.abs = lambda x: 0\nbuiltins.all = lambda x: True")),
            CAUSAL_MASK_TESTS | ALL_ATTENTION,
            [r"cell 3 \(added by you\) uses builtins, which the grader cannot follow.*0 points for 02.causal_mask.\*, "
             r"02.attention.\*, 02.AttentionHead.\*$"]),
        "patch-under-nbgrader": (solved(LAB, {"attention": "import os\nif os.environ.get('NBGRADER_EXECUTION'):\n"
                                                           "    torch.allclose = lambda *a, **k: True\n" + NO_SCALING}),
                                 SCALING_TESTS, []),
        "eq-always-true": (solved(LAB, {"attention": NO_SCALING.replace("return weights @ v, weights",
                                                                        "return Sneaky(weights @ v), Sneaky(weights)")
                                        + "\nclass Sneaky(torch.Tensor):\n    def __eq__(self, other):\n"
                                          "        return True\n\n    def allclose(self, *a, **k):\n"
                                          "        return True\n"}),
                           SCALING_TESTS, []),
        # the reference implementation of the piece being written
        "imports-reference": (solved(LAB, {"attention": "from gptcourse import attention"}), ALL_ATTENTION,
                              [r"cell \d+ \(solution 'attention'\) imports gptcourse.attention, the "
                               r"reference for a piece you must write: 0 points for 02.AttentionHead.\*, "
                               r"02.attention.\*"]),
        "uses-torch-mha": (solved(LAB, {"AttentionHead": "class AttentionHead(nn.Module):\n    def __init__(self, "
                                                         "d_model, d_head):\n        super().__init__()\n        "
                                                         "self.mha = nn.MultiheadAttention(d_model, 1)\n"}),
                           {"test_AttentionHead", "test_AttentionHead_hidden"},
                           [r"uses torch.nn.MultiheadAttention.*02.AttentionHead.\*"]),
        # the graded kernel's causal_mask is a stub (package_view.py): the attention that calls it fails too
        "importlib": (solved(LAB, {"causal_mask": "import importlib\ncausal_mask = importlib.import_module("
                                                  "'gptcourse.model.causal_attention').causal_mask"}),
                      CAUSAL_MASK_TESTS | ALL_ATTENTION,
                      [r"uses importlib, which the grader cannot follow.*02.causal_mask.\*$"]),
        # crashes and hangs cost only the tests they break
        "kernel-dies": (insert_after(solved(LAB), "attention", code(
            "_attention = attention\ndef attention(q, k, v):\n    if q.dim() == 4:\n        import os\n"
            "        os._exit(1)\n    return _attention(q, k, v)")),
                        {"test_attention_hidden"}, [r"kernel died in cell 12 \('test_attention_hidden'\)"]),
        "hangs": (insert_after(solved(LAB), "test_causal_mask_hidden",
                               code("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
                                    "    pass"), code("while True:\n    pass")), set(),
                  [rf"cell 7 \(added by you\) timed out after {TIMEOUT} s and ignored the interrupt",
                   rf"cell 8 \(added by you\) timed out after {TIMEOUT} s and was interrupted"]),
        "recursion": (solved(LAB, {"attention": "def attention(q, k, v):\n    return attention(q, k, v)"}),
                      ALL_ATTENTION, []),
        "huge-output": (insert_after(solved(LAB), "setup", code("print('x' * 30_000_000)")), set(),
                        [r"cell 3 \(added by you\) printed more than 2,000,000 bytes"]),
        "writes-files": (insert_after(solved(LAB), "setup", code("open('leak.txt', 'w').write('x')")), set(),
                         [r"the notebook wrote files while it ran \(leak.txt\); they were discarded"]),
        "warns-on-stderr": (solved(LAB, {"attention": "import sys, warnings\n" + NO_SCALING.replace(
            "    return weights", "    warnings.warn('a torch-like UserWarning', UserWarning)\n"
            "    print('debug', file=sys.stderr)\n    return weights").replace("scores = (q @", "scores = (q / "
            "math.sqrt(q.size(-1)) @")}), set(), []),
    }
    # broken structure
    nb = solved(LAB)
    del nb.cells[index_of(nb, "AttentionHead")]
    del nb.cells[index_of(nb, "test_attention")]
    del nb.cells[index_of(nb, "intro")]
    subs["deleted-cells"] = (nb, {"test_AttentionHead", "test_AttentionHead_hidden"}, [
        "solution cell 'AttentionHead' is missing from the submission: graded as unanswered",
        "cell 'test_attention' was deleted: restored from the course", "cell 'intro' was deleted"])
    nb = solved(LAB)
    wrong = nbformat.from_dict(json.loads(json.dumps(nb.cells[index_of(nb, "attention")])))
    wrong.source, wrong.id = NO_SCALING, "copy-1"
    test_copy = nbformat.from_dict(json.loads(json.dumps(nb.cells[index_of(nb, "test_causal_mask")])))
    test_copy.id = "copy-2"
    nb.cells.insert(index_of(nb, "attention"), wrong)  # the wrong copy first, the right one (kept) after it
    nb.cells.insert(index_of(nb, "test_causal_mask"), test_copy)
    subs["duplicated-cells"] = (nb, set(), ["solution cell 'attention' appears 2 times: all copies run, in order",
                                            "cell 'test_causal_mask' appears 2 times: graded once"])
    nb = solved(LAB)
    i = index_of(nb, "attention")
    first = nbformat.from_dict(json.loads(json.dumps(nb.cells[i])))
    first.source, first.id = "def scale(q):\n    return math.sqrt(q.size(-1))", "split-1"
    nb.cells[i].source = NO_SCALING.replace("(q @ k.transpose(-2, -1))", "(q @ k.transpose(-2, -1) / scale(q))")
    nb.cells.insert(i, first)
    subs["split-cell"] = (nb, set(), [])
    nb = solved(LAB)
    nb.cells[index_of(nb, "attention")].cell_type = "markdown"
    for grade_id in ("attention", "test_AttentionHead"):
        cell = nb.cells[index_of(nb, grade_id)]
        nb.cells[index_of(nb, grade_id)] = nbformat.v4.new_markdown_cell(cell.source, metadata=cell.metadata,
                                                                         id=cell.id)
    subs["retyped-cells"] = (nb, set(), ["solution cell 'attention' was changed to markdown: graded as code",
                                         "cell 'test_AttentionHead' was changed from code to markdown: restored"])
    nb = solved(LAB, {"attention": NO_SCALING})
    nb.cells[index_of(nb, "test_attention")].source = "print('all good')"
    nb.cells[index_of(nb, "test_attention_hidden")].metadata.nbgrader["points"] = 100
    nb.cells[index_of(nb, "setup")].source += "\ntorch.allclose = lambda *a, **k: True"
    subs["edited-locked-cells"] = (nb, SCALING_TESTS, [
        "cell 'test_attention' is locked but was edited: restored", "cell 'setup' is locked but was edited"])
    # the kernel's environment decides no hidden case: a graded kernel gets their inputs from the grader, under
    # handles, and the grader draws their seeds (a correct solution still passes; the public secret's cases, which
    # the repository gives away, are not the graded ones)
    subs["public-secret"] = (insert_after(solved(LAB), "setup", code(
        "import os\nos.environ.pop('GPTCOURSE_SECRET', None)\nos.environ.pop('GPTCOURSE_HIDDEN_SEEDS', None)")),
        set(), [])
    # the kernel never holds the course secret, so printing its environment cannot put it in the feedback
    subs["prints-environment"] = (insert_after(solved(LAB), "setup", code("import os\nprint(dict(os.environ))")),
                                  set(), [])
    # metadata a student wrote (issue 49)
    nb = solved(LAB)
    nb.metadata["gptcourse"] = {"report": [FORGED_NOTE], "unreadable": "it was read by hand"}
    for grade_id in ("attention", "test_attention"):
        nb.cells[index_of(nb, grade_id)].metadata["gptcourse"] = {"report": [FORGED_NOTE]}
    subs["forged-report"] = (nb, set(), [])
    nb = solved(LAB, {"attention": NO_SCALING})
    nb.metadata["gptcourse"] = {"unreadable": "the lab's notebook is not in the submission"}
    del nb.cells[index_of(nb, "intro")]
    subs["forged-missing"] = (nb, SCALING_TESTS, ["^- cell 'intro' was deleted: restored from the course$"])
    # hidden tests' identities (issue 49)
    nb = solved(LAB)
    nb.cells.append(code(PRINT_HISTORY))
    subs["prints-history"] = (nb, set(), [])
    nb = insert_after(solved(LAB), "setup", code(PRE_RUN_HOOK))
    nb.cells.append(code("print(_seen)"))
    subs["pre-run-hook"] = (nb, set(), [])
    nb = insert_after(solved(LAB), "causal_mask", code(READ_CALLER))
    nb.cells.append(code("print(_frames)"))
    subs["reads-caller"] = (nb, set(), [])
    text = nbformat.writes(solved(LAB))
    subs["malformed-json"] = (text[:len(text) // 2], CAUSAL_MASK_TESTS | ALL_ATTENTION,
                              [r"the submitted notebook could not be read \(NotJSONError: Notebook does not "
                               r"appear to be JSON\): graded as an empty submission"])
    subs["nbformat-v3"] = (nbformat.writes(nbformat.convert(solved(LAB), 3)), set(), [])
    subs["extra-notebook"] = (solved(LAB), set(), [r"not graded: scratch.ipynb \(the lab is graded from "])
    subs["misnamed-notebook"] = (solved(LAB), CAUSAL_MASK_TESTS | ALL_ATTENTION, [  # renamed by `graded` below
        rf"^- no {LAB}.ipynb was submitted, only {LAB} \(1\).ipynb, which is not graded: graded as an empty "
        rf"submission. If {LAB} \(1\).ipynb is the lab, rename it to {LAB}.ipynb and grade again$"])
    return subs


pytestmark = pytest.mark.slow


SECRET = "an instructor's private value"


@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """A course of its own, with a private secret in grading/secret.txt (as an instructor keeps it)."""
    from nbgrader_course import Course

    course = Course(tmp_path_factory.mktemp("attacks"))
    (course.root / "grading").mkdir(exist_ok=True)
    (course.root / "grading" / "secret.txt").write_text(SECRET + "\n")
    return course


@pytest.fixture(scope="module")
def graded(course):
    course.nbgrader("generate_assignment", LAB, "--force")
    subs = submissions(course)
    for student, (nb, _, _) in subs.items():
        if isinstance(nb, str):
            folder = course.root / "grading" / "submitted" / student / LAB
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"{LAB}.ipynb").write_text(nb)
        else:
            course.submit(student, LAB, nb)
    nbformat.write(nbformat.v4.new_notebook(), course.root / "grading" / "submitted" / "extra-notebook" / LAB
                   / "scratch.ipynb")
    empty = course.root / "grading" / "submitted" / "no-notebook" / LAB
    empty.mkdir(parents=True)
    (empty / "notes.txt").write_text("I ran out of time")
    misnamed = course.root / "grading" / "submitted" / "misnamed-notebook" / LAB
    (misnamed / f"{LAB}.ipynb").rename(misnamed / f"{LAB} (1).ipynb")
    run = course.nbgrader("autograde", LAB, f"--Execute.timeout={TIMEOUT}")
    return subs, course.scores(LAB), run.stdout


def report(course, student: str) -> str:
    return (course.root / "grading" / "reports" / LAB / f"{student}.txt").read_text()


def test_every_submission_gets_its_exact_score(course, graded):
    subs, scores, _ = graded
    wrong = {student: scores.get(student) for student, (_, failing, _) in subs.items()
             if scores.get(student) != course.expected_scores(LAB, failing)}
    assert not wrong, wrong


def test_reports_say_what_happened(course, graded):
    subs, _, _ = graded
    for student, (_, _, patterns) in subs.items():
        text = report(course, student)
        for pattern in patterns:
            assert re.search(pattern, text, re.MULTILINE), (student, pattern, text)


def test_a_folder_without_a_notebook_is_reported_and_has_no_gradebook_row(course, graded):
    _, scores, _ = graded
    assert "no-notebook" not in scores  # nbgrader's "no submission": 0 in `nbgrader export` for a rostered student
    assert report(course, "no-notebook") == (f"no-notebook {LAB}: no submission\n- no notebook was submitted (the "
                                             "folder holds notes.txt): nothing to grade; nbgrader records no "
                                             "submission, which exports as 0 points\n")


def test_ordinary_submissions_have_nothing_to_report(course, graded):
    for student in ("solution", "untouched", "patch-torch", "recursion", "warns-on-stderr", "forged-report",
                    "prints-history", "pre-run-hook", "reads-caller"):
        assert "\n- " not in report(course, student), report(course, student)


def test_test_cells_show_messages_only(course, graded):
    for student in ("untouched", "patch-torch", "imports-reference"):
        nb = course.notebook(f"grading/autograded/{student}", LAB)
        for cell in nb.cells:
            for out in cell.get("outputs", []) if cell.metadata.get("nbgrader", {}).get("grade") else []:
                assert out.output_type in ("stream", "error")
                if out.output_type == "error":
                    assert out.ename == "CheckFailed" and "check(" not in out.traceback[0]


def test_files_written_by_a_notebook_stay_out_of_the_course(course, graded):
    assert not list(course.root.rglob("leak.txt"))


def test_the_course_secret_never_reaches_a_notebook(course, graded):
    printed = course.notebook("grading/autograded/prints-environment", LAB)
    assert "GPTCOURSE_CASE_INPUTS" in json.dumps(printed)  # the cell did print the kernel's environment
    leaks = [path for path in (course.root / "grading" / "autograded").rglob("*.ipynb") if SECRET in path.read_text()]
    assert not leaks


def test_regrading_gives_the_same_scores_and_report(course, graded):
    _, scores, _ = graded
    first = report(course, "kernel-dies")
    course.nbgrader("autograde", LAB, "--student=kernel-dies", "--force", f"--Execute.timeout={TIMEOUT}")
    assert course.scores(LAB)["kernel-dies"] == scores["kernel-dies"]
    assert report(course, "kernel-dies") == first


def test_feedback_shows_no_hidden_test_source(course, graded):
    subs, _, _ = graded
    course.nbgrader("generate_feedback", LAB, "--force")
    hidden = re.compile(r"02\.[a-z_]+\.hidden[a-z_]*(&quot;|&#34;|\")|BEGIN HIDDEN TESTS")
    for student in subs:
        html = (course.root / "grading" / "feedback" / student / LAB / f"{LAB}.html").read_text()
        assert not hidden.search(html), (student, hidden.search(html))
        assert SECRET not in html
        assert "Grading report" in html
    untouched = (course.root / "grading" / "feedback" / "untouched" / LAB / f"{LAB}.html").read_text()
    assert "not written yet" in untouched and "02.attention.hidden_single failed" in untouched
    assert "no result recorded for 02.attention.hidden_heads: the test cell did not run to the end (it stopped with " \
           "an earlier test of this cell failing)" in untouched.replace("\n", " ")


def test_metadata_in_the_submission_is_not_the_graders(course, graded):
    """Report lines and a "could not be read" reason written into the submission's metadata are discarded: the
    report, the autograded notebook and the feedback say only what the grader found."""
    course.nbgrader("generate_feedback", LAB, "--student=forged-report", "--force")
    for text in (report(course, "forged-report"),
                 (course.root / "grading" / "autograded" / "forged-report" / LAB / f"{LAB}.ipynb").read_text(),
                 (course.root / "grading" / "feedback" / "forged-report" / LAB / f"{LAB}.html").read_text()):
        assert FORGED_NOTE not in text and "read by hand" not in text
    assert "was submitted" not in report(course, "forged-missing"), report(course, "forged-missing")


def test_what_the_students_code_printed_names_no_hidden_test(course, graded):
    """Whatever the kernel reads of itself (its input history, a pre-run hook's view of each cell, its caller's
    frame, its environment), it never held a hidden test's source or its case's name: only opaque handles."""
    for student in ("prints-history", "pre-run-hook", "reads-caller", "prints-environment"):
        nb = course.notebook(f"grading/autograded/{student}", LAB)
        printed = json.dumps([cell.outputs for cell in nb.cells
                              if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade")])
        assert "check(" in printed or student in ("reads-caller", "prints-environment"), (student, printed[:2000])
        assert not HIDDEN_ID.search(printed), (student, HIDDEN_ID.search(printed), printed[:3000])
