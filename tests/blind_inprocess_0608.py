"""A blind-written student graded in-process: every case of every test cell of a lab, visible and hidden.

The nbgrader round trip (lab_roundtrip.py) is too slow for a dozen students a lab, so labs 06-08 grade theirs
here: the solution's cells run with the student's in place, each test cell's `check` calls are made one by one
(a graded kernel stops a cell at its first failure; every case is run here so that each message can be read),
and the grader's static scan of the cells (`find_forbidden`, judge.py) zeroes a piece whose reference the student
imports, as grading does. The full package is imported here, where a graded kernel sees a view without the lab's
references (package_view.py): a student that calls one gets its right answer here, and its cells fail only by
the scan.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
from lab_roundtrip import blind_names, blind_students, solved_namespace
from nbgrader_course import ROOT

from gptcourse.checks import CheckFailed
from gptcourse.grading import check
from gptcourse.grading.cases import CaseId, forbidden_names, get_case
from gptcourse.grading.forbidden import find_forbidden


def _cells(lab: str) -> list[nbformat.NotebookNode]:
    return nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4).cells


def graded_cells(lab: str) -> dict[str, list[str]]:
    """{test cell grade_id: the case ids its `check` calls name, in order} of the solution of `lab`."""
    return {cell.metadata["nbgrader"]["grade_id"]: re.findall(r'check\("([^"]+)"', cell.source)
            for cell in _cells(lab) if cell.metadata.get("nbgrader", {}).get("grade")}


def banned_pieces(lab: str, answers: dict[str, str]) -> set[str]:
    """The pieces whose reference the solution's cells of `lab`, `answers` in place, import or use: the grader's
    static scan zeroes every test of them."""
    cells = []
    for cell in _cells(lab):
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.cell_type == "code":
            cells.append((str(grade_id), answers.get(grade_id, cell.source), grade_id in answers))
    forbidden = forbidden_names(lab.split("_")[0])
    return {piece for finding in find_forbidden(cells, forbidden) for piece in finding.pieces or forbidden}


def after_what(test_id: str, message: str) -> str:
    """The message of a failed case after the case's description (the same for every student), unwrapped."""
    message, what = " ".join(message.split()), " ".join(get_case(test_id).what.split())
    assert what in message, f"{test_id}: {message!r} does not hold the case's description"
    return message.split(what, 1)[1]


def failures(lab: str, answers: dict[str, str]) -> dict[str, dict[str, str]]:
    """{test cell: {case id: what its message says}} of every case the solution of `lab`, `answers` in place,
    fails; the cases of a banned piece (see `banned_pieces`) say "banned"."""
    namespace, banned, failed = solved_namespace(lab, answers), banned_pieces(lab, answers), {}
    for cell, test_ids in graded_cells(lab).items():
        for test_id in test_ids:
            piece = CaseId.parse(test_id).piece
            if piece in banned:
                failed.setdefault(cell, {})[test_id] = "banned"
                continue
            try:
                check(test_id, namespace[piece])
            except CheckFailed as failure:
                failed.setdefault(cell, {})[test_id] = after_what(test_id, str(failure))
    return failed


def blind_pieces(path: Path) -> dict[str, set[str]]:
    """{student: the pieces its "# Piece: a, b." line names}: the pieces it wrote."""
    parts = re.split(r"^# ==== (\S+).*\n", path.read_text(), flags=re.MULTILINE)
    return {student: set(re.findall(r"\w+", re.search(r"^# Piece: ([^.]*)", text, flags=re.MULTILINE).group(1)))
            for student, text in zip(parts[1::2], parts[2::2], strict=True)}


def check_blind_student(lab: str, path: Path, student: str, fails: set[str]) -> None:
    """Blind student `student` of `path` fails exactly the test cells `fails` of `lab`, and each visible case of
    a piece it wrote that it fails says what its mistake is (matches its "# Names:" regex); a student that fails
    no such visible case must be named by each hidden one it fails (the graded feedback shows those messages). A
    piece that calls the student's (train_step its next_token_loss) fails too, with that piece's message; a
    banned student is named by the grader's line about the reference it uses."""
    failed = failures(lab, blind_students(path)[student])
    assert set(failed) == fails, f"{student} fails {sorted(failed)}, expected {sorted(fails)}: {failed}"
    pieces = blind_pieces(path)[student]
    said = {test_id: message for by_case in failed.values() for test_id, message in by_case.items()
            if message != "banned" and CaseId.parse(test_id).piece in pieces}
    visible = {test_id: message for test_id, message in said.items() if not CaseId.parse(test_id).hidden}
    names = blind_names(path)[student]
    unnamed = {test_id: message for test_id, message in (visible or said).items() if not re.search(names, message)}
    assert not unnamed, f"{student}: these messages do not match {names!r}: {unnamed}"
