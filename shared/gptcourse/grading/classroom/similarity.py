"""`gptcourse similarity LAB`: each submission's code compared with the lab's reference source, the public
solution and every classmate, with copydetect's fingerprints (MOSS's k-grams); evidence for the instructor, never a
change to a score. docs/grading.md, "Copies", says what is compared and why the default threshold is 0.45.

What is compared: per piece (`grading/labs/labNN.py`), the code of the submission's solution cell of that
`grade_id`, with
- the reference: the whole module of each gptcourse object the piece's reference is or (for a grading wrapper)
  calls, each piece matched in its own modules; one row, `reference:<module>` (their common prefix);
- `solutions:<lab>`: the solution cell of solutions/<lab>/<lab>.ipynb (public for self-study), marker lines cut;
- every other submission's cell of the same piece.
Code given in the release (labs/<lab>/<lab>.ipynb: signatures, docstrings, starter and test cells) is copydetect's
boilerplate and never counts. A piece whose public solution has fewer than `MIN_TOKENS` fingerprinted tokens
beyond it (a one-line mask) is too short to tell honest from copied: listed, not scored.

The shares: copydetect tokenizes (names become V, strings S, comments and whitespace go) and takes every k-gram of
`NOISE_TOKENS` tokens as a fingerprint (its defaults: window 1, so no winnowing choice, and the result does not
depend on Python's per-process string hashing); a side's share is its fingerprinted tokens inside k-grams the other
side has too, over all its fingerprinted tokens, summed over the pieces compared. A pair is flagged when the larger
share held by a student reaches the threshold. Submissions are hostile input: read as JSON, never run; the HTML
report escapes every character of them and allows no script and no request.
"""

from __future__ import annotations

import argparse
import csv
import html
import importlib
import inspect
import io
import json
import re
import time
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise, takewhile
from pathlib import Path
from typing import Any

NOISE_TOKENS = 25  # copydetect's noise threshold k (its default): matches shorter than this never count
GUARANTEE_TOKENS = 25  # copydetect's default too: window 1, every k-gram is a fingerprint
MIN_TOKENS = 80  # a piece whose public solution has fewer fingerprinted tokens is not scored
DEFAULT_THRESHOLD = 0.45  # see docs/grading.md, "Copies": chosen from tests/test_grading_similarity.py's data
MAX_NOTEBOOK_BYTES = 20_000_000  # a larger file is listed as unreadable, not parsed
MAX_CELL_CHARS = 100_000  # a solution cell is compared up to this many characters
SHOWN_PAIRS = 100  # the report shows the code of this many flagged pairs, the closest first; the CSV has all
TABLE_ROWS = 50  # and the terminal table lists this many
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
SOLUTIONS, REFERENCE = "solutions:", "reference:"
GRADING = "gptcourse.grading"


# ---------------------------------------------------------------------------------------------------------------
# The documents: per piece, the reference's source, the public solution's cell and each submission's cell


def lab_number(lab: str) -> str:
    """'05_assembling_gpt' -> '05', the key of the lab's pieces."""
    match = re.match(r"(\d\d)_[a-z0-9_]+$", lab)
    if match is None:
        raise SystemExit(f"{lab!r} is not a lab name: expected NN_topic, e.g. 05_assembling_gpt")
    return match.group(1)


def _gptcourse_objects(obj: Any, seen: set[int]) -> Iterator[Any]:
    """`obj` and, through the grading wrappers (functions of gptcourse.grading), the gptcourse functions and
    classes they name: where the code a student could copy for the piece lives."""
    if id(obj) in seen or not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return
    seen.add(id(obj))
    module = getattr(obj, "__module__", "") or ""
    if not module.startswith("gptcourse"):
        return
    yield obj
    if inspect.isclass(obj) or not module.startswith(GRADING):
        return
    names, codes = set(), [obj.__code__]
    while codes:
        code = codes.pop()
        names.update(code.co_names)
        codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    closure = dict(zip(obj.__code__.co_freevars, (c.cell_contents for c in obj.__closure__ or ()), strict=True))
    for name in sorted(names | set(closure)):
        yield from _gptcourse_objects(closure.get(name, obj.__globals__.get(name)), seen)


def reference_sources(reference: Any) -> dict[str, str]:
    """{module: source} for a piece's reference: the whole module of each gptcourse object it is or
    calls outside the grading package (a student may copy any helper there); only where there is none (the
    reference is written in the lab's grading module), the source of its functions there (a lambda's line is the
    grading table's, not code)."""
    objects = list(_gptcourse_objects(reference, set()))
    taught = [obj for obj in objects if not obj.__module__.startswith(GRADING)]
    if taught:
        return {obj.__module__: inspect.getsource(inspect.getmodule(obj)) for obj in taught}
    sources: dict[str, list[str]] = {}
    for obj in objects:
        if obj.__name__ != "<lambda>":
            sources.setdefault(obj.__module__, []).append(inspect.getsource(obj))
    return {module: "\n\n".join(parts) for module, parts in sources.items()}


def _cell_code(cell: Any) -> str:
    """A cell's code (nbformat: a string or a list of strings; anything else is no code), marker lines cut."""
    source = cell.get("source", "")
    if isinstance(source, list) and all(isinstance(line, str) for line in source):
        source = "".join(source)
    if not isinstance(source, str):
        return ""
    return "\n".join(line for line in source[:MAX_CELL_CHARS].splitlines() if BEGIN not in line and END not in line)


def solution_cells(notebook: Any, names: Iterable[str]) -> dict[str, str]:
    """{grade_id: code} of the notebook's solution cells named in `names` (a dict parsed from JSON, any shape)."""
    wanted, found = set(names), {}
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    for cell in cells if isinstance(cells, list) else []:
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        meta = cell.get("metadata", {})
        meta = meta.get("nbgrader", {}) if isinstance(meta, dict) else {}
        grade_id = meta.get("grade_id") if isinstance(meta, dict) else None
        if isinstance(grade_id, str) and grade_id in wanted and meta.get("solution") and grade_id not in found:
            found[grade_id] = _cell_code(cell)
    return found


def code_cells(notebook: Any) -> list[str]:
    """The code of every code cell (of the release: the boilerplate)."""
    cells = notebook.get("cells") if isinstance(notebook, dict) else None
    return [_cell_code(c) for c in cells or [] if isinstance(c, dict) and c.get("cell_type") == "code"]


def read_notebook(path: Path) -> dict:
    """The notebook's JSON; ValueError (with what was wrong) if it is not one."""
    from ..steps.intake import read_regular

    try:
        data = read_regular(path, MAX_NOTEBOOK_BYTES)  # never through a link, never a device
    except OSError:
        raise ValueError(f"not a regular file of at most {MAX_NOTEBOOK_BYTES // 1_000_000} MB") from None
    try:
        notebook = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        raise ValueError(f"not JSON ({type(error).__name__})") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list):
        raise ValueError("JSON without a list of cells")
    return notebook


def submitted_notebook(folder: Path, lab: str) -> Path | None:
    """The lab's notebook in a submitted folder (nbgrader's name; else the only notebook there)."""
    from ..steps.intake import is_regular

    named = folder / f"{lab}.ipynb"
    if is_regular(named):
        return named
    others = sorted(p for p in folder.glob("*.ipynb") if is_regular(p))
    return others[0] if len(others) == 1 else None


# ---------------------------------------------------------------------------------------------------------------
# Fingerprints and comparisons (copydetect)


class Fingerprint:
    """copydetect's CodeFingerprint of one document (`.copydetect`), and its fingerprints as (position, hash) in
    position order, from which `matched` counts the tokens a comparison finds."""

    def __init__(self, code: str, boilerplate: Any) -> None:
        from copydetect import CodeFingerprint

        self.copydetect = CodeFingerprint("cell.py", NOISE_TOKENS, GUARANTEE_TOKENS - NOISE_TOKENS + 1, boilerplate,
                                          language="python", fp=io.StringIO(code))
        self.tokens = int(self.copydetect.token_coverage)  # tokens inside fingerprinted k-grams
        self.at = sorted((int(p), int(h)) for h, positions in self.copydetect.hash_idx.items() for p in positions)
        self.hashes = frozenset(h for _, h in self.at)

    def matched(self, other: Fingerprint) -> int:
        """This document's tokens inside k-grams that `other` has too: copydetect's token overlap (compare_files
        sums its get_copied_slices), counted without building an array per fingerprint (a class of 200 is
        100,000 comparisons)."""
        return covered(self.starts_in(other.hashes))

    def starts_in(self, hashes: frozenset[int]) -> list[int]:
        """The positions of this document's k-grams whose hash is in `hashes`, in order."""
        return [p for p, h in self.at if h in hashes]


def covered(starts: list[int]) -> int:
    """The tokens in the union of [p, p + k) over the sorted positions p."""
    if not starts:
        return 0
    return NOISE_TOKENS + sum(min(NOISE_TOKENS, b - a) for a, b in pairwise(starts))


def boilerplate_hashes(release_cells: list[str]) -> Any:
    """Every k-gram hash of the released lab's code (win_size 1: all of them, as copydetect's own boilerplate)."""
    import numpy as np
    from copydetect import CodeFingerprint

    hashes = [CodeFingerprint("release.py", NOISE_TOKENS, 1, language="python", fp=io.StringIO(code)).hashes
              for code in release_cells]
    return np.unique(np.array([h for found in hashes for h in found], dtype=np.int64))


@dataclass
class Match:
    """One piece of a compared pair: tokens of each side inside matched k-grams, and each side's fingerprinted
    tokens; `source`: the reference module it was matched in (a piece's reference may span several)."""

    overlap: tuple[int, int]
    tokens: tuple[int, int]
    source: str = ""


@dataclass
class Pair:
    student: str  # a submission's student id
    other: str  # another student id, reference:<module> or solutions:<lab>
    pieces: dict[str, Match] = field(default_factory=dict)
    # the reference's (tokens found in the student's code, tokens): each module counted once, not once per piece
    reference_found: tuple[int, int] | None = None

    def shares(self) -> tuple[float, float]:
        """(share of the student's code found in the other's, share of the other's found in the student's)."""
        totals = [sum(m.tokens[i] for m in self.pieces.values()) for i in (0, 1)]
        found = [sum(m.overlap[i] for m in self.pieces.values()) for i in (0, 1)]
        if self.reference_found is not None:
            found[1], totals[1] = self.reference_found
        return tuple(f / t if t else 0.0 for f, t in zip(found, totals, strict=True))

    def score(self) -> float:
        """The larger share held by a student (a reference or a public solution is not one)."""
        mine, theirs = self.shares()
        return mine if self.other.startswith((REFERENCE, SOLUTIONS)) else max(mine, theirs)

    def piece_shares(self) -> dict[str, float]:
        return {name: m.overlap[0] / m.tokens[0] if m.tokens[0] else 0.0 for name, m in self.pieces.items()}


def compare(a: Fingerprint, b: Fingerprint, source: str = "") -> Match:
    """The tokens of each document found in the other (skipped when they share no fingerprint)."""
    if a.hashes.isdisjoint(b.hashes):
        return Match((0, 0), (a.tokens, b.tokens), source)
    return Match((a.matched(b), b.matched(a)), (a.tokens, b.tokens), source)


@dataclass
class Lab:
    """A lab's documents, fingerprinted: per piece, the reference's and the public solution's, and the pieces
    too short to score."""

    lab: str
    boilerplate: Any
    scored: list[str]
    too_short: dict[str, int]  # piece -> fingerprinted tokens of the public solution
    references: dict[str, tuple[str, Fingerprint]]  # module -> (source, its fingerprint)
    compared_with: dict[str, list[str]]  # piece -> the modules of its reference
    solutions: dict[str, tuple[str, Fingerprint]]  # piece -> (code, its fingerprint)

    @property
    def reference_label(self) -> str:
        """`reference:<module>`, the modules' common dotted prefix where the pieces' references span several
        (lab 09: reference:gptcourse.training)."""
        parts = [module.split(".") for module in self.references] or [["gptcourse"]]
        common = takewhile(lambda names: len(set(names)) == 1, zip(*parts, strict=False))
        return REFERENCE + ".".join(names[0] for names in common)


def load_lab(root: Path, lab: str) -> Lab:
    """The lab's pieces (from gptcourse.grading.labs), its release (boilerplate) and its public solution."""
    from .. import labs
    from ..piece import lab_pieces

    number = lab_number(lab)
    try:
        importlib.import_module(f"{labs.__name__}.lab{number}")  # declares its pieces
    except ModuleNotFoundError:
        raise SystemExit(f"no grading module {labs.__name__}.lab{number} for lab {lab}") from None
    pieces = lab_pieces(number)
    if not pieces:
        raise SystemExit(f"no graded pieces declared for lab {lab} in gptcourse.grading.labs")
    paths = {kind: root / folder / lab / f"{lab}.ipynb" for kind, folder in (("release", "labs"),
                                                                             ("solution", "solutions"))}
    for kind, path in paths.items():
        if not path.is_file():
            raise SystemExit(f"{path} is missing: run from the course's root folder ({kind} of {lab})")
    boilerplate = boilerplate_hashes(code_cells(read_notebook(paths["release"])))
    public = solution_cells(read_notebook(paths["solution"]), [p.name for p in pieces])
    solutions, references, compared_with, too_short, scored = {}, {}, {}, {}, []
    for piece in pieces:
        code = public.get(piece.name, "")
        solutions[piece.name] = (code, Fingerprint(code, boilerplate))
        if solutions[piece.name][1].tokens < MIN_TOKENS:
            too_short[piece.name] = int(solutions[piece.name][1].tokens)
            continue
        scored.append(piece.name)
        sources = reference_sources(piece.reference)
        compared_with[piece.name] = sorted(sources)
        for module, source in sources.items():
            if module not in references:
                references[module] = (source, Fingerprint(source, boilerplate))
    return Lab(lab, boilerplate, scored, too_short, references, compared_with, solutions)


@dataclass
class Submission:
    student: str
    status: str  # "compared", "no notebook", "unreadable: ...", "no solution cells"
    code: dict[str, str] = field(default_factory=dict)  # piece -> code
    prints: dict[str, Fingerprint] = field(default_factory=dict)


def read_submissions(folders: dict[str, Path], lab: Lab, progress: bool = True) -> list[Submission]:
    """Each student's solution cells of the scored pieces, fingerprinted; the rest listed with why."""
    from tqdm.auto import tqdm

    found = []
    for student, folder in tqdm(sorted(folders.items()), unit="submission", disable=not progress,
                                dynamic_ncols=True, desc="reading"):
        path = submitted_notebook(folder, lab.lab)
        if path is None:
            found.append(Submission(student, "no notebook"))
            continue
        try:
            notebook = read_notebook(path)
        except (OSError, ValueError) as error:
            found.append(Submission(student, f"unreadable: {error}"))
            continue
        code = solution_cells(notebook, lab.scored)
        if not code and lab.scored:
            found.append(Submission(student, "no solution cells"))
            continue
        prints = {name: Fingerprint(text, lab.boilerplate) for name, text in code.items()}
        found.append(Submission(student, "compared", code, prints))
    return found


def compare_class(lab: Lab, submissions: list[Submission], progress: bool = True) -> list[Pair]:
    """Every compared submission with the reference (each piece in the module of the package where it matches
    most), the public solution and every later classmate."""
    from tqdm.auto import tqdm

    compared = [s for s in submissions if s.status == "compared"]
    pairs = []
    with tqdm(total=len(compared), unit="submission", disable=not progress, dynamic_ncols=True,
              desc="comparing") as bar:
        for i, sub in enumerate(compared):
            reference = Pair(sub.student, lab.reference_label)
            others = {SOLUTIONS + lab.lab: Pair(sub.student, SOLUTIONS + lab.lab)}
            found_in: dict[str, set[int]] = {}  # module -> positions of its k-grams found in the student's code
            for name, mine in sub.prints.items():
                matches = [compare(mine, lab.references[module][1], module) for module in lab.compared_with[name]]
                if matches:  # else its reference is no code of the package's (lab 08's count_pairs)
                    reference.pieces[name] = max(matches, key=lambda m: m.overlap[0])
                for module in lab.compared_with[name]:
                    found_in.setdefault(module, set()).update(lab.references[module][1].starts_in(mine.hashes))
                candidates = [(SOLUTIONS + lab.lab, lab.solutions[name][1])]
                candidates += [(other.student, other.prints[name]) for other in compared[i + 1:]
                               if name in other.prints]
                for who, theirs in candidates:
                    others.setdefault(who, Pair(sub.student, who)).pieces[name] = compare(mine, theirs)
            reference.reference_found = (sum(covered(sorted(starts)) for starts in found_in.values()),
                                         sum(lab.references[module][1].tokens for module in found_in))
            pairs += [reference, *others.values()] if reference.pieces else list(others.values())
            bar.update()
    return [_student_first(p) for p in pairs]


def _student_first(pair: Pair) -> Pair:
    """A pair of students, ordered so that the first holds the larger share."""
    if pair.other.startswith((REFERENCE, SOLUTIONS)):
        return pair
    mine, theirs = pair.shares()
    if theirs <= mine:
        return pair
    swapped = {name: Match(m.overlap[::-1], m.tokens[::-1], m.source) for name, m in pair.pieces.items()}
    return Pair(pair.other, pair.student, swapped)


# ---------------------------------------------------------------------------------------------------------------
# Output: the CSV, the terminal table, the HTML report


def printable(text: str, width: int = 40) -> str:
    """A name as the terminal shows it: control characters escaped, cut at `width`."""
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)
    return shown if len(shown) <= width else shown[:width - 1] + "…"


def write_csv(path: Path, pairs: list[Pair]) -> None:
    from .csv_export import spreadsheet_safe

    with open(path, "w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out)
        writer.writerow(["student", "matched with", "share of the student's code", "share of the other's code",
                         "share per piece (student's)"])
        for pair in sorted(pairs, key=lambda p: (-p.score(), p.student, p.other)):
            mine, theirs = pair.shares()
            per_piece = "; ".join(f"{name} {share:.2f}" for name, share in pair.piece_shares().items())
            writer.writerow([spreadsheet_safe(pair.student), spreadsheet_safe(pair.other), f"{mine:.3f}",
                             f"{theirs:.3f}", per_piece])


def table(flagged: list[Pair], threshold: float) -> str:
    if not flagged:
        return f"no pair at or above the threshold {threshold:g}"
    rows = [("student", "matched with", "student's", "other's")]
    for pair in flagged[:TABLE_ROWS]:
        mine, theirs = pair.shares()
        rows.append((printable(pair.student), printable(pair.other), f"{mine:.0%}", f"{theirs:.0%}"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = [f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:>{widths[2]}}  {d:>{widths[3]}}" for a, b, c, d in rows]
    if len(flagged) > TABLE_ROWS:
        lines.append(f"... and {len(flagged) - TABLE_ROWS} more at or above {threshold:g}: see the report, the CSV")
    return "\n".join(lines)


# No script at all, no request to anywhere: the report opens offline and a submission's text stays text.
CSP = "default-src 'none'; style-src 'unsafe-inline'"
STYLE = """body{font-family:sans-serif;margin:2em;max-width:1500px}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}.code{display:flex;gap:1em}
.code>div{flex:1;min-width:0}pre{background:#f6f6f6;padding:.5em;overflow-x:auto;white-space:pre-wrap}
.mine{background:#f2b6b6}.theirs{background:#b6f2b6}.bar{background:#bbb}details{margin:.5em 0}"""


def _highlighted(code: str, slices: Any, css: str, truncate: int = -1) -> str:
    """`code` escaped, its matched slices in <span class=css>; with `truncate`, only that many lines around each
    match (a reference module is long)."""
    from copydetect.utils import highlight_overlap

    if len(slices) == 0 or slices.shape[1] == 0:
        return html.escape(code)
    marked, _ = highlight_overlap(code, slices, f"<span class='{css}'>", "</span>", truncate=truncate,
                                  escape_html=True)
    return marked


def score_histogram(pairs: list[Pair], threshold: float) -> str:
    """The pairs' scores in ten bins, as an HTML table with bars: where the class lies against the threshold."""
    counts = [0] * 10
    for pair in pairs:
        counts[min(int(pair.score() * 10), 9)] += 1
    most = max(counts) or 1
    rows = [f"<tr><td>{k / 10:.1f}-{(k + 1) / 10:.1f}</td><td>{n}</td><td style='width:400px'><div class="
            f"'{'mine' if (k + 1) / 10 > threshold else 'bar'}' style='width:{100 * n / most:.1f}%'>&nbsp;</div></td>"
            "</tr>" for k, n in enumerate(counts)]
    return "<table><tr><th>score</th><th>pairs</th><th></th></tr>" + "".join(rows) + "</table>"


def report_html(lab: Lab, submissions: list[Submission], pairs: list[Pair], flagged: list[Pair],
                threshold: float) -> str:
    """The report: parameters, what was not compared and why, the scores' distribution, the flagged pairs and, per
    pair and piece, both sides' code with the matched regions highlighted (every character of a submission
    escaped)."""
    from copydetect import __version__, compare_files

    e = html.escape
    by_student = {s.student: s for s in submissions}

    def side(who: str, name: str, match: Match) -> tuple[str, Fingerprint]:
        if who.startswith(REFERENCE):
            return lab.references[match.source or lab.compared_with[name][0]]
        if who.startswith(SOLUTIONS):
            return lab.solutions[name]
        return by_student[who].code[name], by_student[who].prints[name]

    out = [f"<!DOCTYPE html><html><head><meta charset='utf-8'>"
           f"<meta http-equiv='Content-Security-Policy' content=\"{CSP}\">"
           f"<title>similarity: {e(lab.lab)}</title><style>{STYLE}</style></head><body>",
           f"<h1>Code similarity: {e(lab.lab)}</h1>",
           f"<p>Evidence for the instructor, who decides; no score was changed. copydetect {e(__version__)}, "
           f"k-grams of {NOISE_TOKENS} tokens (matches of {GUARANTEE_TOKENS} or more are always found), threshold "
           f"{threshold:g} (the larger share of a student's code). The release's code is boilerplate and never "
           f"counts. Red: the first side's matched code; green: the same code on the other side.</p>"]
    compared = [s for s in submissions if s.status == "compared"]
    out.append(f"<p>{len(compared)} of {len(submissions)} submissions compared; pieces scored: "
               f"{e(', '.join(lab.scored) or 'none')}.</p>")
    if lab.too_short:
        out.append("<h2>Pieces not scored</h2><p>Too short for any detector to tell an honest answer from a copy "
                   f"(fewer than {MIN_TOKENS} tokens in the public solution beyond the release's code):</p><ul>")
        out += [f"<li>{e(name)} ({tokens} tokens)</li>" for name, tokens in lab.too_short.items()]
        out.append("</ul>")
    missing = [s for s in submissions if s.status != "compared"]
    if missing:
        out.append("<h2>Not compared</h2><table><tr><th>student</th><th>why</th></tr>")
        out += [f"<tr><td>{e(s.student)}</td><td>{e(s.status)}</td></tr>" for s in missing]
        out.append("</table>")
    out.append(f"<h2>All {len(pairs)} pairs by score</h2>{score_histogram(pairs, threshold)}")
    out.append(f"<h2>Pairs at or above {threshold:g}</h2>")
    if not flagged:
        out.append("<p>none</p>")
    else:
        out.append("<table><tr><th>student</th><th>matched with</th><th>share of the student's code</th>"
                   "<th>share of the other's</th></tr>")
        for i, pair in enumerate(flagged):
            mine, theirs = pair.shares()
            student = f"<a href='#pair{i}'>{e(pair.student)}</a>" if i < SHOWN_PAIRS else e(pair.student)
            out.append(f"<tr><td>{student}</td><td>{e(pair.other)}</td><td>{mine:.0%}</td><td>{theirs:.0%}</td>"
                       "</tr>")
        out.append("</table>")
    if len(flagged) > SHOWN_PAIRS:
        out.append(f"<p>The code of the first {SHOWN_PAIRS} pairs is shown below; similarity.csv has every pair.</p>")
    for i, pair in enumerate(flagged[:SHOWN_PAIRS]):
        out.append(f"<h3 id='pair{i}'>{e(pair.student)} and {e(pair.other)}</h3>")
        for name, share in pair.piece_shares().items():
            match = pair.pieces[name]
            (code_a, print_a), (code_b, print_b) = side(pair.student, name, match), side(pair.other, name, match)
            _, _, (slices_a, slices_b) = compare_files(print_a.copydetect, print_b.copydetect)
            out.append(f"<details{' open' if share >= threshold else ''}><summary>{e(name)}: {share:.0%} of "
                       f"{e(pair.student)}'s code</summary><div class='code'>"
                       f"<div><b>{e(pair.student)}</b><pre>{_highlighted(code_a, slices_a, 'mine')}</pre></div>"
                       f"<div><b>{e(pair.other)}{e(f' ({match.source})' if match.source else '')}</b>"
                       f"<pre>{_highlighted(code_b, slices_b, 'theirs', 10 if match.source else -1)}</pre></div>"
                       "</div></details>")
    out.append("</body></html>")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------------------------
# The command


@dataclass
class Result:
    lab: Lab
    submissions: list[Submission]
    pairs: list[Pair]
    flagged: list[Pair]
    folder: Path


def submitted_folders(root: Path, lab: str) -> dict[str, Path]:
    """{student id: submitted folder} of `lab`, as nbgrader's course directory finds them, those whose id the
    grader refuses included (the comparison is evidence, makes no path from an id and escapes every one), those
    that are links not."""
    from .grade_one import submissions

    coursedir = course_directory(root)
    refused: list[Path] = []
    found = {s.student: s.folder for s in submissions(coursedir, lab, refused)}
    return found | {folder.parent.name: folder for folder in refused if not folder.is_symlink()}


def course_directory(root: Path) -> Any:
    """nbgrader's CourseDirectory of the course at `root`, configured by its nbgrader_config.py."""
    from nbgrader.coursedir import CourseDirectory
    from traitlets.config import Config, PyFileConfigLoader

    if not (root / "nbgrader_config.py").is_file():
        raise SystemExit(f"no nbgrader_config.py in {root}: run from the course's root folder")
    config = Config(PyFileConfigLoader("nbgrader_config.py", str(root)).load_config())
    coursedir = CourseDirectory(config=config)
    coursedir.root = str(root)
    return coursedir


def find_similar(root: Path, lab: str, threshold: float = DEFAULT_THRESHOLD, progress: bool = True) -> Result:
    """Compare a lab's submissions; write the CSV and the HTML report under grading/similarity/LAB/."""
    lab_docs = load_lab(root, lab)
    folders = submitted_folders(root, lab)
    if not folders:
        raise SystemExit(f"no submissions of {lab} in {root / 'grading' / 'submitted'}/*/{lab}")
    subs = read_submissions(folders, lab_docs, progress)
    pairs = compare_class(lab_docs, subs, progress)
    flagged = sorted((p for p in pairs if p.score() >= threshold), key=lambda p: (-p.score(), p.student, p.other))
    folder = root / "grading" / "similarity" / lab
    folder.mkdir(parents=True, exist_ok=True)
    write_csv(folder / "similarity.csv", pairs)
    (folder / "report.html").write_text(report_html(lab_docs, subs, pairs, flagged, threshold), encoding="utf-8")
    return Result(lab_docs, subs, pairs, flagged, folder)


def command(args: argparse.Namespace) -> int:
    """`gptcourse similarity`."""
    if not 0 < args.threshold <= 1:
        raise SystemExit(f"--threshold {args.threshold:g}: expected a share between 0 (excluded) and 1")
    start = time.perf_counter()
    result = find_similar(Path.cwd(), args.lab, args.threshold)
    for sub in result.submissions:
        if sub.status != "compared":
            print(f"not compared: {printable(sub.student)}: {sub.status}")
    for name, tokens in result.lab.too_short.items():
        print(f"not scored: {name} (too short to tell copies apart: {tokens} tokens in the public solution)")
    print(table(result.flagged, args.threshold))
    compared = sum(s.status == "compared" for s in result.submissions)
    print(f"{compared} submissions compared, {len(result.pairs)} pairs, {len(result.flagged)} at or above "
          f"{args.threshold:g}, in {time.perf_counter() - start:.1f} s; report: {result.folder / 'report.html'}, "
          f"all pairs: {result.folder / 'similarity.csv'}")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lab", help="the assignment, e.g. 05_assembling_gpt")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help=f"list pairs where a student's share of matched code is at least this "
                             f"(default {DEFAULT_THRESHOLD:g})")
