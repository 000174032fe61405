"""CSV that a spreadsheet reads as data: every CSV the course writes (grades, similarity, the class report) goes
through `spreadsheet_safe` (`spreadsheet.py`, which imports no nbgrader).

A student chooses their id (an exchange folder name, an LMS file name) and, on some LMSs, their name and email,
so a cell may begin with a formula sign (`=1+1`, `@SUM(3)`) or hold a separator, a quote or a line break that
would forge a row for someone else. `spreadsheet_safe` prefixes a formula with `'`; Python's csv writer quotes
any cell holding a separator, quote or line break, so each row stays one row.

`SafeCsvExportPlugin` is `nbgrader export`'s CSV (ExportApp.plugin_class in nbgrader_config.py): nbgrader's own
columns and rows (a student on the roster without a submission scores 0), written with both guards.
"""

from __future__ import annotations

import csv

from nbgrader.api import Gradebook, MissingEntry
from nbgrader.plugins.export import CsvExportPlugin

from .spreadsheet import spreadsheet_safe

COLUMNS = ["assignment", "duedate", "timestamp", "student_id", "last_name", "first_name", "email", "raw_score",
           "late_submission_penalty", "score", "max_score"]


class SafeCsvExportPlugin(CsvExportPlugin):
    """nbgrader's grades.csv with every text cell guarded and quoted (see the module)."""

    def export(self, gradebook: Gradebook) -> None:
        students = {str(s) for s in self.student}
        assignments = {str(a) for a in self.assignment}
        with open(self.to or "grades.csv", "w", newline="", encoding="utf-8") as out:
            writer = csv.writer(out, lineterminator="\n")  # nbgrader's line ends
            writer.writerow(COLUMNS)
            for assignment in gradebook.assignments:
                if assignments and assignment.name not in assignments:
                    continue
                for student in gradebook.students:
                    if students and student.id not in students:
                        continue
                    try:
                        sub = gradebook.find_submission(assignment.name, student.id)
                        timestamp, raw, penalty = sub.timestamp, sub.score, sub.late_submission_penalty
                        score = max(0.0, sub.score - penalty)
                    except MissingEntry:
                        timestamp, raw, penalty, score = "", 0.0, 0.0, 0.0
                    text = [assignment.name, assignment.duedate, timestamp, student.id, student.last_name,
                            student.first_name, student.email]
                    writer.writerow([spreadsheet_safe("" if value is None else str(value)) for value in text]
                                    + [raw, penalty, score, assignment.max_score])
