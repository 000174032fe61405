"""The class report's scores from nbgrader's gradebook (SQLite or PostgreSQL, nbgrader's `db_url`), joined with the
grader's verdict records of the autograded notebooks (`class_report.read_class`).

The verdicts say which case passed and which mistake was named; the gradebook holds the score of every grade cell
as nbgrader counts it (`Grade.score`: a manual score an instructor gave in formgrader wins over the autograder's,
plus extra credit). Where the two disagree the gradebook wins: the cell's points are the gradebook's score, shared
equally among its cases, the student's score is the gradebook's total, and the page lists each difference. After
`--cluster` grading the gradebook is the shared PostgreSQL one and the notebooks are in the shared course folder: the
same join.

Read only: one SELECT over nbgrader's tables in a connection that never commits (nbgrader's `Gradebook()` would
create tables and a course row), a SQLite file opened read-only, so a wrong `--db` never makes one.
"""

from __future__ import annotations

import dataclasses
import html
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

TOLERANCE = 1e-6  # points: a cell's share of thirds adds up again to this


@dataclass(frozen=True)
class CellScore:
    """One grade cell of one student in the gradebook."""

    score: float  # nbgrader's Grade.score
    max_score: float
    manual: bool  # an instructor's manual score is set (it wins over the autograder's)


@dataclass(frozen=True)
class Difference:
    student: str
    cell: str
    verdicts: float | None  # the points of the grader's verdicts (None: no verdict recorded for the cell)
    gradebook: CellScore


@dataclass(frozen=True)
class GradebookJoin:
    """What the gradebook changed in the report."""

    url: str  # without its password
    students: int  # students with a submission of the lab in the gradebook
    differences: tuple[Difference, ...]
    only_gradebook: tuple[str, ...]  # in the gradebook, with no verdict recorded in an autograded notebook
    only_notebooks: tuple[str, ...]  # with verdicts, not in the gradebook: the grader's points are shown


def shown_url(db_url: str) -> str:
    """The URL without its password (the page may be shared)."""
    return re.sub(r"(://[^:/@]+):[^@/]*@", r"\1:***@", db_url)


def course_db_url(root: Path) -> str | None:
    """The course's gradebook: `c.CourseDirectory.db_url` of its nbgrader_config.py, else grading/gradebook.db; None
    when the course has none (a SQLite file that does not exist)."""
    config_file = root / "nbgrader_config.py"
    url = None
    if config_file.is_file():
        from traitlets.config import Config, PyFileConfigLoader

        config = Config(PyFileConfigLoader(config_file.name, str(root)).load_config())
        configured = config.CourseDirectory.get("db_url")
        url = configured if isinstance(configured, str) and configured else None
    url = url or f"sqlite:///{root / 'grading' / 'gradebook.db'}"
    return None if url.startswith("sqlite:///") and not Path(url[len("sqlite:///"):]).is_file() else url


def _engine(db_url: str) -> Any:
    from sqlalchemy import create_engine

    if db_url.startswith("sqlite:///"):
        path = Path(db_url[len("sqlite:///"):])
        if not path.is_file():
            raise SystemExit(f"--db {db_url}: no such SQLite gradebook: expected the file nbgrader's db_url names")
        return create_engine(f"sqlite:///file:{path}?mode=ro&uri=true")
    if not db_url.startswith(("sqlite", "postgresql")):
        raise SystemExit(f"--db {shown_url(db_url)}: expected nbgrader's db_url, sqlite:///PATH or "
                         "postgresql://user@host/db")
    return create_engine(db_url)


# nbgrader's tables (nbgrader.api: Grade, GradeCell, TaskCell, SubmittedNotebook, ...); nbgrader.api itself is not
# imported: importing the nbgrader package takes seconds (its server extensions), the report reads JSON otherwise
SCORES = """
SELECT sa.student_id, bc.name, g.auto_score, g.manual_score, g.extra_credit, gc.max_score, tc.max_score
FROM grade g
JOIN submitted_notebook sn ON sn.id = g.notebook_id
JOIN submitted_assignment sa ON sa.id = sn.assignment_id
JOIN assignment a ON a.id = sa.assignment_id
JOIN notebook n ON n.id = sn.notebook_id
JOIN base_cell bc ON bc.id = g.cell_id
LEFT JOIN grade_cells gc ON gc.id = g.cell_id
LEFT JOIN task_cells tc ON tc.id = g.cell_id
WHERE a.name = :lab AND n.name = :lab
"""


def nbgrader_score(auto: float | None, manual: float | None, extra: float | None) -> float:
    """nbgrader's `Grade.score`: the manual score if there is one, else the autograder's, plus extra credit; 0
    when neither is set."""
    if manual is None and auto is None:
        return 0.0
    return float(manual if manual is not None else auto) + float(extra or 0.0)


def gradebook_scores(db_url: str, lab: str) -> dict[str, dict[str, CellScore]]:
    """{student: {grade cell: its score}} of every submission of `lab` (its notebook `lab`) in the gradebook."""
    from sqlalchemy import text
    from sqlalchemy.exc import SQLAlchemyError

    engine = _engine(db_url)
    try:
        with engine.connect() as connection:  # never committed: read only
            rows = connection.execute(text(SCORES), {"lab": lab}).all()
    except SQLAlchemyError as err:
        raise SystemExit(f"--db {shown_url(db_url)}: the gradebook could not be read ({type(err).__name__}: "
                         f"{str(err).strip().splitlines()[0]}); expected an nbgrader gradebook (or --db none: the "
                         "autograded notebooks' verdicts alone)") from None
    finally:
        engine.dispose()
    scores: dict[str, dict[str, CellScore]] = defaultdict(dict)
    for student, cell, auto, manual, extra, grade_max, task_max in rows:
        max_score = grade_max if grade_max is not None else task_max if task_max is not None else 0.0
        scores[student][cell] = CellScore(nbgrader_score(auto, manual, extra), float(max_score), manual is not None)
    return dict(scores)


def join_gradebook(submissions: Iterable[Any], scores: dict[str, dict[str, CellScore]], url: str) -> GradebookJoin:
    """Give each submission (`class_report.Submission`) the gradebook's scores: a cell's verdicts share its
    gradebook score, the student's score is the gradebook's total; what differed is returned."""
    differences, only_notebooks, with_verdicts = [], [], set()
    for sub in submissions:
        if not sub.verdicts:
            continue
        with_verdicts.add(sub.student)
        if sub.student not in scores:
            only_notebooks.append(sub.student)
            continue
        mine = scores[sub.student]
        by_cell: dict[str, list[int]] = defaultdict(list)
        for i, verdict in enumerate(sub.verdicts):
            by_cell[verdict.cell].append(i)
        for cell, graded in sorted(mine.items()):
            indices = by_cell.get(cell, [])
            points = sum(sub.verdicts[i].points for i in indices) if indices else None
            if points is not None and abs(points - graded.score) <= TOLERANCE:
                continue
            differences.append(Difference(sub.student, cell, points, graded))
            for i in indices:
                sub.verdicts[i] = dataclasses.replace(sub.verdicts[i], points=graded.score / len(indices))
        sub.score = round(sum(graded.score for graded in mine.values()), 6)  # the cached property, set
    only_gradebook = sorted(set(scores) - with_verdicts)
    return GradebookJoin(shown_url(url), len(scores), tuple(differences), tuple(only_gradebook), tuple(only_notebooks))


def gradebook_section(join: GradebookJoin | None, names: dict[str, str], anonymous: bool = False) -> str:
    """The page's paragraph on the gradebook: where its scores came from, and each cell where the gradebook's score
    is not the grader's verdicts' (a manual grade in formgrader, or a gradebook and notebooks of different runs).
    Anonymous: every student by the pseudonym in `names`, and the gradebook not named (its path may name people)."""
    if join is None:
        return ""
    e = html.escape

    def name(student: str) -> str:
        return e(names[student])

    where = "" if anonymous else f" {e(join.url)}"
    out = [f"<h2>Gradebook</h2><p>Scores from the gradebook{where} ({join.students} submissions); where a "
           f"cell's score there is not the points of the grader's verdicts, the gradebook's counts: "
           f"{len(join.differences)} cells differ.</p>"]
    if join.differences:
        out.append("<table><tr><th>student</th><th>cell</th><th>grader's verdicts</th><th>gradebook</th><th>why"
                   "</th></tr>")
        for d in sorted(join.differences, key=lambda d: (names.get(d.student, d.student), d.cell)):
            why = ("a manual score (formgrader)" if d.gradebook.manual else
                   "no verdict recorded for the cell" if d.verdicts is None else
                   "the autograder's score differs: the notebook and the gradebook are of different runs")
            out.append(f"<tr><td>{name(d.student)}</td><td>{e(d.cell)}</td><td>"
                       f"{'-' if d.verdicts is None else f'{d.verdicts:g}'}</td><td>{d.gradebook.score:g} / "
                       f"{d.gradebook.max_score:g}</td><td>{why}</td></tr>")
        out.append("</table>")
    for students, what in ((join.only_gradebook, "in the gradebook, with no verdict in an autograded notebook (not "
                                                 "in the numbers above)"),
                           (join.only_notebooks, "not in the gradebook (the grader's points are shown)")):
        if students:
            out.append(f"<p>{len(students)} {what}: {', '.join(sorted(name(s) for s in students))}</p>")
    return "".join(out)
