"""The course in a real browser: a student in JupyterLab (lesson 01; a lab checked with nbgrader's Validate button)
and an instructor in the formgrader, where a graded submission's cells that try to run script must not run it (nor
in the student's feedback HTML). A failure names the step it happened in; every scenario leaves a screenshot
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import nbformat
import pytest
from lab_driver import (
    WIDGET_CONTROL,
    JupyterServer,
    LabPage,
    RequestRecorder,
    nudge_widget,
    output_fingerprint,
    step,
    wait_for_new_output,
)
from nbgrader.coursedir import CourseDirectory
from traitlets.config.loader import PyFileConfigLoader

if TYPE_CHECKING:
    from playwright.sync_api import FrameLocator, Page

pytestmark = pytest.mark.browser

LESSON = "lessons/01_tokens_and_embeddings.ipynb"
LAB = "02_causal_attention"
SOLUTION_MARKER = re.compile(r"^[ \t]*### (BEGIN|END) SOLUTION[ \t]*(\n|$)", re.MULTILINE)
# A mistake the labs' checks recognise: (text of the solution, the wrong text, words of the diagnostic it must get).
WRONG_ANSWER = ("tril", "triu", "on the wrong triangle")
STUDENTS = {"ada": ("Ada", "Lovelace"), "alan": ("Alan", "Turing"), "mallory": ("Mallory", "Hacker"),
            "grace": ("Grace", "Hopper")}
SOLVED = {"ada", "mallory", "grace"}  # alan hands in the untouched release
# What every hostile payload does if it ever runs: flag the page, retitle it, pop a dialog, and read the Jupyter
# server's file listing with the viewer's session, reporting the answer to a marker URL the test watches.
PWN_JS = ("top.__pwned=1;top.document.title='pwned';top.alert('pwned');"
          "top.fetch('/api/contents').then(r=>top.fetch('/pwned-marker?status='+r.status))")
PWN_MARKER = "/pwned-marker"
# mallory: the solved lab plus cells that try to run script every way a notebook can carry it (each markup string
# goes into the cell's Python source through repr, so its quotes need no care).
HOSTILE_DISPLAYS = [
    ("HTML", f'<img src="x" onerror="{PWN_JS}">'),
    ("HTML", f"<script>{PWN_JS}</script><b>bold</b>"),
    ("Javascript", PWN_JS),
    ("SVG", f'<svg xmlns="http://www.w3.org/2000/svg" onload="{PWN_JS}"><script>{PWN_JS}</script>'
            '<rect width="9" height="9"/></svg>'),
    ("HTML", f'<iframe srcdoc="<script>{PWN_JS}</script>"></iframe>'),
    ("Markdown", f'<img src="y" onerror="{PWN_JS}"> [click me](javascript:{PWN_JS})'),
    # CSS that would fetch from the test's listener (@LISTENER@) if a kept property took an image (issue 49)
    ("HTML", "<span style=\"color: image-set('@LISTENER@/css-image-set.gif' 1x); background-color: "
             "-webkit-image-set(url(@LISTENER@/css-webkit.gif) 1x)\">styled</span>"
             "<b style='color: \\75rl(@LISTENER@/css-escaped.gif); font-weight: var(--x)'>b</b>"),
    ("SVG", '<svg xmlns="http://www.w3.org/2000/svg"><rect width="9" height="9" fill="url(@LISTENER@/css.svg#a)" '
            "style=\"fill: image-set('@LISTENER@/css-svg.gif' 1x)\"/></svg>"),
]
HOSTILE_CELLS = [
    ("code", "from IPython.display import HTML, SVG, Javascript, Markdown, display"),
    *(("code", f"display({kind}({markup!r}))") for kind, markup in HOSTILE_DISPLAYS),
    ("code", "import ipywidgets\n"
             "display({'application/vnd.jupyter.widget-view+json': {'model_id': 'x', 'version_major': 2, "
             "'version_minor': 0}, 'text/plain': 'a widget'}, raw=True)\nipywidgets.IntSlider()"),
    ("markdown", f'My notes <img src="z" onerror="{PWN_JS}"> and [click me](javascript:{PWN_JS}).'),
    ("markdown", "Styled <span style=\"color: image-set('@LISTENER@/css-markdown.gif' 1x)\">notes</span>."),
]
FIGURE_CELL = "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('my loss')\nplt.show()"


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


def _new_cell(kind: str, source: str) -> nbformat.NotebookNode:
    return nbformat.v4.new_code_cell(source) if kind == "code" else nbformat.v4.new_markdown_cell(source)


class Instructor:
    """The instructor's side of the formgrader scenarios, as nbgrader commands run from the course root:
    generate_assignment, a roster of four students, their submissions (ada: the lab solved as a student types it;
    alan: the untouched release; mallory: solved, plus cells that try to run script in whoever views the graded
    notebook; grace: solved, plus a matplotlib figure), one autograde. It runs in a background thread from the
    start of this module, so autograde (which executes the notebooks) overlaps with the student scenarios."""

    def __init__(self, server: JupyterServer, listener_url: str) -> None:
        self.server, self.listener_url = server, listener_url
        self._pool = ThreadPoolExecutor(max_workers=1)
        self.released = self._pool.submit(self._release)
        self.graded = self._pool.submit(self._collect_and_autograde)

    def nbgrader(self, *args: str) -> None:
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
        self.nbgrader("generate_assignment", LAB, "--force")
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
        self.nbgrader("db", "student", "import", str(roster))
        hostile, figure = nbformat.from_dict(solved), nbformat.from_dict(solved)
        hostile.cells += [_new_cell(kind, source.replace("@LISTENER@", self.listener_url))
                          for kind, source in HOSTILE_CELLS]
        figure.cells.append(nbformat.v4.new_code_cell(FIGURE_CELL))
        for student, notebook in (("ada", solved), ("alan", untouched), ("mallory", hostile), ("grace", figure)):
            folder = _submission_folder(self.server.root, student)
            folder.mkdir(parents=True)
            nbformat.write(notebook, folder / f"{LAB}.ipynb")
        self.nbgrader("autograde", LAB)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="module", autouse=True)
def instructor(jupyter_server: JupyterServer, request_recorder: RequestRecorder) -> Iterator[Instructor]:
    instructor = Instructor(jupyter_server, request_recorder.url)
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
    with step(f"Manage Assignments lists {LAB} with {len(STUDENTS)} submissions"):
        row = _table_row(formgrader, LAB)
        assert row.get("# Submissions") == str(len(STUDENTS)), f"the formgrader's row for {LAB}: {row}"
    with step("Manage Students shows every student with their score"):
        formgrader.locator('a:text-is("Manage Students")').click()
        total = _max_score(instructor.server.root)
        for student, (first, last) in STUDENTS.items():
            row = _table_row(formgrader, f"{last}, {first}")
            assert row.get("Student ID") == student, f"the formgrader's row for {first} {last}: {row}"
            score = f"{total if student in SOLVED else 0:g} / {total:g}"
            assert row.get("Overall Score") == score, f"expected {score} for {student}, the formgrader's row: {row}"


@dataclass
class ScriptWatch:
    """What a page did that only a student's script would do: dialogs it opened, marker and /api/contents requests
    it sent (from any frame). Requests to any host but the test's server are refused (the feedback's CDN links)."""

    dialogs: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)

    def install(self, page: Page) -> None:
        page.on("dialog", lambda dialog: (self.dialogs.append(dialog.message), dialog.dismiss()))
        page.on("request", lambda request: self.requests.append(request.url)
                if PWN_MARKER in request.url or "/api/contents" in request.url else None)
        page.route(re.compile(r"^https?://(?!127\.0\.0\.1[:/])"), lambda route: route.abort())

    def assert_no_script_ran(self, page: Page, what: str) -> None:
        """Click every "click me" link (a javascript: URL, if one is left), wait for late fetches, then check."""
        for link in page.locator("a", has_text="click me").all():
            link.click()
        page.wait_for_timeout(2_000)
        flag, title = page.evaluate("() => [window.__pwned, document.title]")
        assert flag is None and "pwned" not in title, f"a student's script ran in {what} (title {title!r})"
        assert not self.dialogs, f"a student's script opened dialogs in {what}: {self.dialogs}"
        assert not self.requests, f"a student's script sent requests from {what}: {self.requests}"


def _submission_page(course: Path, student: str) -> str:
    """The formgrader's page of a student's graded lab, where Manual Grading > the lab > the submission leads."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'grading' / 'gradebook.db'}") as gradebook:
        return f"formgrader/submissions/{gradebook.find_submission_notebook(LAB, LAB, student).id}/"


def _graded_score(course: Path, student: str) -> float:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'grading' / 'gradebook.db'}") as gradebook:
        return gradebook.find_submission(LAB, student).score


def _figure_shows(page: Page) -> bool:
    """A PNG figure (a data URL <img>) that has decoded to a non-empty image."""
    figure = page.locator('img[src^="data:image/png"]').first
    figure.wait_for(timeout=30_000)
    figure.scroll_into_view_if_needed()
    return figure.evaluate("img => img.complete && img.naturalWidth > 0")


def test_graded_notebooks_run_no_student_script(tab: LabPage, instructor: Instructor,
                                                request_recorder: RequestRecorder) -> None:
    """mallory's cells try script every way (img onerror, <script>, a Javascript output, SVG onload, an iframe
    srcdoc, markdown with raw HTML and a javascript: link, a widget) and CSS values that fetch (image-set, escapes):
    none runs, and nothing reaches the test's listener, where the instructor (the
    formgrader, with their session) or the student (the feedback HTML) look, and mallory still scores full marks;
    grace's matplotlib figure still shows."""
    course = instructor.server.root
    with step("nbgrader: autograde, then generate feedback for mallory and grace"):
        instructor.graded.result(timeout=900)
        for student in ("mallory", "grace"):
            instructor.nbgrader("generate_feedback", LAB, f"--student={student}", "--force")
    with step("mallory's hostile cells cost no points, and the report names each one that showed active content"):
        total = _max_score(course)
        assert _graded_score(course, "mallory") == total
        report = (course / "grading" / "reports" / LAB / "mallory.txt").read_text()
        cleaned = [line for line in report.splitlines() if "(added by you):" in line and " removed from " in line]
        assert len(cleaned) == len(HOSTILE_CELLS) - 1, f"expected a line per hostile cell but the import:\n{report}"
    shots = tab.screenshot_path
    for student, where in (("mallory", "formgrader"), ("mallory", "feedback"), ("grace", "formgrader"),
                           ("grace", "feedback")):
        page = tab.page.context.new_page()
        watch = ScriptWatch()
        watch.install(page)
        with step(f"open {student}'s {where} page"):
            if where == "formgrader":
                page.goto(tab.url(_submission_page(course, student)))
            else:
                page.goto((course / "grading" / "feedback" / student / LAB / f"{LAB}.html").as_uri())
            page.locator("text=Grading report").first.wait_for(timeout=30_000)
        if student == "mallory":
            with step(f"no script of mallory's ran in the {where} page, and her CSS fetched nothing"):
                watch.assert_no_script_ran(page, f"mallory's {where} page")
                assert request_recorder.paths == [], f"mallory's CSS fetched from {where}: {request_recorder.paths}"
                assert page.locator("text=removed from its output").count(), "the report does not say what went"
        else:
            with step(f"grace's figure shows in the {where} page"):
                assert _figure_shows(page), f"grace's figure did not decode in the {where} page"
        with step(f"the grader's verdict on each piece is {student}'s comment in the {where}"):
            # steps/verdict_comments.py: nbgrader's auto_comment of each solution cell, which the formgrader's API
            # serves to its comment boxes and the feedback shows as "Comments:" under each answer
            if where == "formgrader":
                submission = _submission_page(course, student).split("/")[2]
                served = page.request.get(tab.url(f"formgrader/api/comments?submission_id={submission}")).json()
                comments = [c["auto_comment"] or "" for c in served]
            else:
                comments = page.locator(".panel-footer").all_text_contents()
            assert sum("Grader's verdict on " in c for c in comments) == 3, comments  # lab 02's 3 pieces
        page.screenshot(path=str(shots.with_name(f"{shots.stem}-{student}-{where}.png")), full_page=True)
        page.close()
