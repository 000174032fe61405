"""`Course`: a copy of the repo's nbgrader course in a temporary folder, driven by the real nbgrader CLI.

A plain module (not conftest.py) so that test files can import it: `from nbgrader_course import Course`.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def sandbox_problem() -> str | None:
    """Why graded kernels cannot be boxed on this machine (no Linux, no bubblewrap, no user namespaces), or None."""
    from gptcourse.grading.box.sandbox import SandboxUnavailable, require_sandbox

    try:
        require_sandbox(None, [str(ROOT)])
    except SandboxUnavailable as unavailable:
        return str(unavailable)
    return None


@functools.cache
def empty_gradebook() -> bytes:
    """A new SQLite gradebook of this course, as `nbgrader` creates on its first command; made once per test
    process. (nbgrader creates one by running `alembic` in a subprocess, seconds each time.)"""
    from nbgrader.api import Gradebook

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "gradebook.db"
        with Gradebook(f"sqlite:///{path}", course_id=course_id()):
            pass
        return path.read_bytes()


def course_id() -> str:
    """c.CourseDirectory.course_id of the committed nbgrader_config.py."""
    from traitlets.config import Config, PyFileConfigLoader

    config = Config(PyFileConfigLoader("nbgrader_config.py", str(ROOT)).load_config())
    return config.CourseDirectory.course_id


class Course:
    """The course directory (nbgrader_config.py, solutions/, labs/) copied to `root`; nothing touches the repo.

    Where the sandbox cannot start (macOS, a Linux without bubblewrap) the copy grades without it, so the round
    trips still test the grading itself there; tests/test_grading_sandbox.py skips, and CI (which has
    bubblewrap and fails on a skip) runs everything boxed.

    The copy starts with an empty SQLite gradebook (`sqlite_gradebook=False`: without one, for a course whose
    gradebook is elsewhere)."""

    def __init__(self, root: Path, sqlite_gradebook: bool = True) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "nbgrader_config.py", root)
        if sqlite_gradebook:
            (root / "grading").mkdir()
            (root / "grading" / "gradebook.db").write_bytes(empty_gradebook())
        if sandbox_problem() is not None:
            with open(root / "nbgrader_config.py", "a", encoding="utf-8") as config:
                config.write("\nc.Sandbox.allow_unsandboxed = True  # added by tests/nbgrader_course.py\n")
        shutil.copytree(ROOT / "solutions", root / "solutions")
        shutil.copytree(ROOT / "labs", root / "labs")

    def nbgrader(self, *args: str, ok: bool = True, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        """`nbgrader ARGS` from the course root, as an instructor types it (in `env`, default this process's);
        output in .stdout (stderr merged)."""
        proc = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=self.root, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600, env=env)
        if ok and proc.returncode != 0:
            raise AssertionError(f"nbgrader {' '.join(args)} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
        return proc

    def notebook(self, folder: str, lab: str) -> nbformat.NotebookNode:
        return nbformat.read(self.root / folder / lab / f"{lab}.ipynb", as_version=4)

    def solved(self, lab: str, answers: dict[str, str] | None = None) -> nbformat.NotebookNode:
        """The released lab as a student hands it in: each solution cell holds `answers[grade_id]`, or else the
        solution's code (without its BEGIN/END SOLUTION marker lines)."""
        reference = {c.metadata.nbgrader["grade_id"]: c.source for c in self.notebook("solutions", lab).cells}
        nb = self.notebook("labs", lab)
        for cell in nb.cells:
            grade_id = cell.metadata.nbgrader["grade_id"]
            if cell.metadata.nbgrader.get("solution"):
                default = "\n".join(line for line in reference[grade_id].splitlines()
                                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)
                cell.source = (answers or {}).get(grade_id, default)
        return nb

    def submit(self, student: str, lab: str, nb: nbformat.NotebookNode) -> None:
        folder = self.root / "grading" / "submitted" / student / lab
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / f"{lab}.ipynb")

    def grade_class(self, lab: str, wrong: dict[str, tuple[dict[str, str], set[str]]]) -> dict[str, dict[str, float]]:
        """Release `lab`, submit the solution ("solution"), the untouched release ("untouched") and one student
        per known mistake (`wrong`: student -> (answers, failing tests)), autograde them in one nbgrader call,
        and return every student's score per test cell."""
        self.nbgrader("generate_assignment", lab, "--force")
        self.submit("solution", lab, self.solved(lab))
        self.submit("untouched", lab, self.notebook("labs", lab))
        for student, (answers, _) in wrong.items():
            self.submit(student, lab, self.solved(lab, answers))
        self.nbgrader("autograde", lab)
        return self.scores(lab)

    def scores(self, lab: str) -> dict[str, dict[str, float]]:
        """{student: {test cell grade_id: score}} from the gradebook."""
        from nbgrader.api import Gradebook

        with Gradebook(f"sqlite:///{self.root / 'grading' / 'gradebook.db'}") as gb:
            return {sub.student.id: {grade.name: grade.score for grade in sub.notebooks[0].grades}
                    for sub in gb.find_assignment(lab).submissions}

    def expected_scores(self, lab: str, failing: set[str] = frozenset()) -> dict[str, float]:
        """Full points for every test cell, 0 for those in `failing`."""
        points = {cell.metadata.nbgrader["grade_id"]: float(cell.metadata.nbgrader["points"])
                  for cell in self.notebook("solutions", lab).cells if cell.metadata.nbgrader.get("grade")}
        assert failing <= set(points), f"unknown test cells {failing - set(points)}"
        return {grade_id: 0.0 if grade_id in failing else p for grade_id, p in points.items()}

    def validate(self, notebooks: dict[str, nbformat.NotebookNode]) -> dict[str, str]:
        """`nbgrader validate` on every notebook (saved as validate/NAME.ipynb), in one call: {NAME: its report}."""
        folder = self.root / "validate"
        folder.mkdir(exist_ok=True)
        paths = {name: folder / f"{name}.ipynb" for name in notebooks}
        for name, path in paths.items():
            nbformat.write(notebooks[name], path)
        output = self.nbgrader("validate", *(str(p.relative_to(self.root)) for p in paths.values()), ok=False).stdout
        # nbgrader announces each notebook with "[ValidateApp | INFO] Validating '<path>'", then its report
        starts = sorted((output.index(f"Validating '{path}'"), name) for name, path in paths.items())
        ends = [start for start, _ in starts[1:]] + [len(output)]
        return {name: output[start:end] for (start, name), end in zip(starts, ends, strict=True)}
