"""A piece's name is one string everywhere: the function or class the solution cell defines, that cell's grade_id,
its forbidden references' key, the middle of its case ids, the object its test cells check, and the round trip's
WRONG table (tests/test_labs_NN.py). Read here from the notebooks' and tests' own text, not from the package."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import nbformat
import pytest

from gptcourse.grading.cases import CaseId, lab_cases, registry
from gptcourse.grading.piece import forbidden_names, lab_pieces

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = {path.parent.name[:2]: path for path in sorted((ROOT / "solutions").glob("*/*.ipynb"))}
CHECK_CALL = re.compile(r'check\("([^"]+)", (\w+)\)')
registry()
DECLARED = sorted(lab for lab in SOLUTIONS if lab_pieces(lab))


def _cells(lab: str) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(SOLUTIONS[lab], as_version=4).cells if c.cell_type == "code"]


def _defined(source: str) -> set[str]:
    return {node.name for node in ast.parse(source).body if isinstance(node, (ast.FunctionDef, ast.ClassDef))}


@pytest.mark.parametrize("lab", DECLARED)
def test_a_piece_has_one_name_in_notebook_cases_forbidden_and_round_trip(lab):
    names = [piece.name for piece in lab_pieces(lab)]
    solutions = [c for c in _cells(lab) if c.metadata.nbgrader.get("solution")]
    assert [c.metadata.nbgrader["grade_id"] for c in solutions] == names
    for cell in solutions:
        assert cell.metadata.nbgrader["grade_id"] in _defined(cell.source)
    assert set(forbidden_names(lab)) <= set(names)
    assert {CaseId.parse(case.id).piece for case in lab_cases(lab)} == set(names)
    tests = [c for c in _cells(lab) if c.metadata.nbgrader.get("grade") and not c.metadata.nbgrader.get("solution")]
    for cell in tests:
        for test_id, obj in CHECK_CALL.findall(cell.source):
            assert CaseId.parse(test_id).piece == obj, test_id
            assert re.fullmatch(f"test_{obj}(_[a-z0-9_]+)?", cell.metadata.nbgrader["grade_id"]), test_id
    round_trip = importlib.import_module(f"test_labs_{lab}")
    test_cells = {c.metadata.nbgrader["grade_id"] for c in tests}
    for student, (wrote, fails) in round_trip.WRONG.items():
        assert set(wrote) <= set(names), student
        assert fails <= test_cells, student


def test_the_names_are_what_the_notebooks_say():
    """The registry and a hand-written reading agree for lab 10 (the test above could not tell a wrong parser)."""
    assert [piece.name for piece in lab_pieces("10")] == ["padding_mask", "last_real_token", "response_labels",
                                                            "bradley_terry_loss", "LoRALinear"]
    assert CaseId.parse("10.padding_mask.hidden_mixed") == CaseId("10", "padding_mask", "hidden_mixed")
    assert CaseId.parse("10.padding_mask.hidden_mixed").hidden and not CaseId.parse("10.LoRALinear.sequence").hidden
    for bad in ("10.bt", "10..visible", "x.padding_mask.visible", "10.padding_mask.visible.extra", None):
        with pytest.raises(ValueError, match=r"is not a test id: expected 'NN\.piece\.variant'"):
            CaseId.parse(bad)


def test_the_add_a_piece_example_of_the_package_runs():
    import doctest

    import gptcourse.grading

    result = doctest.testmod(gptcourse.grading)
    assert result.failed == 0 and result.attempted >= 8


def test_no_lab_module_imports_another_lab():
    """What labs share lives in grading/fixtures.py or grading/piece.py: a lab reads as itself."""
    for path in sorted((ROOT / "shared/gptcourse/grading/labs").glob("lab*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                source = "." * node.level + (node.module or "")
                assert not re.match(r"(\.|gptcourse\.grading\.labs\.)lab\d", source), f"{path.name} imports {source}"
