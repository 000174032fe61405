"""The grader's verdict on each piece as nbgrader's automatic comment on the piece's solution cell, in the gradebook.

nbgrader keeps a comment (`nbgrader.api.Comment`: `auto_comment`, `manual_comment`) only for solution and task
cells: `Gradebook.add_submission` makes one per solution and task cell and none for a test cell, `find_comment`
looks among solution and task cells only, formgrader draws a comment box under those alone (its placeholder is the
auto_comment) and feedback (`GetGrades`) reads theirs. So a test cell's verdict goes on the solution cell of its
piece, which every lab names after the piece. `SaveAutoGrades` sets that auto_comment on every run ("No response."
for an untouched answer, else none); this step runs after it and adds a summary built from the judge's records of
this run (`judge.VERDICTS`, handed over in nbconvert's resources, never read from the notebook): the cases passed,
the failed case ids and the keys of the mistakes named. An instructor's manual comment still wins (`Comment.comment`).
"""

from __future__ import annotations

from collections import defaultdict

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.api import Gradebook, MissingEntry
from nbgrader.preprocessors import NbGraderPreprocessor

from .judge import VERDICTS


def piece_summary(piece: str, records: list[dict]) -> str:
    """One piece's verdict in a line of markdown: every id and key in code spans (a key's `_` is no emphasis)."""
    passed = sum(record["passed"] for record in records)
    if passed == len(records):
        return f"Grader's verdict on `{piece}`: all {len(records)} cases passed."
    failed = ", ".join(f"`{record['case']}`" for record in records if not record["passed"])
    mistakes = list(dict.fromkeys(record["mistake"] for record in records if record["mistake"]))
    named = f" Mistakes named: {', '.join(f'`{key}`' for key in mistakes)}." if mistakes else ""
    return f"Grader's verdict on `{piece}`: {passed} of {len(records)} cases passed. Failed: {failed}.{named}"


class CommentVerdicts(NbGraderPreprocessor):
    """After SaveAutoGrades: each piece's verdict as the auto_comment of its solution cell."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        by_piece: dict[str, list[dict]] = defaultdict(list)
        for record in resources.get(VERDICTS, []):
            by_piece[record["piece"]].append(record)
        pieces = [cell.metadata.nbgrader["grade_id"] for cell in nb.cells
                  if utils.is_solution(cell) and cell.metadata.nbgrader.get("grade_id") in by_piece]
        if not pieces:
            return nb, resources
        about = resources["nbgrader"]
        with Gradebook(about["db_url"]) as gradebook:
            for piece in pieces:
                try:
                    comment = gradebook.find_comment(piece, about["notebook"], about["assignment"], about["student"])
                except MissingEntry:
                    continue
                summary = piece_summary(piece, by_piece[piece])
                comment.auto_comment = f"{comment.auto_comment}\n\n{summary}" if comment.auto_comment else summary
            gradebook.db.commit()
        return nb, resources
