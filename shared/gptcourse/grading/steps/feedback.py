"""Feedback without hidden tests: `nbgrader generate_feedback` shows the diagnostics, never a hidden test's source.

The autograded notebook keeps the hidden tests (the instructor's formgrader shows them); `HideHiddenTests`
runs in GenerateFeedback and cuts every `### BEGIN HIDDEN TESTS` ... `### END HIDDEN TESTS` region from the
cells, as the released lab shows them. Test outputs were already rewritten by the judge (messages only).
"""

from __future__ import annotations

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader.preprocessors import ClearHiddenTests


class HideHiddenTests(ClearHiddenTests):
    """ClearHiddenTests for feedback: cut the regions from every cell, grade cell or not, without complaining."""

    def preprocess_cell(self, cell: NotebookNode, resources: ResourcesDict,
                        cell_index: int) -> tuple[NotebookNode, ResourcesDict]:
        try:
            self._remove_hidden_test_region(cell)
        except RuntimeError:  # an unbalanced region (a cell edited by hand): show none of the cell
            cell.source = "# (hidden tests)"
        return cell, resources
