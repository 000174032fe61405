"""The course in a real browser: a student in JupyterLab (lesson 01; a lab checked with nbgrader's Validate button)
and an instructor in the formgrader. A failure names the step it happened in; every scenario leaves a screenshot
of its last state in artifacts/browser/<test name>.png.

All scenarios share one JupyterLab server and one Chromium (session fixtures in conftest.py), so they live in this
one file: pytest-xdist's --dist loadfile runs them in a single worker.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import pytest
from lab_driver import (
    WIDGET_CONTROL,
    JupyterServer,
    LabPage,
    nudge_widget,
    output_fingerprint,
    step,
    wait_for_new_output,
)
from nbgrader.coursedir import CourseDirectory
from traitlets.config.loader import PyFileConfigLoader

if TYPE_CHECKING:
    from playwright.sync_api import FrameLocator

pytestmark = pytest.mark.browser

LESSON = "lessons/01_tokens_and_embeddings.ipynb"
LAB = "02_causal_attention"
SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|$)", re.MULTILINE)
# A mistake the labs' checks recognise: (text of the solution, the wrong text, words of the diagnostic it must get).
WRONG_ANSWER = ("tril", "triu", "on the wrong triangle")
STUDENTS = {"ada": ("Ada", "Lovelace"), "alan": ("Alan", "Turing")}


def _lab_notebook(course: Path, folder: str) -> Path:
    """labs/<LAB>/<LAB>.ipynb or solutions/<LAB>/<LAB>.ipynb in the course copy; skip if it is not there."""
    path = course / folder / LAB / f"{LAB}.ipynb"
    if not path.exists():
        pytest.skip(f"{folder}/{LAB}/{LAB}.ipynb is not in the repository")
    return path


def _is_solution(cell: nbformat.NotebookNode) -> bool:
    return cell.cell_type == "code" and cell.metadata.get("nbgrader", {}).get("solution", False)


def _student_answers(course: Path) -> dict[int, str]:
    """For each solution cell of the released lab (by its index): what a student who solved it has typed, i.e. the
    instructor's solution from solutions/ without nbgrader's BEGIN/END SOLUTION marker lines."""
    released = nbformat.read(_lab_notebook(course, "labs"), as_version=4)
    source = nbformat.read(_lab_notebook(course, "solutions"), as_version=4)
    typed = {c.metadata.nbgrader.grade_id: SOLUTION_MARKER.sub("", c.source) for c in source.cells if _is_solution(c)}
    return {i: typed[c.metadata.nbgrader.grade_id] for i, c in enumerate(released.cells) if _is_solution(c)}


class Instructor:
    """The instructor's side of the formgrader scenario, as nbgrader commands run from the course root:
    generate_assignment, a roster of two students, their submissions (ada: the lab solved as a student types it;
    alan: the untouched release), autograde. It runs in a background thread from the start of this module, so
    autograde (which executes both notebooks) overlaps with the student scenarios."""

    def __init__(self, server: JupyterServer) -> None:
        self.server = server
        self._pool = ThreadPoolExecutor(max_workers=1)
        self.released = self._pool.submit(self._release)
        self.graded = self._pool.submit(self._collect_and_autograde)

    def _nbgrader(self, *args: str) -> None:
        result = subprocess.run(
            [sys.executable, "-m", "nbgrader", *args],
            cwd=self.server.root, env=self.server.env, capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        if result.returncode != 0:
            command = " ".join(args)
            raise AssertionError(f"nbgrader {command} exited {result.returncode}:\n{result.stdout}{result.stderr}")

    def _release(self) -> tuple[dict[int, str], nbformat.NotebookNode]:
        """generate_assignment rewrites labs/<LAB>; read the answers and the release before any student edits it."""
        _lab_notebook(self.server.root, "solutions")  # skips the lab scenarios if the lab is not in the repository
        self._nbgrader("generate_assignment", LAB, "--force")
        return _student_answers(self.server.root), nbformat.read(_lab_notebook(self.server.root, "labs"), as_version=4)

    def student_answers(self) -> dict[int, str]:
        """The solved lab's answers by cell index, once generate_assignment has (re)written the lab."""
        answers, _ = self.released.result(timeout=300)
        return dict(answers)

    def _collect_and_autograde(self) -> None:
        answers, untouched = self.released.result()
        solved = nbformat.from_dict(untouched)
        for index, answer in answers.items():
            solved.cells[index].source = answer
        roster = self.server.root / "grading" / "students.csv"
        roster.write_text("id,first_name,last_name\n" + "".join(f"{i},{f},{n}\n" for i, (f, n) in STUDENTS.items()))
        self._nbgrader("db", "student", "import", str(roster))
        for student, notebook in (("ada", solved), ("alan", untouched)):
            folder = _submission_folder(self.server.root, student)
            folder.mkdir(parents=True)
            nbformat.write(notebook, folder / f"{LAB}.ipynb")
        self._nbgrader("autograde", LAB)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="module", autouse=True)
def instructor(jupyter_server: JupyterServer) -> Iterator[Instructor]:
    instructor = Instructor(jupyter_server)
    yield instructor
    instructor.close()


def test_student_runs_lesson_01(tab: LabPage, course_copy: Path) -> None:
    if not (course_copy / LESSON).exists():
        pytest.skip(f"{LESSON} is not in the repository")
    with step("open lesson 01 and wait for its kernel"):
        tab.open_notebook("lesson", LESSON)
    with step("Edit > Clear Outputs of All Cells (so every figure seen later comes from this run)"):
        tab.menu("Edit", "Clear Outputs of All Cells")
        tab.output_images().first.wait_for(state="detached")
    with step("Run > Run All Cells: every code cell runs, none shows an error"):
        tab.run_all_cells(timeout_ms=180_000)
    with step("the saved notebook holds no error output"):
        tab.save()
        saved = nbformat.read(course_copy / LESSON, as_version=4)
        failed = [i for i, c in enumerate(saved.cells) for o in c.get("outputs", []) if o.output_type == "error"]
        assert not failed, f"cells {failed} of the saved lesson hold an error output"
    with step("a figure renders"):
        figure = tab.output_images().first
        figure.scroll_into_view_if_needed()
        assert figure.evaluate("img => img.complete && img.naturalWidth > 0"), "the figure's image did not decode"
        figure.screenshot(path=str(tab.screenshot_path.with_name(f"{tab.screenshot_path.stem}-figure.png")))
    with step("an ipywidgets control appears"):
        widget_cell = tab.cells().filter(has=tab.page.locator(WIDGET_CONTROL)).first
        widget_cell.wait_for(timeout=30_000)
        widget_cell.scroll_into_view_if_needed()
        before = output_fingerprint(widget_cell)
    with step("changing the control changes the figure or text it drives"):
        action = nudge_widget(widget_cell)
        try:
            wait_for_new_output(widget_cell, before, timeout_ms=30_000)
        except Exception as exc:
            raise AssertionError(f"{action}, but the cell's output did not change") from exc
        tab.assert_no_error_output(f"after the widget update ({action})")


def _open_lab_and_answer(tab: LabPage, instructor: Instructor, mistake: tuple[str, str] | None = None) -> None:
    """Open the lab and type the solution into every solution cell; with `mistake` (text, replacement), make that
    mistake in the first answer that contains the text."""
    with step("wait for the instructor's nbgrader generate_assignment (it rewrites the lab)"):
        answers = instructor.student_answers()
    if mistake is not None:
        with step(f"make the mistake {mistake[0]!r} -> {mistake[1]!r} in the first answer that has {mistake[0]!r}"):
            index = min(i for i, answer in answers.items() if mistake[0] in answer)
            answers[index] = answers[index].replace(*mistake)
    with step(f"open labs/{LAB} and wait for its kernel"):
        tab.open_notebook(LAB, f"labs/{LAB}/{LAB}.ipynb")
    for index, answer in answers.items():
        with step(f"type an answer into solution cell {index}"):
            tab.set_cell_source(index, answer)


def _validate(tab: LabPage) -> tuple[str, str]:
    """Press nbgrader's Validate button; return the result dialog's verdict (its validation-* class) and text."""
    tab.notebook().locator(".validate-button").click()
    message = tab.page.locator(".jp-Dialog #validation-message")
    message.wait_for(timeout=120_000)
    verdict = next(c for c in (message.get_attribute("class") or "").split() if c.startswith("validation-"))
    return verdict, message.inner_text()


def test_student_validates_a_solved_lab(tab: LabPage, instructor: Instructor) -> None:
    _open_lab_and_answer(tab, instructor)
    with step("press Validate and read the result"):
        verdict, text = _validate(tab)
    with step("the result is success"):
        assert verdict == "validation-success", f"expected success, the dialog says ({verdict}):\n{text}"
        assert "passes all the tests" in text, text


def test_student_sees_the_diagnostic_for_a_wrong_answer(tab: LabPage, instructor: Instructor) -> None:
    right, wrong, diagnostic = WRONG_ANSWER
    _open_lab_and_answer(tab, instructor, mistake=(right, wrong))
    with step("press Validate and read the result"):
        verdict, text = _validate(tab)
    with step("the result is a failure that carries gptcourse.checks' diagnostic"):
        assert verdict == "validation-failed", f"expected a failure, the dialog says ({verdict}):\n{text}"
        assert diagnostic in text, f"the dialog lacks the diagnostic {diagnostic!r}:\n{text}"


def _submission_folder(course: Path, student: str) -> Path:
    """Where nbgrader_config.py says a student's submission of the lab goes (it must be inside the course copy)."""
    config = PyFileConfigLoader("nbgrader_config.py", path=str(course)).load_config()
    coursedir = CourseDirectory(config=config)
    folder = Path(coursedir.format_path(coursedir.submitted_directory, student, LAB))
    if not folder.resolve().is_relative_to(course.resolve()):
        raise AssertionError(f"nbgrader_config.py puts submissions at {folder}, outside the course copy {course}")
    return folder


def _max_score(course: Path) -> float:
    source = nbformat.read(_lab_notebook(course, "solutions"), as_version=4)
    graded = [c.metadata.nbgrader for c in source.cells if c.metadata.get("nbgrader", {}).get("grade")]
    return sum(cell.get("points", 0) for cell in graded)


def _table_row(frame: FrameLocator, text: str) -> dict[str, str]:
    """The formgrader table row that mentions `text`, as {column header: cell text}."""
    row = frame.locator("table tbody tr", has_text=text).first
    row.wait_for(timeout=30_000)
    headers = row.evaluate("r => [...r.closest('table').tHead.rows[0].cells].map(c => c.innerText.trim())")
    cells = row.evaluate("r => [...r.cells].map(c => c.innerText.trim())")
    if len(headers) != len(cells):
        raise AssertionError(f"a formgrader table row does not match its header: {headers} vs {cells}")
    return dict(zip(headers, cells, strict=True))


def test_instructor_sees_autograded_scores_in_formgrader(tab: LabPage, instructor: Instructor) -> None:
    with step("nbgrader: generate the lab, add two students, collect their submissions, autograde"):
        instructor.graded.result(timeout=900)
    with step("open Nbgrader > Formgrader"):
        tab.open_lab("formgrader")
        tab.menu("Nbgrader", "Formgrader")
        formgrader = tab.page.frame_locator("#formgrader iframe")
    with step(f"Manage Assignments lists {LAB} with 2 submissions"):
        row = _table_row(formgrader, LAB)
        assert row.get("# Submissions") == "2", f"the formgrader's row for {LAB}: {row}"
    with step("Manage Students shows both students with their scores"):
        formgrader.locator('a:text-is("Manage Students")').click()
        total = _max_score(instructor.server.root)
        for student, (first, last) in STUDENTS.items():
            row = _table_row(formgrader, f"{last}, {first}")
            assert row.get("Student ID") == student, f"the formgrader's row for {first} {last}: {row}"
            score = f"{total if student == 'ada' else 0:g} / {total:g}"
            assert row.get("Overall Score") == score, f"expected {score} for {student}, the formgrader's row: {row}"
