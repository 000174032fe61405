"""`gptcourse report LAB`: what a class got wrong, from the verdicts the grader recorded (docs/grading.md, "After
grading").

The judge (`steps/judge.py`) writes beside each test cell's message a record per case: lab, piece, case id,
passed, its outcome, the points earned and the key of the known mistake it recognised (`checks.Mistake`), under
the course's key in the cell's metadata of the autograded notebook. Only the grader writes there: intake drops a
submission's metadata and the judge drops the course's key from every cell before it writes its own. This module
reads those records from `grading/autograded/*/LAB/LAB.ipynb` (nothing else of a notebook counts: a record is
kept only on a grade cell whose restored source names its case), takes the scores from the gradebook where there is
one (`--db`, by default the course's: `gradebook_verdicts.py`), and writes, under `grading/reports/LAB/` (with
`--anonymous`, `grading/reports/LAB-anonymous/`, a folder of its own that no named page shares):

    index.html        the score histogram, pass rates per piece and per case (visible and hidden), the students
                      who passed every visible case of a piece and failed a hidden one, the named mistakes ranked
                      by how many students made them (each with its message and the lesson section that teaches
                      it: `mistake_lessons.py`, else its piece's), the submissions that did not run to the end and
                      why, and with `--compare` what changed since another round
    report.csv        one row per student and case (a spreadsheet pivots it); no cell reads as a formula
    students/ID.html  one student's pieces, mistakes and messages, for office hours (not written with --anonymous)

Student ids are hostile text: every one is escaped, the page has no script and a Content-Security-Policy that
allows no script and no request (figures are PNGs inside the page), and `--anonymous` replaces each id with a
pseudonym that is the same on every run of the same course (a keyed hash of the id with the course secret).
"""

from __future__ import annotations

import argparse
import base64
import csv
import functools
import hashlib
import html
import io
import json
import os
import re
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..case_ids import CaseId
from .gradebook_verdicts import GradebookJoin, course_db_url, gradebook_scores, gradebook_section, join_gradebook
from .mistake_lessons import mistake_sections, plain_heading
from .spreadsheet import spreadsheet_safe

KEY = "gptcourse"  # steps/report.py's KEY: the course's namespace in notebook metadata
MAX_NOTEBOOK_BYTES = 20_000_000  # a larger autograded notebook is listed as unreadable
MAX_TEXT = 1200  # characters of a recorded message or report line shown
STOPPED = ("not_run", "forged")  # outcomes of a case whose cell did not run to the end
PUBLIC_SECRET = "gptcourse-public"  # cases.PUBLIC_SECRET: pseudonyms when the course has no secret
_CHECK = re.compile(r"""check\(\s*["'](\d\d\.[A-Za-z_][A-Za-z0-9_]*\.[A-Za-z0-9_]+)["']""")
_MISTAKE = re.compile(r"[A-Za-z0-9_.:=+-]{1,160}")  # checks.Mistake's keys, fixtures.switch_key's
_SAFE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")  # intake.STUDENT_ID: a page is named by an id only if it is one
OUTCOME_WORDS = {"passed": "passed", "wrong": "wrong result", "error": "raised an error",
                 "reference": "used the reference", "stale": "stale result", "unreadable": "unreadable result",
                 "skipped": "not run (an earlier test of its cell failed)", "not_run": "not run",
                 "forged": "forged output"}  # payload.OUTCOMES, as the page says them


@dataclass(frozen=True)
class Verdict:
    """The grader's record of one case of one student."""

    case: str
    piece: str
    hidden: bool
    passed: bool
    outcome: str
    mistake: str | None
    points: float
    max_points: float
    message: str
    cell: str = ""  # the grade cell that holds the record (its grade_id)


@dataclass
class Submission:
    """One student's autograded notebook of the lab: the verdicts and the grader's report lines."""

    student: str
    verdicts: list[Verdict] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    problem: str = ""  # why nothing could be read ("" when the notebook was read)

    @functools.cached_property
    def score(self) -> float:  # read once every verdict is in
        return round(sum(v.points for v in self.verdicts), 6)  # a cell's points split in thirds add up again

    def stopped(self) -> list[str]:
        """Why this submission did not run to the end ([] when it did): the notebook's problem, the grader's report
        lines and the messages of the cases that were not run."""
        if self.problem:
            return [self.problem]
        if not self.verdicts:
            return ["no test was recorded: the notebook held none of the lab's test cells", *self.lines]
        stops = [v.message for v in self.verdicts if v.outcome in STOPPED]
        return [*self.lines, *dict.fromkeys(stops)] if stops else []


# ---------------------------------------------------------------------------------------------------------------
# Reading: the grader's records, each checked against the grade cell that holds it


def _text(value: Any, limit: int = MAX_TEXT) -> str:
    return value[:limit] if isinstance(value, str) else ""


def _verdict(record: Any, cell_ids: set[str], lab: str, cell: str = "") -> Verdict | None:
    """A record as a Verdict, or None when it is not one the grader wrote for this cell and lab."""
    if not isinstance(record, dict) or not isinstance(record.get("case"), str) or record["case"] not in cell_ids:
        return None
    try:
        case = CaseId.parse(record["case"])
    except ValueError:
        return None
    if case.lab != lab:
        return None
    mistake = record.get("mistake")
    numbers = [record.get("points"), record.get("max_points")]
    if not all(type(n) in (int, float) and 0 <= n < 1e6 for n in numbers) or type(record.get("passed")) is not bool:
        return None
    return Verdict(record["case"], case.piece, case.hidden, record["passed"],
                   record.get("outcome") if record.get("outcome") in OUTCOME_WORDS else "wrong",
                   mistake if isinstance(mistake, str) and _MISTAKE.fullmatch(mistake) else None,
                   float(numbers[0]), float(numbers[1]), _text(record.get("message")), cell)


def read_submission(student: str, path: Path, lab: str) -> Submission:
    """The grader's verdicts in an autograded notebook (read as JSON, never run)."""
    sub = Submission(student)
    try:
        if path.is_symlink() or not path.is_file():
            sub.problem = "no autograded notebook: autograde did not finish this submission"
            return sub
        if path.stat().st_size > MAX_NOTEBOOK_BYTES:
            sub.problem = f"unreadable: larger than {MAX_NOTEBOOK_BYTES:,} bytes"
            return sub
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        sub.problem = f"unreadable: {type(err).__name__}"
        return sub
    cells = nb.get("cells") if isinstance(nb, dict) else None
    meta = nb.get("metadata") if isinstance(nb, dict) else None
    lines = meta.get(KEY, {}).get("report") if isinstance(meta, dict) and isinstance(meta.get(KEY), dict) else None
    sub.lines = [_text(line) for line in lines if isinstance(line, str)] if isinstance(lines, list) else []
    for cell in cells if isinstance(cells, list) else []:
        cell_meta = cell.get("metadata") if isinstance(cell, dict) else None
        grading = cell_meta.get("nbgrader") if isinstance(cell_meta, dict) else None
        if not isinstance(grading, dict) or not grading.get("grade") or grading.get("solution"):
            continue
        source = cell.get("source")
        source = "".join(s for s in source if isinstance(s, str)) if isinstance(source, list) else _text(source, 10**5)
        records = cell_meta.get(KEY, {}).get("verdicts") if isinstance(cell_meta.get(KEY), dict) else None
        ids = set(_CHECK.findall(source))
        for record in records if isinstance(records, list) else []:
            verdict = _verdict(record, ids, lab, _text(grading.get("grade_id"), 200))
            if verdict is not None:
                sub.verdicts.append(verdict)
    return sub


def read_class(grading: Path, lab: str) -> list[Submission]:
    """Every submission of `lab` under `grading`/autograded (and those submitted but never autograded), by
    student id; a dot-name is none (nbgrader's globs skip them: `gptcourse autograde` keeps its resume records in
    autograded/.gptcourse-batch/LAB/)."""
    number = lab_number(lab)
    folders = {}
    for step in ("submitted", "autograded"):
        base = grading / step
        if base.is_dir():
            folders |= {p.name: p for p in base.iterdir()
                        if (p / lab).is_dir() and not p.is_symlink() and not p.name.startswith(".")}
    return [read_submission(student, grading / "autograded" / student / lab / f"{lab}.ipynb", number)
            for student in sorted(folders)]


def lab_number(lab: str) -> str:
    match = re.fullmatch(r"(\d\d)_[a-z0-9_]+", lab)
    if match is None:
        raise SystemExit(f"{lab!r} is not a lab name: expected NN_topic, e.g. 02_causal_attention")
    return match.group(1)


# ---------------------------------------------------------------------------------------------------------------
# The numbers


@dataclass(frozen=True)
class MistakeRow:
    key: str
    pieces: tuple[str, ...]
    students: tuple[str, ...]
    message: str  # the diagnosis of its first occurrence (the case's header line cut)


@dataclass(frozen=True)
class PieceRow:
    piece: str
    visible_passed: int  # students who passed every visible case of the piece
    hidden_passed: int  # ... every hidden case
    graded: int  # students with a verdict on the piece
    visible_not_hidden: tuple[str, ...]  # passed every visible case, failed a hidden one


@dataclass
class ClassReport:
    lab: str
    submissions: list[Submission]
    max_score: float
    names: dict[str, str]  # student id -> the name shown (itself, or a pseudonym)
    sections: dict[str, str]  # piece -> the lesson section it comes from
    taught: dict[str, str] = field(default_factory=dict)  # mistake key -> the section that teaches it
    gradebook: GradebookJoin | None = None  # the scores' source when a gradebook was read

    def section_of(self, mistake: str | None, piece: str) -> str:
        """The lesson section that teaches `mistake` (`mistake_lessons.TAUGHT_IN`), else its piece's."""
        return self.taught.get(mistake or "") or self.sections.get(piece, "")

    @property
    def graded(self) -> list[Submission]:
        return [s for s in self.submissions if s.verdicts]

    def histogram(self) -> list[tuple[float, float, int]]:
        return score_bins([s.score for s in self.graded], self.max_score)

    def cases(self) -> list[tuple[str, bool, int, int]]:
        """(case, hidden, students who passed it, students with a verdict on it), in the lab's order."""
        passed: Counter[str] = Counter()
        seen: dict[str, bool] = {}
        for sub in self.graded:
            for v in sub.verdicts:
                seen.setdefault(v.case, v.hidden)
                passed[v.case] += v.passed
        counts = Counter(v.case for sub in self.graded for v in sub.verdicts)
        return [(case, hidden, passed[case], counts[case]) for case, hidden in seen.items()]

    def pieces(self) -> list[PieceRow]:
        rows = {}
        for sub in self.graded:
            by_piece: dict[str, list[Verdict]] = defaultdict(list)
            for v in sub.verdicts:
                by_piece[v.piece].append(v)
            for piece, verdicts in by_piece.items():
                row = rows.setdefault(piece, [0, 0, 0, []])
                visible = all(v.passed for v in verdicts if not v.hidden)
                hidden = all(v.passed for v in verdicts if v.hidden)
                row[0] += visible
                row[1] += hidden
                row[2] += 1
                if visible and not hidden:
                    row[3].append(sub.student)
        return [PieceRow(piece, a, b, n, tuple(who)) for piece, (a, b, n, who) in rows.items()]

    def mistakes(self) -> list[MistakeRow]:
        """The named mistakes, the one most students made first (then by key). A student counts once per piece,
        for the first mistake the grader named in it (its cases in the lab's order, visible first): a later case
        may name a consequence (a mask that hides the diagonal makes attention's first row NaN) or, on inputs
        too small to tell two mistakes apart (T = 1), the other one."""
        students: dict[str, set[str]] = defaultdict(set)
        pieces: dict[str, dict[str, None]] = defaultdict(dict)
        message: dict[str, str] = {}
        for sub in self.graded:
            named: dict[str, Verdict] = {}
            for v in sub.verdicts:
                if v.mistake is not None:
                    named.setdefault(v.piece, v)
            for v in named.values():
                students[v.mistake].add(sub.student)
                pieces[v.mistake][v.piece] = None
                message.setdefault(v.mistake, diagnosis(v.message))
        rows = [MistakeRow(key, tuple(pieces[key]), tuple(sorted(who)), message[key]) for key, who in students.items()]
        return sorted(rows, key=lambda row: (-len(row.students), row.key))

    def stopped(self) -> list[tuple[str, list[str]]]:
        return [(sub.student, why) for sub in self.submissions if (why := sub.stopped())]


def unwrapped(message: str) -> str:
    """A verdict's message as the judge wrote it: `payload.judged` wraps its lines for nbgrader validate, each
    continued with two spaces."""
    return message.replace("\n  ", " ")


def diagnosis(message: str) -> str:
    """A failure's message without its first line, "CASE failed: what the case tests" (the same for every
    student), unwrapped."""
    return unwrapped(message).split("\n", 1)[-1]


def score_bins(scores: Iterable[float], max_score: float) -> list[tuple[float, float, int]]:
    """(low, high, count): one bin per point up to 20 points, else 20 equal bins; each bin holds low <= score <
    high, the last one its high too (full marks)."""
    scores = list(scores)
    top = max([max_score, *scores, 1.0])
    width = 1.0 if top <= 20 else top / 20
    edges = [i * width for i in range(round(top / width) + 1)]
    if edges[-1] < top:
        edges.append(top)
    counts = [0] * (len(edges) - 1)
    for score in scores:
        index = min(int(score // width), len(counts) - 1)
        counts[index] += 1
    return [(edges[i], edges[i + 1], n) for i, n in enumerate(counts)]


def pseudonyms(students: Iterable[str], secret: str) -> dict[str, str]:
    """Stable pseudonyms: a keyed hash of each id with the course secret (the same course gives the same names on
    every run; without the secret a name does not give its id back)."""
    key = hashlib.sha256(secret.encode()).digest()
    return {s: "student-" + hashlib.blake2b(s.encode("utf-8", "surrogateescape"), key=key, digest_size=4).hexdigest()
            for s in students}


def course_secret(root: Path) -> str:
    """GPTCOURSE_SECRET, else the first line of grading/secret.txt (as nbgrader_config.py reads it), else the
    public default."""
    if os.environ.get("GPTCOURSE_SECRET"):
        return os.environ["GPTCOURSE_SECRET"]
    path = root / "grading" / "secret.txt"
    if path.is_file() and not path.is_symlink():
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        if lines and lines[0].strip():
            return lines[0].strip()
    return PUBLIC_SECRET


def lesson_sections(root: Path, lab: str, pieces: Iterable[str]) -> dict[str, str]:
    """piece -> "lesson NN, <heading>": the lesson's heading above the first code cell that defines or calls the
    piece (where the lesson builds it); "" when the lesson has none."""
    number = lab_number(lab)
    found = sorted((root / "lessons").glob(f"{number}_*.ipynb"))
    if not found:
        return {}
    try:
        cells = json.loads(found[0].read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError):
        return {}
    sections = {}
    for piece in pieces:
        pattern = re.compile(rf"\b(def|class)\s+{re.escape(piece)}\b|\b{re.escape(piece)}\(")
        heading = ""
        for cell in cells:
            source = "".join(cell.get("source", []))
            if cell.get("cell_type") == "markdown":
                heads = [line.lstrip("#").strip() for line in source.splitlines() if line.startswith("## ")]
                heading = heads[-1] if heads else heading
            elif cell.get("cell_type") == "code" and pattern.search(source):
                break
        else:
            heading = ""
        sections[piece] = f"lesson {number}, {plain_heading(heading)}" if heading else ""
    return sections


def build(root: Path, lab: str, anonymous: bool = False, grading: Path | None = None,
          db_url: str | None = None) -> ClassReport:
    """The report's numbers for `lab` of the course at `root` (or of another round's `grading` folder), with the
    scores of the gradebook at `db_url` where one is given (`gradebook_verdicts`)."""
    submissions = read_class(grading or root / "grading", lab)
    joined = join_gradebook(submissions, gradebook_scores(db_url, lab), db_url) if db_url else None
    max_score = max((round(sum(v.max_points for v in s.verdicts), 6) for s in submissions), default=0.0)
    pieces = dict.fromkeys(v.piece for s in submissions for v in s.verdicts)
    students = [s.student for s in submissions] + sorted(joined.only_gradebook if joined else ())
    names = pseudonyms(students, course_secret(root)) if anonymous else {s: s for s in students}
    keys = dict.fromkeys(v.mistake for s in submissions for v in s.verdicts if v.mistake)
    return ClassReport(lab, submissions, max_score, names, lesson_sections(root, lab, pieces),
                       mistake_sections(root, keys), joined)


# ---------------------------------------------------------------------------------------------------------------
# Output: figures, the page, the CSV, the students' pages

# No script at all, no request to anywhere: the page opens offline and a student's id stays text.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
STYLE = """body{font-family:sans-serif;margin:2em;max-width:1200px}table{border-collapse:collapse;margin:.5em 0}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left;vertical-align:top}
pre{background:#f6f6f6;padding:.4em;margin:0;white-space:pre-wrap;max-width:700px}img{max-width:100%}
.fail{color:#a00}.ok{color:#070}"""


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=80, bbox_inches="tight")
    return f"<img alt='figure' src='data:image/png;base64,{base64.b64encode(buffer.getvalue()).decode()}'>"


def figures(report: ClassReport) -> dict[str, str]:
    """{name: <img> of an embedded PNG}: the score histogram, the pass rates per piece, the top mistakes."""
    from matplotlib.figure import Figure  # no pyplot: no GUI backend, no global state

    out = {}
    bins = report.histogram()
    fig = Figure(figsize=(7, 2.6))
    ax = fig.subplots()
    ax.bar([lo for lo, _, _ in bins], [n for _, _, n in bins], width=[hi - lo for lo, hi, _ in bins], align="edge",
           color="#4878a8", edgecolor="white")
    ax.set(xlabel="score (points)", ylabel="students", title=f"scores of {len(report.graded)} submissions")
    out["histogram"] = _png(fig)
    pieces = report.pieces()
    if pieces:
        fig = Figure(figsize=(7, 0.5 + 0.45 * len(pieces)))
        ax = fig.subplots()
        y = range(len(pieces))
        ax.barh([i - 0.2 for i in y], [p.visible_passed / p.graded for p in pieces], height=0.4, label="visible",
                color="#4878a8")
        ax.barh([i + 0.2 for i in y], [p.hidden_passed / p.graded for p in pieces], height=0.4, label="hidden",
                color="#e0a040")
        ax.set_yticks(list(y), [p.piece for p in pieces])
        ax.invert_yaxis()
        ax.set(xlim=(0, 1), xlabel="share of students who passed every case", title="pass rate per piece")
        ax.legend(loc="lower right")
        out["pieces"] = _png(fig)
    mistakes = report.mistakes()[:15]
    if mistakes:
        fig = Figure(figsize=(7, 0.5 + 0.35 * len(mistakes)))
        ax = fig.subplots()
        ax.barh(range(len(mistakes)), [len(m.students) for m in mistakes], color="#b05050")
        ax.set_yticks(range(len(mistakes)), [m.key for m in mistakes])
        ax.invert_yaxis()
        ax.set(xlabel="students", title="named mistakes")
        out["mistakes"] = _png(fig)
    return out


def _head(title: str) -> str:
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><meta http-equiv='Content-Security-Policy' "
            f"content=\"{CSP}\"><title>{html.escape(title)}</title><style>{STYLE}</style></head><body>")


def _share(n: int, of: int) -> str:
    return f"{n} / {of} ({n / of:.0%})" if of else "0 / 0"


def _who(report: ClassReport, students: Iterable[str], limit: int = 30) -> str:
    names = sorted(report.names[s] for s in students)
    more = f", and {len(names) - limit} more" if len(names) > limit else ""
    return html.escape(", ".join(names[:limit]) + more)


def page(report: ClassReport, previous: ClassReport | None = None, anonymous: bool = False) -> str:
    """index.html: every number of the report, every student-derived string escaped."""
    e = html.escape
    graded = report.graded
    pics = figures(report)
    out = [_head(f"class report: {report.lab}"), f"<h1>What the class got wrong: {e(report.lab)}</h1>",
           f"<p>{len(graded)} submissions graded of {len(report.submissions)}; the lab is worth "
           f"{report.max_score:g} points. From the verdicts the grader recorded in the autograded notebooks."
           + (" Students are shown by pseudonym." if anonymous else "") + "</p>", summary(report),
           gradebook_section(report.gradebook, report.names, anonymous),
           "<h2>Scores</h2>", pics["histogram"], bins_table(report.histogram())]
    out += ["<h2>Pieces</h2>", pics.get("pieces", ""),
            "<table><tr><th>piece</th><th>lesson</th><th>passed every visible case</th>"
            "<th>passed every hidden case</th><th>passed every visible case, failed a hidden one</th></tr>"]
    for row in report.pieces():
        out.append(f"<tr><td>{e(row.piece)}</td><td>{e(report.sections.get(row.piece, ''))}</td>"
                   f"<td>{_share(row.visible_passed, row.graded)}</td><td>{_share(row.hidden_passed, row.graded)}</td>"
                   f"<td>{len(row.visible_not_hidden)}"
                   + (f": {_who(report, row.visible_not_hidden)}" if row.visible_not_hidden else "") + "</td></tr>")
    out.append("</table><h3>Cases</h3><table><tr><th>case</th><th></th><th>passed</th></tr>")
    for case, hidden, passed, seen in report.cases():
        out.append(f"<tr><td>{e(case)}</td><td>{'hidden' if hidden else 'visible'}</td><td>{_share(passed, seen)}"
                   "</td></tr>")
    out += ["</table><h2>Named mistakes</h2>", pics.get("mistakes", "")]
    mistakes = report.mistakes()
    if mistakes:
        out.append("<table><tr><th>mistake</th><th>students</th><th>piece</th><th>lesson</th><th>what the grader "
                   "told them (first occurrence)</th></tr>")
        for row in mistakes:
            sections = "; ".join(dict.fromkeys(report.section_of(row.key, p) for p in row.pieces))
            out.append(f"<tr><td>{e(row.key)}</td><td>{len(row.students)}</td><td>{e(', '.join(row.pieces))}</td>"
                       f"<td>{e(sections)}</td><td><pre>{e(row.message)}</pre></td></tr>")
        out.append("</table>")
    else:
        out.append("<p>No named mistake was recognised.</p>")
    stopped = report.stopped()
    out.append(f"<h2>Submissions that did not run to the end ({len(stopped)})</h2>")
    if stopped:
        out.append("<table><tr><th>student</th><th>why</th></tr>" + "".join(
            f"<tr><td>{e(report.names[s])}</td><td><pre>{e(chr(10).join(why))}</pre></td></tr>" for s, why in stopped)
            + "</table>")
    if previous is not None:
        out.append(compare_section(report, previous))
    if not anonymous:
        out.append("<h2>Students</h2><p>" + ", ".join(
            f"<a href='students/{e(student_page_name(s.student, report.names))}'>{e(s.student)}</a> "
            f"({s.score:g})" for s in report.submissions) + "</p>")
    out.append("</body></html>")
    return "".join(out)


def summary(report: ClassReport) -> str:
    """The lines to read first: the piece the fewest students passed, the most common mistake, and the pieces
    whose hidden cases failed students who passed every visible one."""
    e = html.escape
    lines = []
    pieces = report.pieces()
    if pieces:
        worst = min(pieces, key=lambda p: (min(p.visible_passed, p.hidden_passed) / p.graded, p.piece))
        passed = min(worst.visible_passed, worst.hidden_passed)
        lines.append(f"the piece the fewest passed: {e(worst.piece)}, {_share(passed, worst.graded)} passed "
                     f"{'every visible case' if worst.visible_passed <= worst.hidden_passed else 'every hidden case'}")
    mistakes = report.mistakes()
    if mistakes:
        lines.append(f"the most common named mistake: {e(mistakes[0].key)}, {len(mistakes[0].students)} students")
    unclear = [p for p in pieces if p.visible_not_hidden]
    if unclear:
        lines.append("passed every visible case and failed a hidden one (are the instructions clear?): " + ", ".join(
            f"{e(p.piece)} {len(p.visible_not_hidden)}" for p in unclear))
    return "<ul>" + "".join(f"<li>{line}</li>" for line in lines) + "</ul>" if lines else ""


def bins_table(bins: list[tuple[float, float, int]]) -> str:
    """The histogram's numbers as a table of two rows: each bin (low <= score < high; the last holds high too) and
    its students."""
    labels = [f"{lo:g}-{hi:g}" for lo, hi, _ in bins]
    labels[-1] += " (incl.)"
    return ("<table><tr><th>score</th>" + "".join(f"<td>{label}</td>" for label in labels)
            + "</tr><tr><th>students</th>" + "".join(f"<td>{n}</td>" for _, _, n in bins) + "</tr></table>")


def compare_section(report: ClassReport, previous: ClassReport) -> str:
    """What changed since another round: the mean score, each piece's pass rates, each mistake's count, and the
    students in both rounds whose score changed."""
    e = html.escape

    def mean(r: ClassReport) -> float:
        return sum(s.score for s in r.graded) / len(r.graded) if r.graded else 0.0

    out = [f"<h2>Since the other round</h2><p>mean score {mean(previous):.2f} -> {mean(report):.2f}; "
           f"{len(previous.graded)} -> {len(report.graded)} submissions graded.</p>",
           "<table><tr><th>piece</th><th>passed every visible case</th><th>passed every hidden case</th></tr>"]
    before = {p.piece: p for p in previous.pieces()}
    for row in report.pieces():
        old = before.get(row.piece)
        out.append(f"<tr><td>{e(row.piece)}</td><td>{_share(old.visible_passed, old.graded) if old else '-'} -> "
                   f"{_share(row.visible_passed, row.graded)}</td><td>"
                   f"{_share(old.hidden_passed, old.graded) if old else '-'} -> "
                   f"{_share(row.hidden_passed, row.graded)}</td></tr>")
    out.append("</table><table><tr><th>mistake</th><th>students then</th><th>now</th></tr>")
    then = {m.key: len(m.students) for m in previous.mistakes()}
    now = {m.key: len(m.students) for m in report.mistakes()}
    for key in sorted(then.keys() | now.keys(), key=lambda k: (-now.get(k, 0), k)):
        out.append(f"<tr><td>{e(key)}</td><td>{then.get(key, 0)}</td><td>{now.get(key, 0)}</td></tr>")
    out.append("</table>")
    old_scores = {s.student: s.score for s in previous.graded}
    changed = [(s, old_scores[s.student]) for s in report.graded
               if s.student in old_scores and old_scores[s.student] != s.score]
    out.append(f"<p>{len(changed)} students in both rounds changed their score.</p>")
    if changed:
        out.append("<table><tr><th>student</th><th>then</th><th>now</th></tr>" + "".join(
            f"<tr><td>{e(report.names[s.student])}</td><td>{old:g}</td><td>{s.score:g}</td></tr>"
            for s, old in sorted(changed, key=lambda item: item[0].student)) + "</table>")
    return "".join(out)


def student_page_name(student: str, names: dict[str, str]) -> str:
    """The file of a student's page: the id where it is a plain one (intake's allowlist), else its pseudonym."""
    return f"{student if _SAFE_NAME.fullmatch(student) else pseudonyms([student], PUBLIC_SECRET)[student]}.html"


def student_page(report: ClassReport, sub: Submission) -> str:
    """One student's view for office hours: their pieces, mistakes and the grader's messages; no one else's."""
    e = html.escape
    out = [_head(f"{report.lab}: {sub.student}"), f"<h1>{e(sub.student)}: {e(report.lab)}</h1>",
           f"<p>{sub.score:g} / {report.max_score:g} points.</p>"]
    if sub.stopped():
        out.append(f"<h2>Did not run to the end</h2><pre>{e(chr(10).join(sub.stopped()))}</pre>")
    out.append("<table><tr><th>case</th><th>verdict</th><th>mistake</th><th>lesson</th><th>message</th></tr>")
    for v in sub.verdicts:
        verdict = f"<span class='{'ok' if v.passed else 'fail'}'>{e(OUTCOME_WORDS[v.outcome])}</span>"
        out.append(f"<tr><td>{e(v.case)}{' (hidden)' if v.hidden else ''}</td><td>{verdict}</td>"
                   f"<td>{e(v.mistake or '')}</td><td>{e(report.section_of(v.mistake, v.piece))}</td>"
                   f"<td>{'' if v.passed else f'<pre>{e(unwrapped(v.message))}</pre>'}</td></tr>")
    out.append("</table></body></html>")
    return "".join(out)


def write_csv(path: Path, report: ClassReport) -> None:
    """report.csv: one row per student and case; no cell a spreadsheet reads as a formula."""
    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["student", "score", "case", "piece", "visibility", "passed", "outcome", "mistake",
                         "points", "lesson"])
        for sub in report.submissions:
            name = spreadsheet_safe(report.names[sub.student])
            if not sub.verdicts:
                writer.writerow([name, "", "", "", "", "", spreadsheet_safe("; ".join(sub.stopped())), "", "", ""])
            for v in sub.verdicts:
                writer.writerow([name, f"{sub.score:g}", v.case, v.piece, "hidden" if v.hidden else "visible",
                                 v.passed, v.outcome, v.mistake or "", f"{v.points:g}",
                                 spreadsheet_safe(report.section_of(v.mistake, v.piece))])


@dataclass(frozen=True)
class Written:
    report: ClassReport
    folder: Path
    seconds: float


def write_report(root: Path, lab: str, compare: Path | None = None, anonymous: bool = False,
                 db_url: str | None = None) -> Written:
    """Build the report of `lab` (its scores from the gradebook at `db_url`, if given) and write it under
    grading/reports/LAB/, or grading/reports/LAB-anonymous/: the folder an instructor shows the class holds no
    page a named run wrote."""
    start = time.perf_counter()
    report = build(root, lab, anonymous, db_url=db_url)
    if not report.submissions:
        raise SystemExit(f"no autograded submissions of {lab} in {root / 'grading' / 'autograded'}/*/{lab}")
    previous = None
    if compare is not None:
        if not (compare / "autograded").is_dir():
            raise SystemExit(f"--compare {compare}: expected another round's grading folder, holding autograded/")
        previous = build(root, lab, anonymous, grading=compare)
        previous.names = report.names | {s: n for s, n in previous.names.items() if s not in report.names}
    folder = root / "grading" / "reports" / (f"{lab}-anonymous" if anonymous else lab)
    folder.mkdir(parents=True, exist_ok=True)
    if not anonymous:  # ids, scores and each student's own page: the instructor's alone (owner only: rwx------)
        folder.chmod(0o700)
    (folder / "index.html").write_text(page(report, previous, anonymous), encoding="utf-8")
    write_csv(folder / "report.csv", report)
    if not anonymous:
        (folder / "students").mkdir(exist_ok=True)
        (folder / "students").chmod(0o700)  # also when an earlier run made it with the umask's mode
        for sub in report.submissions:
            (folder / "students" / student_page_name(sub.student, report.names)).write_text(
                student_page(report, sub), encoding="utf-8")
    return Written(report, folder, time.perf_counter() - start)


def graded_labs(root: Path) -> list[str]:
    """The labs with autograded submissions in the course at `root`."""
    base = root / "grading" / "autograded"
    found = {p.name for student in base.iterdir() if student.is_dir() and not student.name.startswith(".")
             for p in student.iterdir()
             if p.is_dir() and re.fullmatch(r"\d\d_[a-z0-9_]+", p.name)} if base.is_dir() else set()
    return sorted(found)


def command(args: argparse.Namespace) -> int:
    """`gptcourse report [LAB ...]`."""
    root = Path.cwd()
    labs = args.lab or graded_labs(root)
    if not labs:
        raise SystemExit(f"no autograded labs in {root / 'grading' / 'autograded'}: run from the course's root folder")
    db_url = course_db_url(root) if args.db is None else None if args.db == "none" else args.db
    for lab in labs:
        written = write_report(root, lab, Path(args.compare) if args.compare else None, args.anonymous, db_url)
        report = written.report
        top = report.mistakes()[:3]
        print(f"{lab}: {len(report.graded)} of {len(report.submissions)} submissions graded; most common mistakes: "
              + (", ".join(f"{m.key} ({len(m.students)})" for m in top) or "none")
              + f"; {len(report.stopped())} did not run to the end; report: {written.folder / 'index.html'} "
              f"({written.seconds:.1f} s)")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lab", nargs="*", help="the assignment, e.g. 02_causal_attention (default: every lab "
                                               "with autograded submissions)")
    parser.add_argument("--compare", metavar="OTHER_GRADING_FOLDER",
                        help="another round's grading folder (holding autograded/): what changed since")
    parser.add_argument("--anonymous", action="store_true",
                        help="stable pseudonyms for student ids, and no per-student pages (to show the class)")
    parser.add_argument("--db", metavar="URL",
                        help="the gradebook whose scores count (nbgrader's db_url: sqlite:///PATH or "
                             "postgresql://user@host/db); default: the course's (nbgrader_config.py's db_url, or "
                             "grading/gradebook.db) when there is one; none: the autograded notebooks' verdicts only")
