"""Blind-written students run in-process (no kernel, no nbgrader): each student's cells in place of the solution's,
run as a notebook runs them (in `__main__`, so the kernel's checks of forbidden references look at them), and
every case of the pieces they wrote checked in the lab's order, visible cases first.

`first_failures(lab, path)` gives, per student of a `labNN_blind.cells` file (`lab_roundtrip.blind_students`),
the first visible case it fails and the diagnosis (the message after the case's description), else the first
hidden one, else None: a lab's test module asserts that the diagnosis matches the student's Names regex.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from lab_roundtrip import blind_students
from nbgrader_course import ROOT

from gptcourse.checks import CheckFailed
from gptcourse.grading import check
from gptcourse.grading.cases import CaseId, get_case, lab_cases

CHECK_CALL = re.compile(r'check\("([^"]+)", (\w+)\)')


def notebook_namespace(lab: str, answers: dict[str, str]) -> dict:
    """The solution's non-test cells of `lab` run in `__main__` order, `answers` ({grade_id: source}) in place."""
    namespace: dict = {"__name__": "__main__"}
    for cell in nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4).cells:
        grading = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not grading.get("grade"):
            source = answers.get(grading["grade_id"], cell.source)
            exec(compile(source, f"<cell {grading['grade_id']}>", "exec"), namespace)
    return namespace


def diagnosis(test_id: str, message: str) -> str:
    """The message after the case's description, unwrapped."""
    message, what = " ".join(message.split()), " ".join(get_case(test_id).what.split())
    return message.split(what, 1)[1].strip() if what in message else message


def first_failure(lab: str, answers: dict[str, str]) -> tuple[str, str] | None:
    """(test id, diagnosis) of the first case the student fails among the pieces they wrote, visible first."""
    namespace = notebook_namespace(lab, answers)
    cases = [c for c in lab_cases(lab) if CaseId.parse(c.id).piece in answers]
    for case in sorted(cases, key=lambda c: c.hidden):
        try:
            check(case.id, namespace[CaseId.parse(case.id).piece])
        except CheckFailed as failed:
            return case.id, diagnosis(case.id, str(failed))
    return None


def first_failures(lab: str, path: Path) -> dict[str, tuple[str, str] | None]:
    return {student: first_failure(lab, answers) for student, answers in blind_students(path).items()}
