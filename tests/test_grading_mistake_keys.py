"""Every known mistake the grader recognises reaches the class report with its key, and every mistake's lesson
section (`classroom/mistake_lessons.py`) is a heading of its lesson (issue 47).

The keys: each round-trip student of labs 01-16 (tests/test_labs_NN.py's WRONG and blind students), every case of
every test cell judged as the grader judges a payload (`payload.judged`); a known mistake is recognised where its
description passes through `checks.mistake_key` (a `mistakes` table, a shape cause, a parameter count's cause, a
judge that names one), and none may pass without a key."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import sys

import pytest
import torch
from synthetic_class import LAB, PLANTED, ROOT, course_with

from gptcourse import checks
from gptcourse.grading.classroom import class_report, mistake_lessons

# descriptions that pass through mistake_key but name no mistake: the rule itself, where no known mistake matched
RULES = {"each token's position is its index in the sequence"}  # lab 11's positions with a cache
LABS = [f"{n:02d}" for n in range(1, 17)]


def judged_with_unkeyed(lab: str, monkeypatch: pytest.MonkeyPatch) -> tuple[int, dict[str, set[str]]]:
    """(the failed verdicts with a key, {description recognised without a key: the cases}) of lab `lab`'s
    round-trip students, every case of each test cell the student fails judged in-process as the grader judges
    its payload (the round trip proves that the other cells pass, and a passing case computes no mistake:
    tests/test_lazy_mistakes.py)."""
    from lab_roundtrip import banned_pieces, graded_cells, solved_namespace

    from gptcourse.grading.cases import CaseId, case_seed, get_case, registry
    from gptcourse.grading.kernel import run_case
    from gptcourse.grading.payload import judged

    registry()  # every lab module imported, so each one's `mistake_key` can be watched
    unkeyed: dict[str, set[str]] = {}
    case_now = [""]
    original = checks.mistake_key

    def watched(description: str) -> str | None:
        key = original(description)
        if key is None and description and str(description) not in RULES:
            unkeyed.setdefault(str(description), set()).add(case_now[0])
        return key

    for name, module in list(sys.modules.items()):
        if name.startswith("gptcourse") and getattr(module, "mistake_key", None) is original:
            monkeypatch.setattr(module, "mistake_key", watched)
    module = importlib.import_module(f"test_labs_{lab}")
    folder, keyed = module.LAB, 0
    for student, (answers, fails) in sorted(getattr(module, f"TestLab{lab}").graded().items()):
        torch.manual_seed(0)
        with contextlib.redirect_stdout(io.StringIO()):
            namespace, banned = solved_namespace(folder, answers), banned_pieces(folder, answers)
            for test_ids in (ids for cell, ids in graded_cells(folder).items() if cell in fails):
                for test_id in test_ids:
                    piece = CaseId.parse(test_id).piece
                    if piece in banned:
                        continue
                    case_now[0] = f"{student}: {test_id}"
                    case = get_case(test_id)
                    verdict = judged(run_case(case, case_seed(case), namespace[piece]))
                    keyed += verdict.mistake is not None
                    assert verdict.mistake is None or class_report._MISTAKE.fullmatch(verdict.mistake)
    return keyed, unkeyed


@pytest.mark.parametrize("lab", LABS)
def test_every_recognised_mistake_reaches_the_report_with_its_key(lab, monkeypatch):
    keyed, unkeyed = judged_with_unkeyed(lab, monkeypatch)
    assert keyed, f"lab {lab}: no round-trip student's mistake was named with a key"
    assert not unkeyed, f"lab {lab}: known mistakes recognised without a key (make each a checks.Mistake): {unkeyed}"


def test_lab_06s_and_09s_count_and_log_mistakes_are_keyed(monkeypatch):
    """Lab 06's parameter counts (`checks.check_parameter_count`) and lab 09's eps inside the log
    (`checks.eps_in_log_mistakes`): the students who make them get the keys."""
    from lab_roundtrip import solved_namespace
    from test_labs_06 import WRONG as WRONG_06
    from test_labs_09 import WRONG as WRONG_09

    from gptcourse.grading.cases import case_seed, get_case
    from gptcourse.grading.kernel import run_case
    from gptcourse.grading.payload import judged

    def key(folder: str, answers: dict, test_id: str) -> str | None:
        case = get_case(test_id)
        with contextlib.redirect_stdout(io.StringIO()):
            obj = solved_namespace(folder, answers)[case.id.split(".")[1]]
        return judged(run_case(case, case_seed(case), obj)).mistake

    lab06, lab09 = "06_parameter_counting", "09_training_by_hand"
    assert key(lab06, WRONG_06["always-untied"][0], "06.parameter_breakdown.visible") == "params.untied_head"
    assert key(lab06, WRONG_06["always-untied"][0], "06.count_parameters.visible") == "params.untied_head"
    assert key(lab06, WRONG_06["swiglu-two-matrices"][0], "06.parameter_breakdown.llama") \
        == "params.swiglu_two_matrices"
    assert key(lab06, WRONG_06["layernorm-without-bias"][0], "06.parameter_breakdown.gpt2") \
        == "params.layernorm_no_beta"
    assert key(lab09, WRONG_09["log-plus-eps"][0], "09.cross_entropy.large") == "loss.eps_in_log"


def declared_keys() -> tuple[set[str], set[str]]:
    """(every key written in the checks' and the grading modules' source: `Mistake("key", ...)` and
    `fail(..., mistake="key")` (or `"key" if ... else None`), the by-hand functions' prefixes "NN.function:" of
    `fixtures.switch_key`)."""
    grading = ROOT / "shared" / "gptcourse"
    keys, functions = set(), set()
    for path in [grading / "checks.py", *sorted((grading / "grading").glob("*.py")),
                 *sorted((grading / "grading" / "labs").glob("lab*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Mistake", "fail"):
                given = node.args[:1] if node.func.id == "Mistake" else [
                    *node.args[1:2], *(k.value for k in node.keywords if k.arg == "mistake")]
                given = [*given, *(branch for arg in given if isinstance(arg, ast.IfExp)  # key if hint else None
                                   for branch in (arg.body, arg.orelse))]
                keys |= {arg.value for arg in given if isinstance(arg, ast.Constant) and isinstance(arg.value, str)}
            if isinstance(node, ast.FunctionDef) and path.stem.startswith("lab"):
                functions.add(f"{path.stem[3:]}.{node.name.strip('_').removeprefix('wrong_')}:")
    return keys, functions


def test_every_lesson_row_is_a_declared_key_and_one_heading_of_its_lesson():
    """Each row of `mistake_lessons.TAUGHT_IN` names a key the grader gives and, in its lesson's notebook, exactly
    one markdown heading: a renamed heading fails here (read from the notebook's text, not through the module)."""
    keys, functions = declared_keys()
    assert {"params.untied_head", "loss.eps_in_log", "attention.unscaled"} <= keys and "09.adamw_step:" in functions
    unknown = sorted(key for key in mistake_lessons.TAUGHT_IN if key not in keys | functions)
    assert not unknown, f"rows for keys that no grading module gives: {unknown}"
    unresolved = {}
    for key, (lesson, phrase) in mistake_lessons.TAUGHT_IN.items():
        [path] = (ROOT / "lessons").glob(f"{lesson}_*.ipynb")
        headings = [line for cell in json.loads(path.read_text())["cells"] if cell["cell_type"] == "markdown"
                    for line in "".join(cell["source"]).splitlines() if line.startswith("#") and phrase in line]
        if len(headings) != 1:
            unresolved[key] = (lesson, phrase, headings)
    assert not unresolved, f"rows whose phrase is not in exactly one heading of their lesson: {unresolved}"
    assert set(mistake_lessons.mistake_sections(ROOT, mistake_lessons.TAUGHT_IN)) == set(mistake_lessons.TAUGHT_IN)


def test_every_lesson_heading_shows_its_math_as_text():
    """The report's pages render no LaTeX (no script): each heading's $...$ reads as text, by hand for a few, and
    no heading of any lesson keeps a dollar or a backslash."""
    assert mistake_lessons.plain_heading("3. Why divide by $\\sqrt{D}$") == "3. Why divide by √D"
    assert mistake_lessons.plain_heading("Why $-\\infty$, and why") == "Why -∞, and why"
    assert mistake_lessons.plain_heading("with $\\beta$ too small; memory is $T^2$") == "with β too small; memory is T²"
    headings = [heading for path in sorted((ROOT / "lessons").glob("[0-9][0-9]_*.ipynb"))
                for heading in mistake_lessons.lesson_headings(ROOT, path.name[:2])]
    assert sum("$" in heading for heading in headings) >= 5
    raw = [shown for heading in headings if "$" in (shown := mistake_lessons.plain_heading(heading)) or "\\" in shown]
    assert not raw, f"headings the report would show with raw LaTeX (add its symbol to _MATH_AS_TEXT): {raw}"


# keys no heading of their lesson teaches: the report shows their piece's section
LEFT_TO_THE_PIECE = {
    "01.tokens_scaled",  # the original Transformer's sqrt(d_model): lesson 01 never scales
    "05.shared_blocks", "05.blocks_not_registered",  # one module N times, a plain list: lesson 05 shows neither
    "08.decode_ignore_errors", "08.decode_raises",  # errors='replace' is lab 08's alone
    "14.ll_half_precision", "14.model_called_without_batch",  # float16 logits, a model called on (T,): lab 14's
}


def test_every_declared_key_has_a_row_but_those_left_to_their_piece():
    """Every named mistake of the checks, the attention catalogue and labs 01-16 has its lesson's section, but
    those of LEFT_TO_THE_PIECE (which have none); a by-hand function's switches are found by their function."""
    keys, _ = declared_keys()
    assert len(keys) > 400
    missing = sorted(key for key in keys - LEFT_TO_THE_PIECE if mistake_lessons.row_of(key) is None)
    assert not missing, f"keys without a lesson section (add a row, or leave them to the piece here): {missing}"
    assert LEFT_TO_THE_PIECE <= keys and not LEFT_TO_THE_PIECE & set(mistake_lessons.TAUGHT_IN)
    assert mistake_lessons.row_of("09.adamw_step:decay=gradient") == ("09", "AdamW, line by line")
    assert mistake_lessons.row_of("15.by_hand_step:shift=0") == ("15", "GRPO, end to end")
    assert mistake_lessons.row_of("02.adamw_step:decay=gradient") is None


def test_a_key_listed_under_two_sections_is_refused():
    """The table lists each key once: a key under two sections (here twice in lesson 02, once written bare) would
    have two rows, and the inversion refuses it, naming the key; a bare key is the lesson's lab's."""
    assert mistake_lessons.inverted({"02": {"The formula": "swapped", "Why divide by": "mask.inverted"}}) == {
        "02.swapped": ("02", "The formula"), "mask.inverted": ("02", "Why divide by")}
    with pytest.raises(ValueError, match=r"\['02\.swapped'\]"):
        mistake_lessons.inverted({"02": {"The formula": "swapped", "Why divide by": "02.swapped"}})
    with pytest.raises(ValueError, match=r"\['mask\.inverted'\]"):
        mistake_lessons.inverted({"02": {"The causal mask": "mask.inverted"}, "10": {"Padding": "mask.inverted"}})


def test_the_report_names_the_section_that_teaches_each_mistake_else_its_pieces(tmp_path, monkeypatch):
    """attention.unscaled found in AttentionHead is shown under lesson 02's "Why divide by sqrt(D)" (its piece's
    section is "One head, end to end"), in the mistakes table, the student's page and the CSV, attention.swapped
    under "The formula"; a key without a row (attention.swapped's taken out) shows its piece's; with the heading
    renamed, the mistake falls back to its piece's too."""
    planted = PLANTED | {"head-unscaled": {"02.AttentionHead.visible": ("wrong", "attention.unscaled")}}
    root = course_with(tmp_path, planted)
    written = class_report.write_report(root, LAB)
    scaling, head = "lesson 02, 3. Why divide by √D", "lesson 02, 4. One head, end to end"
    assert written.report.sections["AttentionHead"] == head
    page = (written.folder / "index.html").read_text()
    assert f"<td>attention.unscaled</td><td>4</td><td>AttentionHead, attention</td><td>{scaling}</td>" in page
    assert "<td>attention.swapped</td><td>1</td><td>AttentionHead</td><td>lesson 02, 1. The formula</td>" in page
    mine = (written.folder / "students" / "head-unscaled.html").read_text()
    assert f"<td>attention.unscaled</td><td>{scaling}</td>" in mine
    with open(written.folder / "report.csv", encoding="utf-8", newline="") as f:
        import csv

        rows = [r for r in csv.DictReader(f) if r["student"] == "head-unscaled"]
    assert {(r["case"], r["lesson"]) for r in rows if r["mistake"]} == {("02.AttentionHead.visible", scaling)}
    lesson = root / "lessons" / f"{LAB}.ipynb"
    lesson.write_text(lesson.read_text().replace("## 3. Why divide by", "## 3. Scaling by"))
    assert class_report.build(root, LAB).section_of("attention.unscaled", "AttentionHead") == head
    monkeypatch.delitem(mistake_lessons.TAUGHT_IN, "attention.swapped")
    assert class_report.build(root, LAB).section_of("attention.swapped", "AttentionHead") == head
