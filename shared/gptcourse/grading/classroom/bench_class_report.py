"""Benchmark: `gptcourse report LAB` on a class of synthetic autograded submissions (the target: 500 in under 10 s).

    python -m gptcourse.grading.classroom.bench_class_report [--lab 02_causal_attention] [--students 500] [--course .]

Writes, into a temporary course, what autograde leaves for each student: the released notebook with the grader's
verdict records on its test cells (`steps/judge.py`), each case failed at random with one of three named mistakes
of its piece, keys that the lab's lesson teaches (a tenth of the students stopped early), and times the command on
them. Prints the machine's cores and load, the command's wall-clock and CPU time. `write_autograded` is also the
tests' way to make a synthetic class.
"""

from __future__ import annotations

import json
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path

from ..case_ids import CaseId
from .bench_grading import bench_parser, gptcourse, load_average, parse_bench_arguments, run
from .mistake_lessons import TAUGHT_IN

TARGET_SECONDS = 10.0
_CHECK = re.compile(r"""check\("([^"]+)\"""")


def test_cells(course: Path, lab: str) -> list[tuple[int, list[str]]]:
    """(index, its case ids) of every test cell of the lab's source (the release has no hidden calls)."""
    nb = json.loads((course / "solutions" / lab / f"{lab}.ipynb").read_text(encoding="utf-8"))
    return [(i, _CHECK.findall("".join(cell["source"]))) for i, cell in enumerate(nb["cells"])
            if cell["metadata"].get("nbgrader", {}).get("grade")]


def write_autograded(course: Path, lab: str, student: str, failing: dict[str, tuple[str, str | None]],
                     lines: tuple[str, ...] = (), source: Path | None = None) -> Path:
    """grading/autograded/STUDENT/LAB/LAB.ipynb as the judge writes it: the release (the hidden test cells' calls
    put back from `source`, default the course's solutions) with a verdict record per case; `failing`: case id ->
    (outcome, mistake key) of each case that fails. A cell's cases after its first failure are "skipped"."""
    solution = json.loads(((source or course / "solutions") / lab / f"{lab}.ipynb").read_text(encoding="utf-8"))
    nb = json.loads((course / "labs" / lab / f"{lab}.ipynb").read_text(encoding="utf-8"))
    nb["metadata"]["gptcourse"] = {"report": list(lines)}
    for i, cell in enumerate(nb["cells"]):
        grading = cell["metadata"].get("nbgrader", {})
        if not grading.get("grade") or grading.get("solution"):
            continue
        cell["source"] = solution["cells"][i]["source"]
        ids = _CHECK.findall("".join(cell["source"]))
        share = float(grading["points"]) / len(ids)
        verdicts, stopped = [], False
        for case in ids:
            outcome, mistake = ("skipped", None) if stopped else failing.get(case, ("passed", None))
            stopped |= outcome != "passed"
            parsed = CaseId.parse(case)
            verdicts.append({"lab": parsed.lab, "piece": parsed.piece, "case": case,
                             "hidden": parsed.hidden, "passed": outcome == "passed",
                             "outcome": outcome, "mistake": mistake, "points": 0.0, "max_points": share,
                             "message": f"{case} failed: ...\n{mistake or outcome}: what to do"})
        if not stopped:
            for verdict in verdicts:
                verdict["points"] = share
        cell["metadata"]["gptcourse"] = {"verdicts": verdicts}
    path = course / "grading" / "autograded" / student / lab / f"{lab}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(nb), encoding="utf-8")
    return path


def synthetic_class(course: Path, lab: str, students: int, seed: int = 0) -> None:
    """`students` submissions, each case failed with probability 0.15 by one of three named mistakes of its
    piece, keys the grader gives that the lab's lesson teaches (or raising, 1 in 4); every tenth student's notebook
    stopped early."""
    rng = random.Random(seed)
    cases = [case for _, ids in test_cells(course, lab) for case in ids]
    taught = sorted(key for key, (lesson, _) in TAUGHT_IN.items() if lesson == lab[:2] and not key.endswith(":"))
    named = {piece: rng.sample(taught, 3) for piece in sorted({CaseId.parse(case).piece for case in cases})}
    for k in range(students):
        failing = {}
        for case in cases:
            if rng.random() < 0.15:
                failing[case] = ("error", None) if rng.random() < 0.25 else \
                    ("wrong", rng.choice(named[CaseId.parse(case).piece]))
        lines = ("the kernel was restarted 3 times: the remaining cells were not run",) if k % 10 == 9 else ()
        if lines:
            failing |= dict.fromkeys(cases[len(cases) // 2:], ("not_run", None))
        write_autograded(course, lab, f"student{k:04d}", failing, lines)


def main(argv: list[str] | None = None) -> int:
    args = parse_bench_arguments(bench_parser(__spec__.name, __doc__, "02_causal_attention", 500), argv)
    with tempfile.TemporaryDirectory(prefix="gptcourse-bench-") as tmp:
        course = Path(tmp) / "course"
        for folder in ("labs", "solutions"):
            shutil.copytree(args.course / folder / args.lab, course / folder / args.lab)
        (course / "lessons").mkdir()
        for lesson in (args.course / "lessons").glob(f"{args.lab[:2]}_*.ipynb"):
            shutil.copy(lesson, course / "lessons")
        synthetic_class(course, args.lab, args.students)
        seconds, cpu = run(gptcourse("report", args.lab), course)
    print(f"{args.lab}: report of {args.students} synthetic submissions: {seconds:.1f} s wall-clock, {cpu:.1f} s "
          f"CPU (target: under {TARGET_SECONDS:.0f} s); load average after {load_average()}")
    return 0 if seconds < TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
