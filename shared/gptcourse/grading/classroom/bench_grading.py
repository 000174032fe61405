"""Benchmark: stock serial `nbgrader autograde LAB` against `gptcourse autograde LAB` on the same class.

    python -m gptcourse.grading.classroom.bench_grading [--lab 02_causal_attention] [--students 32] [--course .]
                                              [--cluster local:2] [--cluster-db postgresql://...]

Builds a class of submissions of one lab in two identical temporary copies of the course (its
nbgrader_config.py, solutions/ and labs/): a third hand in the solution, a third the solution with one piece
left as the released stub (which piece varies), a third the untouched release. One copy is graded by
`nbgrader autograde LAB` (one sandbox for the command, a kernel forked in it for each submission, one after
another), the other by `gptcourse autograde LAB` (one sandbox per worker, kernels forked in it). Both sandboxed, as
the course's nbgrader_config.py requires. Prints the machine's cores and load, both wall-clock times and their ratio
against issue 49's target of 0.25 (which both graders' shared sandbox puts out of reach on few cores: only the
workers' parallelism remains, so the ratio cannot go much below 1 / cores), the CPU time each used (itself and every
process it started: a measure other programs running on the machine do not inflate as much), and whether every test
cell of every student got the same score from both.

Then a third copy is graded by `gptcourse autograde LAB --cluster local:2` (`--cluster`: another size or a
scheduler's address; `--cluster none` skips it) into a PostgreSQL gradebook (`--cluster-db`, else a throwaway
server on loopback, `throwaway_postgres.py`): its time against one-machine `gptcourse autograde` on the same
submissions, as a ratio, and whether its scores are the stock ones. Skipped, with the reason printed, where Dask,
psycopg or PostgreSQL is missing.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat

COURSE_FILES = ("nbgrader_config.py", "solutions", "labs")
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"


def copy_course(source: Path, destination: Path) -> Path:
    destination.mkdir(parents=True)
    for name in COURSE_FILES:
        (shutil.copytree if (source / name).is_dir() else shutil.copy)(source / name, destination / name)
    return destination


def answered(course: Path, lab: str, stubs: set[str] = frozenset()) -> nbformat.NotebookNode:
    """The released lab with every solution cell answered by the solution's code, except the cells in `stubs`,
    left as released."""
    solution = nbformat.read(course / "solutions" / lab / f"{lab}.ipynb", as_version=4)
    answers = {cell.metadata.nbgrader["grade_id"]: "\n".join(
        line for line in cell.source.splitlines() if BEGIN not in line and END not in line)
        for cell in solution.cells if cell.metadata.get("nbgrader", {}).get("solution")}
    released = nbformat.read(course / "labs" / lab / f"{lab}.ipynb", as_version=4)
    for cell in released.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if grade_id in answers and grade_id not in stubs:
            cell.source = answers[grade_id]
    return released


def solution_cells(course: Path, lab: str) -> list[str]:
    nb = nbformat.read(course / "labs" / lab / f"{lab}.ipynb", as_version=4)
    return [c.metadata.nbgrader["grade_id"] for c in nb.cells if c.metadata.get("nbgrader", {}).get("solution")]


def build_class(course: Path, lab: str, students: int) -> dict[str, nbformat.NotebookNode]:
    """{student: notebook}: solved, one piece left undone (the last piece first, then earlier ones), untouched,
    in turn."""
    pieces = solution_cells(course, lab)
    released = nbformat.read(course / "labs" / lab / f"{lab}.ipynb", as_version=4)
    class_ = {}
    for i in range(students):
        kind = i % 3
        if kind == 0:
            class_[f"student{i:03d}-solved"] = answered(course, lab)
        elif kind == 1:
            class_[f"student{i:03d}-partial"] = answered(course, lab, {pieces[-1 - (i // 3) % len(pieces)]})
        else:
            class_[f"student{i:03d}-untouched"] = released
    return class_


def submit(course: Path, lab: str, class_: dict[str, nbformat.NotebookNode]) -> None:
    for student, nb in class_.items():
        folder = course / "grading" / "submitted" / student / lab
        folder.mkdir(parents=True)
        nbformat.write(nb, folder / f"{lab}.ipynb")
        (folder / "timestamp.txt").write_text("2025-01-01 12:00:00.000000 UTC")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(command: list[str], course: Path) -> tuple[float, float]:
    """(wall-clock seconds, CPU seconds of it and all its descendants) of `command` run in `course`; raises with
    its output if it fails."""
    start, cpu = time.perf_counter(), _children_cpu()
    proc = subprocess.run(command, cwd=course, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}:\n{proc.stdout[-3000:]}")
    return seconds, _children_cpu() - cpu


def scores(course: Path, lab: str, db_url: str | None = None) -> dict[str, dict[str, float]]:
    """{student: {test cell: score}} from `db_url`, by default the course's SQLite gradebook."""
    from nbgrader.api import Gradebook

    with Gradebook(db_url or f"sqlite:///{course / 'grading' / 'gradebook.db'}") as gb:
        return {sub.student.id: {grade.name: grade.score for nb in sub.notebooks for grade in nb.grades}
                for sub in gb.find_assignment(lab).submissions}


def nbgrader(*args: str) -> list[str]:
    return [sys.executable, "-m", "nbgrader", *args]


def gptcourse(*args: str) -> list[str]:
    return [sys.executable, "-m", "gptcourse.cli", *args]


def bench_parser(module: str, description: str | None, lab: str, students: int) -> argparse.ArgumentParser:
    """The options of a grading benchmark (`python -m MODULE`): --lab, --students, --course."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lab", default=lab)
    parser.add_argument("--students", type=int, default=students)
    parser.add_argument("--course", type=Path, default=Path("."), help="the course root (default: .)")
    return parser


def parse_bench_arguments(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """The parsed options, once --course is known to be a course root; prints the machine's cores and load."""
    args = parser.parse_args(argv)
    if not (args.course / "nbgrader_config.py").exists():
        parser.error(f"{args.course.resolve()} is not the course root (no nbgrader_config.py): pass --course")
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {cores} cores available ({os.cpu_count()} in total), load average {load_average()}")
    return args


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def cluster_unavailable(db_url: str | None) -> str | None:
    """Why the cluster line cannot run here, or None."""
    import importlib.util

    from .throwaway_postgres import postgres_bin

    missing = [name for name in ("distributed", "psycopg") if importlib.util.find_spec(name) is None]
    if missing:
        return f"{' and '.join(missing)} not installed (pip install -e '.[cluster,dev]')"
    if db_url is None and postgres_bin() is None:
        return "no PostgreSQL server to start (initdb not found: apt-get install postgresql) and no --cluster-db"
    return None


@contextlib.contextmanager
def cluster_gradebook(db_url: str | None) -> Iterator[str]:
    """`db_url`, or a new database on a throwaway server started for the benchmark."""
    from .throwaway_postgres import create_database, postgres_bin, throwaway_server

    if db_url is not None:
        yield db_url
        return
    bindir = postgres_bin()
    assert bindir is not None  # cluster_unavailable said so
    with throwaway_server(bindir) as server:
        yield create_database(server, "bench_cluster")


def bench_cluster(args: argparse.Namespace, course: Path, class_: dict[str, nbformat.NotebookNode],
                  fast_seconds: float, expected: dict[str, dict[str, float]]) -> bool:
    """Grade `class_` in `course` with --cluster into PostgreSQL; print its time against one-machine
    `gptcourse autograde` (`fast_seconds`) and whether its scores are `expected`. Returns whether they are."""
    with cluster_gradebook(args.cluster_db) as db_url:
        run(nbgrader("generate_assignment", args.lab, "--force", "--db", db_url), course)
        submit(course, args.lab, class_)
        seconds, cpu = run(gptcourse("autograde", args.lab, "--cluster", args.cluster, "--db", db_url), course)
        got = scores(course, args.lab, db_url)
    same = got == expected and len(got) == len(class_)
    print(f"cluster gptcourse autograde {args.lab} --cluster {args.cluster}: {seconds:7.1f} s "
          f"({seconds / len(class_):.2f} s per submission), CPU {cpu:.1f} s (the local cluster's workers included; "
          f"a remote scheduler's are not)")
    print(f"ratio cluster/fast: {seconds / fast_seconds:.3f} wall-clock (--cluster {args.cluster} against one "
          f"machine's gptcourse autograde); scores identical to stock for all {len(class_)} submissions: {same}")
    return same


def main(argv: list[str] | None = None) -> int:
    parser = bench_parser(__spec__.name, __doc__, "02_causal_attention", 32)
    parser.add_argument("--workers", type=int, default=None, help="gptcourse autograde --workers")
    parser.add_argument("--cluster", default="local:2",
                        help="the cluster line's --cluster (default: local:2; none: no cluster line)")
    parser.add_argument("--cluster-db", default=None,
                        help="the cluster line's PostgreSQL gradebook (default: a throwaway server)")
    args = parse_bench_arguments(parser, argv)
    with tempfile.TemporaryDirectory(prefix="gptcourse-bench-") as tmp:
        stock, fast = (copy_course(args.course, Path(tmp) / name) for name in ("stock", "fast"))
        class_ = build_class(stock, args.lab, args.students)
        for course in (stock, fast):
            run(nbgrader("generate_assignment", args.lab, "--force"), course)
            submit(course, args.lab, class_)
        print(f"{args.lab}: {len(class_)} submissions (solved, one piece undone, untouched)", flush=True)

        stock_seconds, stock_cpu = run(nbgrader("autograde", args.lab), stock)
        print(f"stock   nbgrader autograde {args.lab}: {stock_seconds:7.1f} s "
              f"({stock_seconds / len(class_):.2f} s per submission), CPU {stock_cpu:.1f} s", flush=True)
        workers = ["--workers", str(args.workers)] if args.workers else []
        fast_seconds, fast_cpu = run(gptcourse("autograde", args.lab, *workers), fast)
        print(f"fast   gptcourse autograde {args.lab}: {fast_seconds:7.1f} s "
              f"({fast_seconds / len(class_):.2f} s per submission), CPU {fast_cpu:.1f} s")
        print(f"load average after: {load_average()} (other processes slow both)")

        expected, got = scores(stock, args.lab), scores(fast, args.lab)
        same = expected == got and len(got) == len(class_)
        ratio = fast_seconds / stock_seconds
        cores = len(os.sched_getaffinity(0))
        print(f"ratio fast/stock: {ratio:.3f} wall-clock (target <= 0.25: {'met' if ratio <= 0.25 else 'NOT met'}; "
              f"the workers' parallelism alone bounds it near 1/{cores} on {cores} cores), "
              f"{fast_cpu / stock_cpu:.3f} CPU; scores identical for all {len(class_)} submissions: {same}")
        if not same:
            for student in sorted(set(expected) | set(got)):
                if expected.get(student) != got.get(student):
                    print(f"  {student}: stock {expected.get(student)} fast {got.get(student)}")
        totals = sorted(sum(s.values()) for s in expected.values())
        print(f"total scores (stock): min {totals[0]:g}, max {totals[-1]:g}, distinct {len(set(totals))}")
        if args.cluster == "none":
            return 0 if same else 1
        unavailable = cluster_unavailable(args.cluster_db)
        if unavailable:
            print(f"cluster line skipped: {unavailable}")
            return 0 if same else 1
        cluster = copy_course(args.course, Path(tmp) / "cluster")
        (cluster / "grading").mkdir(exist_ok=True)
        same = bench_cluster(args, cluster, class_, fast_seconds, expected) and same
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
