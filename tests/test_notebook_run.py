"""Notebooks run headless without nbclient's Output-widget capture (`gptcourse.notebook_run`): a cell that shows an
`interact` keeps what it printed as its own output, and no widget state is sent to the kernel mid-cell (the send
that can leave a run hung). Checked for the lesson timer's runner and for the grader's executor."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbgrader_course import sandbox_problem

from gptcourse.grading.box.sandbox import Sandbox
from gptcourse.grading.steps.execute import RobustExecute, with_box
from gptcourse.notebook_run import run_all

INTERACT = ('import ipywidgets as widgets\n'
            'widgets.interact(lambda text: print("ids", list(text.encode())), text=widgets.Text(value="ab"));')
PRINTED = "ids [97, 98]\n"


def _notebook(folder: Path) -> Path:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(INTERACT)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "widget.ipynb")
    return folder / "widget.ipynb"


def _printed(cell: nbformat.NotebookNode) -> str:
    return "".join(out.get("text", "") for out in cell.outputs if out.output_type == "stream")


def test_the_lesson_runner_keeps_a_widgets_output_in_its_cell(tmp_path):
    nb = run_all(_notebook(tmp_path))
    assert _printed(nb.cells[0]) == PRINTED  # with the capture, it would be inside the widget's state instead


@pytest.mark.skipif(sandbox_problem() is not None, reason=f"the grader's box cannot start: {sandbox_problem()}")
def test_the_graders_executor_keeps_a_widgets_output_in_its_cell(tmp_path):
    nb = nbformat.read(_notebook(tmp_path), as_version=4)
    with Sandbox().start_box([str(tmp_path)], lab="01_tokens_and_embeddings") as box:
        with_box(RobustExecute, box)(timeout=300).preprocess(
            nb, {"metadata": {"path": str(tmp_path)}, "nbgrader": {"assignment": "01_tokens_and_embeddings"}})
    assert _printed(nb.cells[0]) == PRINTED
