"""Every lesson notebook is committed clean: valid nbformat, a Python 3 kernel, executed top to bottom once
(outputs present, execution counts 1, 2, 3, ...), no error outputs, no saved widget state, no absolute paths."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))
ABSOLUTE_PATH = re.compile(r"(?<![\w.~])(/work|/root|/home|/Users|/tmp)/|[A-Za-z]:\\\\?Users")
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _text_of(output: dict) -> str:
    """The textual parts of one output (images are base64 and may contain anything)."""
    if output.get("output_type") == "stream":
        return output.get("text", "")
    if output.get("output_type") == "error":
        return "\n".join([output.get("ename", ""), output.get("evalue", ""), *output.get("traceback", [])])
    data = output.get("data", {})
    return "\n".join(str(v) for k, v in data.items() if not k.startswith("image/"))


def hygiene_problems(nb: nbformat.NotebookNode) -> list[str]:
    """Everything wrong with a lesson notebook, one sentence each; empty when it is clean."""
    problems = []
    try:
        nbformat.validate(nb)
    except nbformat.ValidationError as err:
        problems.append(f"not valid nbformat: {err.message}")
    kernel = nb.metadata.get("kernelspec", {})
    if kernel.get("name") != "python3" or kernel.get("language", "python") != "python":
        problems.append(f"kernelspec should be the Python 3 kernel 'python3', got {dict(kernel)}")
    if "widgets" in nb.metadata or WIDGET_STATE in str(nb.metadata):
        problems.append("saved widget state in the notebook metadata: delete metadata['widgets']")
    code_cells = [c for c in nb.cells if c.cell_type == "code"]
    counts = [c.get("execution_count") for c in code_cells]
    if counts != list(range(1, len(code_cells) + 1)):
        problems.append(f"execution counts should be 1..{len(code_cells)} (one run top to bottom), got {counts}")
    if code_cells and not any(c.get("outputs") for c in code_cells):
        problems.append("no outputs: lessons are committed executed, with their outputs")
    for number, cell in enumerate(nb.cells):
        if "widgets" in cell.get("metadata", {}):
            problems.append(f"cell {number}: saved widget state in the cell metadata")
        texts = [cell.source] + [_text_of(o) for o in cell.get("outputs", [])]
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                problems.append(f"cell {number}: error output {output.get('ename')}: {output.get('evalue')}")
        for text in texts:
            match = ABSOLUTE_PATH.search(text)
            if match:
                problems.append(f"cell {number}: absolute path {text[match.start():match.start() + 40]!r}")
                break
    return problems


def test_there_are_lessons() -> None:
    assert LESSONS, "no notebooks found in lessons/"


@pytest.mark.parametrize("path", LESSONS, ids=[p.name for p in LESSONS])
def test_lesson_notebook_is_clean(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    problems = hygiene_problems(nb)
    assert not problems, f"{path.name}:\n  " + "\n  ".join(problems)


def _clean_notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                           "language": "python"}})
    cell = nbformat.v4.new_code_cell("print(1)", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="1\n")]
    nb.cells = [nbformat.v4.new_markdown_cell("# title"), cell]
    return nb


def test_clean_notebook_passes() -> None:
    assert hygiene_problems(_clean_notebook()) == []


@pytest.mark.parametrize(
    ("defect", "expected"),
    [
        ("kernel", "kernelspec"),
        ("widgets", "widget state"),
        ("unexecuted", "execution counts"),
        ("out_of_order", "execution counts"),
        ("no_outputs", "no outputs"),
        ("path_in_source", "absolute path"),
        ("path_in_output", "absolute path"),
        ("error", "error output"),
        ("invalid", "not valid nbformat"),
    ],
)
def test_each_defect_is_reported(defect: str, expected: str) -> None:
    nb = _clean_notebook()
    cell = nb.cells[1]
    if defect == "kernel":
        nb.metadata.kernelspec.name = "ir"
    elif defect == "widgets":
        nb.metadata["widgets"] = {WIDGET_STATE: {"state": {}}}
    elif defect == "unexecuted":
        cell.execution_count = None
    elif defect == "out_of_order":
        nb.cells.append(nbformat.v4.new_code_cell("2", execution_count=1))
    elif defect == "no_outputs":
        cell.outputs = []
    elif defect == "path_in_source":
        cell.source = "open('/home/student/data.txt')"
    elif defect == "path_in_output":
        cell.outputs[0].text = "File /work/main/lessons/x.py, line 3\n"
    elif defect == "error":
        cell.outputs.append(nbformat.v4.new_output("error", ename="ValueError", evalue="boom", traceback=[]))
    elif defect == "invalid":
        cell["unexpected_key"] = 1
    problems = hygiene_problems(nb)
    assert any(expected in p for p in problems), f"{defect!r} not reported; got {problems}"
