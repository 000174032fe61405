"""The grading report: what the grader did to a submission and why, for the instructor and the student.

Each step of `nbgrader autograde` adds lines to the notebook's metadata (`add_line`); the last step,
`WriteGradingReport`, puts them with the score of every test cell in two places:

    grading/reports/<lab>/<student>.txt     for the instructor (one file per submission, rewritten each run)
    a markdown cell at the top of the autograded notebook, so the formgrader and the feedback show it (the lines
    in a code block: they quote student-controlled text, which must not become markup)
"""

from __future__ import annotations

import re
from pathlib import Path

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_markdown_cell
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor
from traitlets import Unicode

KEY = "gptcourse"  # in the notebook's metadata: {"report": [lines]}
REPORT_CELL_ID = "gptcourse-grading-report"


def add_line(nb: NotebookNode, line: str) -> None:
    nb.metadata.setdefault(KEY, {}).setdefault("report", []).append(line)


def report_lines(nb: NotebookNode) -> list[str]:
    return list(nb.metadata.get(KEY, {}).get("report", []))


def as_code_block(text: str) -> str:
    """`text` as a fenced code block that it cannot close: report lines quote student-controlled text (file names,
    exception messages), which a markdown cell would otherwise render as markup, links or math."""
    fence = "`" * max(3, 1 + max((len(run) for run in re.findall(r"`+", text)), default=0))
    return f"{fence}text\n{text}\n{fence}"


def cell_label(cell: NotebookNode, index: int) -> str:
    """How the report names a cell: "cell 8 (solution 'attention')", "cell 9 ('test_attention')", "cell 4 (added
    by you)"."""
    grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
    if grade_id and utils.is_solution(cell):
        return f"cell {index + 1} (solution '{grade_id}')"
    if grade_id:
        return f"cell {index + 1} ('{grade_id}')"
    return f"cell {index + 1} (added by you)"


class WriteGradingReport(NbGraderPreprocessor):
    """Write the report file and put the report at the top of the autograded notebook (after SaveAutoGrades)."""

    directory = Unicode("grading/reports", help="Where reports go, relative to the course root").tag(config=True)

    def report_path(self, student: str, assignment: str, notebook: str) -> Path:
        """<directory>/<lab>/<student>.txt (<student>.<notebook>.txt for a lab of several notebooks)."""
        name = student if notebook == assignment else f"{student}.{notebook}"
        return Path(self.directory) / assignment / f"{name}.txt"

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        info = resources["nbgrader"]
        scores = []
        for cell in nb.cells:
            if utils.is_grade(cell):
                score, points = utils.determine_grade(cell, self.log)
                scores.append((cell.metadata.nbgrader["grade_id"], score, points))
        total = sum(s or 0 for _, s, _ in scores)
        points = sum(p for _, _, p in scores)
        lines = report_lines(nb)
        header = f"{info['student']} {info['assignment']}/{info['notebook']}: {total:g} / {points:g} points"
        cells = [f"  {grade_id}: {'needs manual grading' if s is None else f'{s:g}'} / {p:g}"
                 for grade_id, s, p in scores]
        text = "\n".join([header, *(f"- {line}" for line in lines), "tests:", *cells]) + "\n"
        path = self.report_path(info["student"], info["assignment"], info["notebook"])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        shown = "\n".join(f"- {line}" for line in lines) if lines else "- nothing unusual: every cell ran."
        cell = new_markdown_cell(f"**Grading report** ({total:g} / {points:g} points)\n\n{as_code_block(shown)}")
        cell.id = REPORT_CELL_ID
        nb.cells = [c for c in nb.cells if c.get("id") != REPORT_CELL_ID]
        nb.cells.insert(0, cell)
        return nb, resources
