"""The nbgrader round trip every lab's test module runs, and its in-process checks, written once.

A lab's test module declares its round trip in tables at its top level, and one `class TestLabNN(RoundTrip, ...)`
runs them (`LabTables` reads them from the class's module): LAB (the lab's folder), TOTAL (its points), WRONG
(student -> ({solution cell grade_id: what they wrote}, the test cells it must fail)), VALIDATE (a student, how
many cells `nbgrader validate` must report failed, its first failed case and what the report says) and, where the
lab has blind students, BLIND_FILE and BLIND_FAILS (blind student -> the test cells it fails; `blind_round_trip`
names them for nbgrader). The release `RoundTrip` generates must be the committed labs/LAB; one autograde batch
grades the solution, the untouched release, every student of WRONG and every blind student; lab-specific tests are
methods of the class and can use the same `scores` (mark them slow: they run nbgrader). In-process, `NamedMistakes`
checks that each mistake of SAYS (case -> {a student of WRONG or a blind student: what the case's message says})
is named (`check_named_mistake`), and `BlindStudents` grades each blind student, every case of every test cell,
visible and hidden, reading each message (`check_blind_student`).
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import nbformat
import pytest
from nbgrader_course import ROOT, Course

from gptcourse.checks import CheckFailed
from gptcourse.grading import check
from gptcourse.grading.cases import CaseId, get_case
from gptcourse.grading.forbidden import find_forbidden, pieces_lost
from gptcourse.grading.piece import forbidden_names


def files(folder: Path) -> dict[str, bytes]:
    """{path relative to `folder`: contents} of every file under it."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def solved_namespace(lab: str, answers: dict[str, str]) -> dict:
    """The namespace of the solution's non-test cells of `lab`, run in order with `answers` ({grade_id: source})
    in place of those cells, as a kernel runs them: in `__main__` (the checks of forbidden references look there
    for what the student defined)."""
    namespace: dict = {"__name__": "__main__"}
    for cell in _cells(lab):
        grading = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and not grading.get("grade"):
            source = answers.get(grading["grade_id"], cell.source)
            exec(compile(source, f"<cell {grading['grade_id']}>", "exec"), namespace)
    return namespace


def diagnosis(lab: str, answers: dict[str, str], test_id: str) -> str:
    """The message with which the solution's cells of `lab`, `answers` in place, fail case `test_id`, after the
    case's description (which is the same for every student), unwrapped."""
    with pytest.raises(CheckFailed) as failed:
        check(test_id, solved_namespace(lab, answers)[CaseId.parse(test_id).piece])
    return after_description(str(failed.value), test_id)


def after_description(message: str, test_id: str) -> str:
    """A failure message of case `test_id`, unwrapped, after the case's description."""
    message, what = " ".join(message.split()), " ".join(get_case(test_id).what.split())
    assert what in message
    return message.split(what, 1)[1]


def graded_cells(lab: str) -> dict[str, list[str]]:
    """{test cell grade_id: the case ids its `check` calls name, in order} of the solution of `lab`."""
    return {cell.metadata["nbgrader"]["grade_id"]: re.findall(r'check\("([^"]+)"', cell.source)
            for cell in _cells(lab) if cell.metadata.get("nbgrader", {}).get("grade")}


def banned_pieces(lab: str, answers: dict[str, str]) -> set[str]:
    """The pieces whose reference the solution's cells of `lab`, `answers` in place, import or use: the grader's
    static scan (`find_forbidden`, as judge.py runs it) zeroes every test of them."""
    cells = [(str(cell.metadata.get("nbgrader", {}).get("grade_id")),
              answers.get(cell.metadata.get("nbgrader", {}).get("grade_id"), cell.source),
              cell.metadata.get("nbgrader", {}).get("grade_id") in answers)
             for cell in _cells(lab) if cell.cell_type == "code"]
    forbidden = forbidden_names(lab.split("_")[0])
    return {piece for finding in find_forbidden(cells, forbidden)
            for piece in pieces_lost(finding, finding.cell, forbidden)}  # each cell is labelled by its grade_id


def failures(lab: str, answers: dict[str, str]) -> dict[str, dict[str, str]]:
    """{test cell: {case id: its message after the case's description}} of every case that the solution of `lab`,
    `answers` in place, fails, each case of each test cell checked in-process (a graded kernel stops a cell at its
    first failure; every case is run here so that each message can be read); a banned piece's cases (see
    `banned_pieces`) say "banned". The full package is imported here, where a graded kernel sees a view without
    the lab's references (package_view.py): a student that calls one fails here only by the scan."""
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
                failed.setdefault(cell, {})[test_id] = after_description(str(failure), test_id)
    return failed


def check_blind_student(lab: str, path: Path, student: str, fails: set[str]) -> None:
    """Blind student `student` of `path` fails exactly the test cells `fails` of `lab`, and each visible case of
    a piece it wrote (its "# Piece:" line) that it fails says what its mistake is (matches its "# Names:" regex);
    a student that fails no such visible case must be named by each hidden one it fails (the graded feedback shows
    those messages). A piece that calls the student's (train_step its next_token_loss) fails too, with that
    piece's message; a banned student is named by the grader's line about the reference it uses."""
    names = blind_names(path)[student]
    assert names, f"{student} has no '# Names:' line: what a message that names its mistake matches"
    failed = failures(lab, blind_students(path)[student])
    assert set(failed) == fails, f"{student} fails {sorted(failed)}, expected {sorted(fails)}: {failed}"
    pieces = blind_pieces(path)[student]
    said = {test_id: message for by_case in failed.values() for test_id, message in by_case.items()
            if message != "banned" and CaseId.parse(test_id).piece in pieces}
    visible = {test_id: message for test_id, message in said.items() if not CaseId.parse(test_id).hidden}
    unnamed = {test_id: message for test_id, message in (visible or said).items() if not re.search(names, message)}
    assert not unnamed, f"{student}: these messages do not match {names!r}: {unnamed}"


def blind_round_trip(path: Path, fails: dict[str, set[str]]) -> dict[str, tuple[dict[str, str], set[str]]]:
    """WRONG's rows for the blind students of `path` that `fails` lists (student -> the test cells it fails): each
    graded by nbgrader as "blind-" + its name in lower case (a student id is [a-z0-9-]: att-scale-by-D grades as
    blind-att-scale-by-d)."""
    students = blind_students(path)
    rows = {f"blind-{student.lower()}": (students[student], set(cells)) for student, cells in fails.items()}
    bad = sorted(student for student in rows if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,63}", student))
    assert len(rows) == len(fails) and not bad, f"{path.name}: names that are no student id, or clash: {bad}"
    return rows


def check_named_mistake(lab: str, answers: dict[str, str], test_id: str, says: str) -> None:
    """The solution's cells of `lab` with `answers` in place fail case `test_id` with a message containing
    `says`."""
    assert says in diagnosis(lab, answers, test_id)


def blind_students(path: Path) -> dict[str, dict[str, str]]:
    """{student: {grade_id: code}} from a file of "# ==== STUDENT (file)" parts, each of "# %% GRADE_ID" cells."""
    return {student: {c[j]: c[j + 1] for j in range(1, len(c), 2)}
            for student, (_, c) in _blind_parts(path).items()}


def blind_names(path: Path) -> dict[str, str]:
    """{student: its "# Names: REGEX" line}: what a message that names the student's mistake matches."""
    return {student: names for student, (names, _) in _blind_parts(path).items()}


def blind_pieces(path: Path) -> dict[str, set[str]]:
    """{student: the pieces its "# Piece: a, b." line names}: the pieces it wrote."""
    parts = re.split(r"^# ==== (\S+).*\n", path.read_text(), flags=re.MULTILINE)
    return {student: set(re.findall(r"\w+", re.search(r"^# Piece: ([^.]*)", text, flags=re.MULTILINE).group(1)))
            for student, text in zip(parts[1::2], parts[2::2], strict=True)}


def _cells(lab: str) -> list[nbformat.NotebookNode]:
    return nbformat.read(ROOT / "solutions" / lab / f"{lab}.ipynb", as_version=4).cells


def _blind_parts(path: Path) -> dict[str, tuple[str, list[str]]]:
    parts = re.split(r"^# ==== (\S+).*\n", path.read_text(), flags=re.MULTILINE)
    found = {}
    for student, text in zip(parts[1::2], parts[2::2], strict=True):
        names = re.search(r"^# Names: (.*)$", text, flags=re.MULTILINE)
        found[student] = (names.group(1) if names else "", re.split(r"^# %% (\S+)\n", text, flags=re.MULTILINE))
    return found


@dataclass(frozen=True)
class Validation:
    """What `nbgrader validate` must report on one student's notebook: how many cells failed, the check of the first
    case that failed (the traceback shows its line, `check("NN.piece.variant", piece)`), and what its message says."""

    student: str  # one `RoundTrip.graded` grades (blind-x for the blind student x)
    failed_cells: int
    case: str
    says: str | tuple[str, ...]  # a snippet of the report, or several

    def snippets(self) -> tuple[str, ...]:
        """What the report must contain."""
        says = (self.says,) if isinstance(self.says, str) else self.says
        return (f'check("{self.case}", {CaseId.parse(self.case).piece})', *says)


def per_student(table: str) -> Callable[[Callable[..., None]], Callable[..., None]]:
    """Runs the test method once per student of the class's table named `table`, a dict keyed by student or a
    class method that returns one (see `PerStudent`)."""
    def mark(test: Callable[..., None]) -> Callable[..., None]:
        test.students_of = table
        return test
    return mark


TABLES = ("LAB", "TOTAL", "WRONG", "VALIDATE", "SAYS", "BLIND_FILE", "BLIND_FAILS", "NBGRADER_ONLY")
REQUIRED = ("LAB", "TOTAL", "WRONG", "VALIDATE")


class LabTables:
    """A lab's tables (`TABLES`), taken from the module of each test class that derives from this one: the tables
    are declared once, at the module's top level, and a table the class sets itself stays the class's."""

    LAB: str
    TOTAL: int
    WRONG: dict[str, tuple[dict[str, str], set[str]]]
    VALIDATE: Validation
    BLIND_FILE: Path | None = None
    BLIND_FAILS: ClassVar[dict[str, set[str]]] = {}  # blind student -> the test cells it fails
    NBGRADER_ONLY: ClassVar[dict[str, set[str]]] = {}  # blind students that only nbgrader grades

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__ == __name__:
            return
        module = vars(sys.modules[cls.__module__])
        for name in TABLES:
            if name in module and name not in vars(cls):
                setattr(cls, name, module[name])
        missing = [name for name in REQUIRED if not hasattr(cls, name)]
        if missing:
            raise TypeError(f"{cls.__module__} declares no {', '.join(missing)}: a lab's round trip needs each of "
                            f"{', '.join(REQUIRED)} at the module's top level")

    @classmethod
    def graded(cls) -> dict[str, tuple[dict[str, str], set[str]]]:
        """The students autograde grades besides the solution and the untouched release: WRONG's, and the blind
        students of BLIND_FAILS and NBGRADER_ONLY (`blind_round_trip`)."""
        if cls.BLIND_FILE is None:
            return cls.WRONG
        return cls.WRONG | blind_round_trip(cls.BLIND_FILE, cls.BLIND_FAILS | cls.NBGRADER_ONLY)


class PerStudent(LabTables):
    """Parametrises each method marked `per_student(TABLE)` over `student`, the sorted keys of its class's TABLE
    (pytest calls a test class's `pytest_generate_tests` for its methods)."""

    def pytest_generate_tests(self, metafunc: pytest.Metafunc) -> None:
        name = getattr(metafunc.function, "students_of", None)
        if name is not None:
            table = getattr(self, name)
            metafunc.parametrize("student", sorted(table() if callable(table) else table))


class NamedMistakes(PerStudent):
    """Each mistake of SAYS fails its case, in-process, with a message that says what it is."""

    # case -> {student: what the case's message says to it}: a student of WRONG, a blind student of BLIND_FILE by
    # its name, or blind-x (as the round trip grades it) where x is also a student of WRONG
    SAYS: dict[str, dict[str, str]]

    @classmethod
    def named(cls) -> dict[str, tuple[str, str]]:
        """SAYS by student: student -> (the case that names its mistake, what the case's message says)."""
        named = {}
        for case, says in cls.SAYS.items():
            for student, text in says.items():
                if student in named:
                    raise ValueError(f"{cls.__module__}: SAYS names {student} under {named[student][0]} and {case}: "
                                     "one case a student")
                named[student] = (case, text)
        return named

    @per_student("named")
    def test_each_named_mistake_gets_its_message(self, student: str) -> None:
        graded = self.graded()
        answers = graded[student][0] if student in graded else blind_students(self.BLIND_FILE)[student]
        check_named_mistake(self.LAB, answers, *self.named()[student])


class BlindStudents(PerStudent):
    """Each student of BLIND_FILE that BLIND_FAILS lists fails exactly its test cells, in-process, every case named
    (`check_blind_student`); `RoundTrip` has nbgrader grade them too."""

    BLIND_FILE: Path

    @per_student("BLIND_FAILS")
    def test_each_blind_student_fails_its_cells_named(self, student: str) -> None:
        check_blind_student(self.LAB, self.BLIND_FILE, student, self.BLIND_FAILS[student])


class RoundTrip(LabTables):
    """Real nbgrader on the lab: generate, autograde the class (`graded`) in one call, validate (each test marked
    slow)."""

    @pytest.fixture(scope="class")
    @classmethod
    def scores(cls, course: Course) -> dict[str, dict[str, float]]:
        return course.grade_class(cls.LAB, cls.graded())

    def autograded_cell(self, course: Course, student: str, grade_id: str) -> nbformat.NotebookNode:
        """Test cell `grade_id` of `student`'s notebook as autograde left it (after `scores`)."""
        [cell] = [cell for cell in course.notebook(f"grading/autograded/{student}", self.LAB).cells
                  if cell.metadata.get("nbgrader", {}).get("grade_id") == grade_id]
        return cell

    @pytest.mark.slow
    def test_solution_scores_full_marks(self, course: Course, scores: dict) -> None:
        assert scores["solution"] == course.expected_scores(self.LAB)
        assert sum(scores["solution"].values()) == self.TOTAL

    @pytest.mark.slow
    def test_release_is_exactly_what_nbgrader_generates(self, course: Course, scores: dict) -> None:
        """labs/LAB as committed is what `nbgrader generate_assignment` made of solutions/LAB in `scores`."""
        generated, committed = files(course.root / "labs" / self.LAB), files(ROOT / "labs" / self.LAB)
        drift = sorted(name for name in generated.keys() | committed.keys()
                       if generated.get(name) != committed.get(name))
        assert not drift, (f"labs/{self.LAB} differs from what solutions/{self.LAB} generates: {drift}. From the repo "
                           f"root run `nbgrader generate_assignment {self.LAB} --force` and commit labs/.")

    @pytest.mark.slow
    def test_untouched_release_scores_zero(self, course: Course, scores: dict) -> None:
        assert scores["untouched"] == course.expected_scores(self.LAB, set(course.expected_scores(self.LAB)))

    @pytest.mark.slow
    def test_each_mistake_loses_exactly_its_tests(self, course: Course, scores: dict) -> None:
        graded = self.graded()
        assert len(graded) >= 3
        expected = {student: course.expected_scores(self.LAB, fails) for student, (_, fails) in graded.items()}
        wrong = {student: sorted(cell for cell, points in scores[student].items() if points != want[cell])
                 for student, want in expected.items() if scores[student] != want}
        assert not wrong, f"these students' scores differ from WRONG's in these cells: {wrong}"

    @pytest.mark.slow
    def test_validate_reports_success_and_the_failing_test(self, course: Course) -> None:
        v = self.VALIDATE
        solved_name, wrong_name = f"{self.LAB}-solved", f"{self.LAB}-{v.student}"
        reports = course.validate({solved_name: course.solved(self.LAB),
                                   wrong_name: course.solved(self.LAB, self.graded()[v.student][0])})
        solved, report = reports[solved_name], reports[wrong_name]
        assert "Success! Your notebook passes all the tests." in solved
        assert "WARNING" not in solved, f"validate printed a warning a student cannot act on:\n{solved[:2000]}"
        assert "VALIDATION FAILED" not in solved
        assert f"VALIDATION FAILED ON {v.failed_cells} CELL(S)" in report
        for snippet in v.snippets():
            assert snippet in report, f"validate's report on {v.student} lacks {snippet!r}:\n{report[:2000]}"
