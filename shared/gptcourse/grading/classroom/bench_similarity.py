"""Benchmark: `gptcourse similarity LAB` on a class of submissions (the target: 200 in at most a minute).

    python -m gptcourse.grading.classroom.bench_similarity [--lab 09_training_by_hand] [--students 200] [--course .]

Builds the class in a temporary copy of the course (nbgrader_config.py, solutions/, labs/): every tenth student
hands in the untouched release, the others the public solution with a few lines of their own inserted at random
places in each solution cell. That is the slow case: every pair shares most of its code, so copydetect compares
every pair in full (honest code, which shares little, is mostly skipped by the fingerprint check), and every pair
is flagged. Prints the machine's cores and load, the command's wall-clock and CPU time, and its summary line.
"""

from __future__ import annotations

import random
import sys
import tempfile
from pathlib import Path

import nbformat

from .bench_grading import (
    answered,
    bench_parser,
    copy_course,
    gptcourse,
    load_average,
    parse_bench_arguments,
    run,
    submit,
)

TARGET_SECONDS = 60.0


def own_lines(code: str, rng: random.Random, student: int) -> str:
    """`code` with 1 to 3 statements of the student's own after random lines (indented as the line after)."""
    lines = code.splitlines()
    for k in range(rng.randint(1, 3)):
        at = rng.randrange(1, len(lines)) if len(lines) > 1 else 1
        following = lines[at] if at < len(lines) else ""
        indent = following[:len(following) - len(following.lstrip())] or "    "
        lines.insert(at, f"{indent}check_{k} = {student} * {k}  # my own note {rng.random():.3f}")
    return "\n".join(lines)


def build_class(course: Path, lab: str, students: int, seed: int = 0) -> dict[str, nbformat.NotebookNode]:
    rng = random.Random(seed)
    released = nbformat.read(course / "labs" / lab / f"{lab}.ipynb", as_version=4)
    class_ = {}
    for i in range(students):
        if i % 10 == 9:
            class_[f"student{i:03d}"] = released
            continue
        nb = answered(course, lab)
        for cell in nb.cells:
            if cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = own_lines(cell.source, rng, i)
        class_[f"student{i:03d}"] = nb
    return class_


def main(argv: list[str] | None = None) -> int:
    args = parse_bench_arguments(bench_parser(__spec__.name, __doc__, "09_training_by_hand", 200), argv)
    with tempfile.TemporaryDirectory(prefix="gptcourse-bench-") as tmp:
        course = copy_course(args.course, Path(tmp) / "course")
        submit(course, args.lab, build_class(course, args.lab, args.students))
        seconds, cpu = run(gptcourse("similarity", args.lab), course)
        summary = (course / "grading" / "similarity" / args.lab / "similarity.csv").read_text().count("\n") - 1
    print(f"{args.lab}: {args.students} submissions, {summary} pairs compared: {seconds:.1f} s wall-clock, "
          f"{cpu:.1f} s CPU (target: at most {TARGET_SECONDS:.0f} s); load average after {load_average()}")
    return 0 if seconds <= TARGET_SECONDS else 1


if __name__ == "__main__":
    sys.exit(main())
