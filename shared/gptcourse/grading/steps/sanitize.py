"""Repairing a submission before it runs, so a broken notebook gets a defined score instead of aborting.

Two pieces in nbgrader's "sanitize" pass of `nbgrader autograde`, and the hook that runs before it:

`TolerantNotebookExporter` (Autograde.exporter_class) reads the submitted file; a file that is not a notebook
(malformed JSON, not UTF-8, not nbformat) becomes an empty notebook with a report line, instead of an exception
that leaves the student "needs manual grading". Old formats (nbformat 3) are upgraded by nbformat. A lab notebook
missing from the submission (`expect_lab_notebooks`, nbgrader's pre-convert hook, adds it to the list) reads as
an empty notebook too, so a folder holding only a misnamed copy is graded 0 with a report line that names the
file to rename, instead of failing with nbgrader's "No notebooks found".

`RestoreCells` first discards the submission's metadata but each cell's nbgrader metadata (`trusted_metadata`: a
student writes the file, so report lines or any other `gptcourse` state pre-seeded there would otherwise read as
the grader's), then rebuilds the notebook from the gradebook's cells, in the order of the source notebook:
- every instructor cell (markdown, setup, tests) comes from the gradebook: deleted, retyped, edited or duplicated
  ones are restored (the report says which), and hidden tests are back in their cells;
- a solution cell keeps the student's source (its first copy, if duplicated; a retyped one runs as code again);
  a deleted solution cell comes back empty, so its tests fail with "not defined" rather than running stub code
  over the student's own definitions;
- cells the student added (or copies, or the second half of a split cell) keep their place after the instructor
  cell they followed, as plain cells with no nbgrader metadata; they run, and they are read for forbidden imports.
Grading the rebuilt notebook is therefore grading the student's code in the instructor's notebook, whatever
happened to the file's structure.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Any

import nbformat
from nbconvert.exporters import NotebookExporter
from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_raw_cell
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import ClearHiddenTests, NbGraderPreprocessor

from .report import add_line

UNREADABLE = "gptcourse_unreadable"  # resources key (the grader's state, not the file's): why it could not be read
MISSING = "the lab's notebook is not in the submission"  # the UNREADABLE reason of a missing notebook


def expect_lab_notebooks(source_directory: str, notebooks: list[str]) -> None:
    """nbgrader's pre-convert hook: add to `notebooks`, nbgrader's list of one submission's notebooks (changed in
    place), every notebook of the lab that the submission lacks.

    The lab's notebooks are those in `source_directory`/<lab>/, the lab being the name of the submission's
    folder. nbgrader then zeroes a missing notebook's grades (its own rule) and converts it like any other: the
    exporter reads it as an empty notebook, so it gets restored cells, a 0 per test and a report line.
    """
    for folder in sorted({os.path.dirname(path) for path in notebooks}):
        lab = os.path.basename(folder)
        for source in sorted(glob.glob(os.path.join(source_directory, lab, "*.ipynb"))):
            expected = os.path.join(folder, os.path.basename(source))
            if expected not in notebooks:
                notebooks.append(expected)


class TolerantNotebookExporter(NotebookExporter):
    """A NotebookExporter whose reader turns an unreadable file into an empty notebook plus a report line."""

    def from_filename(self, filename: str, resources: ResourcesDict | None = None,
                      **kw: Any) -> tuple[str, ResourcesDict]:
        if os.path.exists(filename):
            return super().from_filename(filename, resources, **kw)
        folder, name = os.path.split(filename)
        resources = resources if resources is not None else ResourcesDict()
        resources["metadata"] = ResourcesDict(name=os.path.splitext(name)[0], path=folder)
        resources[UNREADABLE] = MISSING
        return self.from_notebook_node(new_notebook(), resources, **kw)

    def from_file(self, file_stream: Any, resources: ResourcesDict | None = None,
                  **kw: Any) -> tuple[str, ResourcesDict]:
        try:
            nb = nbformat.reads(file_stream.read(), as_version=4)
            if not isinstance(nb.get("cells"), list):
                raise ValueError("it has no list of cells")
        except Exception as err:
            nb = new_notebook()
            resources = resources if resources is not None else ResourcesDict()
            resources[UNREADABLE] = f"{type(err).__name__}: {err}".splitlines()[0].split(": '")[0][:200]  # no excerpt
        return self.from_notebook_node(nb, resources, **kw)


def trusted_metadata(nb: NotebookNode) -> None:
    """Keep of the submitted notebook's metadata only what the grader checks against the release: each cell's
    nbgrader metadata (its grade_id, matched with the gradebook's cells; the rest of it is rebuilt from there).
    The notebook's own metadata goes (its kernelspec is set from the gradebook by OverwriteKernelspec), and so does
    every other key of a cell: what the report says is the grader's state alone."""
    nb.metadata = NotebookNode()
    for cell in nb.cells if isinstance(nb.get("cells"), list) else []:
        if isinstance(cell, dict):
            metadata = cell.get("metadata")
            nbgrader = metadata.get("nbgrader") if isinstance(metadata, dict) else None
            cell["metadata"] = NotebookNode(nbgrader=nbgrader) if isinstance(nbgrader, dict) else NotebookNode()


def _source(cell: Any) -> str:
    source = cell.get("source", "") if isinstance(cell, dict) else ""
    return "".join(source) if isinstance(source, list) else str(source)


def _grade_id(cell: Any) -> str | None:
    try:
        grade_id = cell["metadata"]["nbgrader"]["grade_id"]
    except (KeyError, TypeError):
        return None
    return grade_id if isinstance(grade_id, str) else None


def _released(source: str) -> str:
    """What the student was given for an instructor cell: its source without the hidden-test region."""
    cell = NotebookNode(source=source)
    try:
        ClearHiddenTests()._remove_hidden_test_region(cell)
    except RuntimeError:
        return source
    return cell.source


def _plain(cell: Any, number: int) -> NotebookNode:
    """A student-added cell as a fresh cell of its type, without outputs or nbgrader metadata."""
    kind = cell.get("cell_type") if isinstance(cell, dict) else None
    make = {"code": new_code_cell, "markdown": new_markdown_cell}.get(kind, new_raw_cell)
    new = make(_source(cell))
    new.id = f"added-{number}"
    return new


class RestoreCells(NbGraderPreprocessor):
    """Rebuild the submission from the gradebook's cells and the student's solution and added cells."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        trusted_metadata(nb)
        info = resources["nbgrader"]
        with Gradebook(info["db_url"]) as gb:
            try:
                notebook = gb.find_notebook(info["notebook"], info["assignment"])
            except MissingEntry:
                return nb, resources
            sources = {c.name: (c.cell_type, c.source, c.locked, c.checksum) for c in notebook.source_cells}
            points = {c.name: c.max_score for c in notebook.grade_cells}
            solutions = {c.name for c in notebook.solution_cells}
            known = {n.name for n in notebook.assignment.notebooks}
        folder = resources.get("metadata", {}).get("path")
        extra = sorted(name for name in (os.listdir(folder) if folder and os.path.isdir(folder) else [])
                       if name.endswith(".ipynb") and name[:-len(".ipynb")] not in known)
        expected = f"{info['notebook']}.ipynb"
        reason = resources.get(UNREADABLE)
        if reason == MISSING:
            only = f", only {', '.join(extra)}, which is not graded" if extra else ""
            rename = f". If {extra[0]} is the lab, rename it to {expected} and grade again" if len(extra) == 1 else ""
            add_line(nb, f"no {expected} was submitted{only}: graded as an empty submission{rename}")
        elif extra:
            add_line(nb, f"not graded: {', '.join(extra)} (the lab is graded from {expected} only)")
        if reason and reason != MISSING:
            add_line(nb, f"the submitted notebook could not be read ({reason}): graded as an empty submission")
        order = self._instructor_order(info, sources, nb)

        first: dict[str, Any] = {}  # grade_id -> the student's first cell with it
        count: dict[str, int] = {}
        added: dict[str | None, list[Any]] = {}  # anchor grade_id (None: before any) -> cells after it
        anchor = None
        for cell in nb.cells:
            grade_id = _grade_id(cell)
            if grade_id in sources:
                count[grade_id] = count.get(grade_id, 0) + 1
                if grade_id not in first:
                    first[grade_id] = cell
                    anchor = grade_id
                    continue
                if not sources[grade_id][2]:  # a copy (or split half) of a solution cell: the student's code
                    added.setdefault(anchor, []).append(cell)
                continue
            added.setdefault(anchor, []).append(cell)

        cells = []
        number = 0
        for grade_id in [None, *order]:
            if grade_id is not None:
                cells.append(self._restore(nb, grade_id, sources[grade_id], first.get(grade_id),
                                           count.get(grade_id, 0), grade_id in solutions, points.get(grade_id),
                                           bool(reason)))
            for cell in added.get(grade_id, []):
                number += 1
                cells.append(_plain(cell, number))
        nb.cells = cells
        nb.nbformat, nb.nbformat_minor = 4, 5
        return nb, resources

    def _instructor_order(self, info: dict[str, str], sources: dict[str, Any], nb: NotebookNode) -> list[str]:
        """The grade_ids in the source notebook's order (the student's order if the source cannot be read)."""
        order: list[str] = []
        coursedir = getattr(getattr(self.parent, "parent", None), "coursedir", None)
        if coursedir is not None:
            path = os.path.join(coursedir.format_path(coursedir.source_directory, ".", info["assignment"]),
                                f"{info['notebook']}.ipynb")
            try:
                order = [g for c in nbformat.read(path, as_version=4).cells if (g := _grade_id(c)) in sources]
            except Exception:
                order = []
        if not order:
            order = list(dict.fromkeys(g for c in nb.cells if (g := _grade_id(c)) in sources))
        return order + sorted(set(sources) - set(order))

    @staticmethod
    def _restore(nb: NotebookNode, grade_id: str, source_cell: tuple, student: Any, copies: int,
                 is_solution: bool, points: float | None, reading: bool) -> NotebookNode:
        """The course's cell `grade_id`; `reading`: the file was unreadable (nothing to say about its cells)."""
        cell_type, source, locked, checksum = source_cell
        if is_solution:
            if student is None:
                if not reading:
                    add_line(nb, f"solution cell '{grade_id}' is missing from the submission: graded as unanswered")
                source = "# (this solution cell was missing from the submission)"
            else:
                source = _source(student)
                if student.get("cell_type") != cell_type:
                    add_line(nb, f"solution cell '{grade_id}' was changed to {student.get('cell_type')}: "
                                 f"graded as {cell_type}")
            if copies > 1:
                add_line(nb, f"solution cell '{grade_id}' appears {copies} times: all copies run, in order")
        elif not reading:
            if student is None:
                add_line(nb, f"cell '{grade_id}' was deleted: restored from the course")
            elif student.get("cell_type") != cell_type:
                add_line(nb, f"cell '{grade_id}' was changed from {cell_type} to {student.get('cell_type')}: "
                             "restored from the course")
            elif _source(student).strip() != _released(source).strip():
                add_line(nb, f"cell '{grade_id}' is locked but was edited: restored from the course (changes "
                             "there are not graded)")
            if copies > 1:
                add_line(nb, f"cell '{grade_id}' appears {copies} times: graded once")
        metadata = {"grade": points is not None, "grade_id": grade_id, "locked": bool(locked),
                    "schema_version": 3, "solution": is_solution, "task": False, "checksum": checksum}
        if points is not None:
            metadata["points"] = points
        make = new_code_cell if cell_type == "code" else new_markdown_cell
        cell = make(source, metadata={"nbgrader": metadata})
        if locked:
            cell.metadata.update(deletable=False, editable=False)
        cell.id = re.sub(r"[^A-Za-z0-9_-]", "-", grade_id)[:64]  # nbformat's rule for cell ids
        return cell
