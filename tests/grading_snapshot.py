"""Every grading verdict and message of labs 01-16, in-process, for a before/after comparison of the grading.

For each lab, the solution and every student of its round trip's `WRONG` table (the known mistakes, the blind
students, the copied references: tests/test_labs_NN.py), every case of every test cell is checked in-process, as
`lab_roundtrip.failures` does (not through nbgrader: minutes per lab), and one row is kept per case: (lab, piece,
case id, student, passed, points, message). `points` is what the case's test cell gives that student: its points
when every case of the cell passes, else 0 (a graded kernel stops a cell at its first failure). A piece whose
reference the student imports is zeroed by the grader's scan and is not run: its message is "banned".

A message may hold numbers that depend on the CPU (a largest error of 3.1e-07 on one, 2.9e-07 on another), so the
comparison (`stable`) masks every decimal number (one with a point or an exponent: "3.1e-07", "0.25") and keeps
the rest as it is: the words, the integers (sizes, indices, counts, token ids) and the order. The snapshot file
keeps the messages as they were, numbers and all, to read.

    python tests/grading_snapshot.py write [LAB ...]   # (re)write tests/grading_snapshot.json
    python tests/grading_snapshot.py diff [LAB ...]    # what differs from it (exit 1 if anything does)

Record it with ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 OMP_NUM_THREADS=1, as the lessons are.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import sys
from pathlib import Path

import nbformat
import torch

TESTS = Path(__file__).resolve().parent
SNAPSHOT = TESTS / "grading_snapshot.json"
LABS = [f"{n:02d}" for n in range(1, 17)]
_DECIMAL = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+(?=[eE][-+]?\d))(?:[eE][-+]?\d+)?|[-+]?\d+[eE][-+]?\d+")


def stable(message: str) -> str:
    """`message` with every decimal number masked as "#": what a snapshot comparison holds exact."""
    return _DECIMAL.sub("#", message)


def _lab_module(lab: str):
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    return importlib.import_module(f"test_labs_{lab}")


def _cell_points(folder: str) -> dict[str, float]:
    root = TESTS.parent / "solutions" / folder / f"{folder}.ipynb"
    return {cell.metadata["nbgrader"]["grade_id"]: float(cell.metadata["nbgrader"].get("points", 0))
            for cell in nbformat.read(root, as_version=4).cells if cell.metadata.get("nbgrader", {}).get("grade")}


def lab_rows(lab: str) -> list[dict]:
    """The rows of lab `lab` ("02"): the solution's and each student's the round trip grades (`RoundTrip.graded`),
    every case of every test cell."""
    from lab_roundtrip import after_description, banned_pieces, graded_cells, solved_namespace

    from gptcourse.checks import CheckFailed
    from gptcourse.grading import check
    from gptcourse.grading.cases import CaseId

    module = _lab_module(lab)
    folder, points = module.LAB, _cell_points(module.LAB)
    graded = getattr(module, f"TestLab{lab}").graded()  # WRONG and the blind students, as the round trip grades
    students = {"solution": {}} | {student: answers for student, (answers, _) in sorted(graded.items())}
    rows = []
    for student, answers in students.items():
        torch.manual_seed(0)
        with contextlib.redirect_stdout(io.StringIO()):
            namespace = solved_namespace(folder, answers)
            banned = banned_pieces(folder, answers)
            for cell, test_ids in graded_cells(folder).items():
                verdicts = []
                for test_id in test_ids:
                    piece = CaseId.parse(test_id).piece
                    if piece in banned:
                        verdicts.append((test_id, piece, False, "banned"))
                        continue
                    try:
                        check(test_id, namespace[piece])
                    except CheckFailed as failure:
                        verdicts.append((test_id, piece, False, after_description(str(failure), test_id)))
                    else:
                        verdicts.append((test_id, piece, True, ""))
                earned = points[cell] if all(passed for *_, passed, _ in verdicts) else 0.0
                rows += [{"lab": lab, "piece": piece, "case": test_id, "student": student, "cell": cell,
                          "passed": passed, "points": earned, "message": message}
                         for test_id, piece, passed, message in verdicts]
    return rows


def _key(row: dict) -> tuple[str, str, str]:
    return row["lab"], row["student"], row["case"]


def differences(before: list[dict], after: list[dict]) -> list[str]:
    """What differs between two lists of rows: a row only in one, a verdict or points, or a stable message."""
    old, new = {_key(r): r for r in before}, {_key(r): r for r in after}
    found = [f"{' '.join(k)}: only {'before' if k in old else 'after'}" for k in sorted(old.keys() ^ new.keys())]
    for k in sorted(old.keys() & new.keys()):
        a, b = old[k], new[k]
        if (a["passed"], a["points"]) != (b["passed"], b["points"]):
            found.append(f"{' '.join(k)}: passed, points {a['passed']}, {a['points']} -> {b['passed']}, {b['points']}")
        elif stable(a["message"]) != stable(b["message"]):
            found.append(f"{' '.join(k)}:\n  before: {a['message']}\n  after:  {b['message']}")
    return found


def read(labs: list[str] = LABS) -> list[dict]:
    return [row for row in json.loads(SNAPSHOT.read_text()) if row["lab"] in labs]


def write(rows: list[dict], labs: list[str]) -> None:
    """Replace the rows of `labs` in the snapshot file with `rows` (one row a line, so that a diff reads)."""
    kept = [row for row in (json.loads(SNAPSHOT.read_text()) if SNAPSHOT.exists() else []) if row["lab"] not in labs]
    every = sorted(kept + rows, key=lambda r: (r["lab"], r["student"] != "solution", r["student"], r["case"]))
    SNAPSHOT.write_text("[\n" + ",\n".join(json.dumps(r, ensure_ascii=False) for r in every) + "\n]\n")


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in ("write", "diff"):
        print(__doc__)
        return 2
    os.environ.pop("GPTCOURSE_SECRET", None)  # the public hidden cases, as the round trips grade them
    labs = argv[1:] or LABS
    rows = [row for lab in labs for row in lab_rows(lab)]
    if argv[0] == "write":
        write(rows, labs)
        print(f"{len(rows)} rows of labs {' '.join(labs)} written to {SNAPSHOT}")
        return 0
    found = differences(read(labs), rows)
    print("\n".join(found) or f"{len(rows)} rows of labs {' '.join(labs)}: no difference")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
