"""`gptcourse autograde LAB`: nbgrader's own autograde of a whole class, on every core, with a progress bar,
resumable, ending with a summary table.

It adds speed, never safety: each submission goes through nbgrader's `Autograde` converter configured exactly
as `nbgrader autograde LAB` is (the course's nbgrader_config.py, with every preprocessor it lists), in the same
gradebook. Two things change:
- Workers: `--workers` processes (default: one per core, plus one) each grade one submission at a time, handed
  out as they finish. On Linux they are forked from this process once it has imported nbgrader and torch (it
  runs no tensor code, so no thread pool is inherited), so no worker pays for those imports again. Each worker,
  and each kernel it runs, gets cores // workers intra-op threads (at least one).
- Kernels: each notebook still runs in a fresh kernel process of its own, but the kernel is forked from a warm
  zygote that has already imported torch, ipykernel and gptcourse (`zygote.py`). Sandboxed (the default, see
  `sandbox.py`): each worker starts its own box with its own zygote inside, and between two submissions the box
  kills every process left in it and empties its folders (`execute.with_box`); if the sandbox cannot start, the
  batch stops before grading anyone. Without the sandbox (`c.Sandbox.allow_unsandboxed` where it cannot start):
  one zygote serves all workers and the configured Execute preprocessor is subclassed only to take its kernels
  from there, and to kill a kernel once every cell has run instead of waiting for it to exit. `--no-zygote`
  (unsandboxed only) starts ordinary kernels.

Resume: after a submission is graded, a record of what was graded (a hash of the submitted files, timestamp.txt
included, and of the lab's source folder) is written to `<autograded>/.gptcourse-batch/LAB/STUDENT.json`, a folder
nbgrader's globs skip. A submission is graded again when its record is missing or differs (a resubmission, edited
tests), or its autograded notebook is missing, or with `--force` (use it after changing anything else a grade
depends on: nbgrader_config.py, GPTCOURSE_SECRET, the gptcourse package). Grading a submission first deletes its
record, and nbgrader replaces its autograded folder and updates its gradebook rows in place, so a batch killed half
way and run again ends with every submission graded once, with no duplicated rows; the interrupted one is simply
graded again.

Gradebook: SQLite (the default) takes one writer at a time; workers wait for the lock (busy timeout) instead of
failing with "database is locked", and a submission that still fails on a locked database is graded again (as is
one whose kernel died before running a cell). With
PostgreSQL (`--db postgresql://...` or `db_url` in nbgrader_config.py) workers write concurrently.

Run from the course root, like nbgrader. Worker and kernel logs go to `<autograded>/.gptcourse-batch/LAB.log`.
`--cluster ADDRESS | local:N`: Dask workers grade instead of this machine's (`cluster.py`); the rest is the same.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from ...threads import cores, thread_share
from .grade_one import (
    Outcome,
    Submission,
    grade_submission,
    nbgrader_app,
    state_folder,
    submissions,
    wait_for_sqlite_locks,
)


def autograded_folder(coursedir: Any, lab: str, student: str) -> Path:
    return Path(coursedir.format_path(coursedir.autograded_directory, student, lab))


# ---------------------------------------------------------------------------------------------------------------
# Workers: processes that each grade one submission at a time, sent over a pipe.


def _worker_main(lab: str, zygote_socket: str | None, nbgrader_args: list[str], conn: Connection,
                 log_path: str, threads: int, sandbox_config: Any) -> None:
    """A worker process: grade each student id received on `conn`, answer with the result, stop on None.
    `threads`: intra-op threads for this worker's tensor code and for each kernel it runs. `sandbox_config`:
    the course's config, to start this worker's box with, or None (unsandboxed)."""
    import torch

    from ..box.sandbox import Sandbox, course_folders
    from ..box.zygote import ZygoteClient, ZygoteError, die_with_parent

    die_with_parent()
    torch.set_num_threads(threads)
    log = os.open(log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.dup2(log, 1)  # nbgrader's log and anything printed go to the batch's log, not over the progress bar
    os.dup2(log, 2)

    def start_box() -> Any:  # its zygote preloads while this worker loads nbgrader
        return Sandbox(config=sandbox_config).start_box(course_folders(sandbox_config), threads=threads, lab=lab)

    box = start_box() if sandbox_config is not None else None
    wait_for_sqlite_locks()
    app = nbgrader_app(lab, nbgrader_args)
    client = None
    if zygote_socket and box is None:
        try:
            client = ZygoteClient(zygote_socket, kernel_threads=threads)
        except ZygoteError as err:
            app.log.warning("%s: grading with ordinary kernels", err)
    try:
        while (student := conn.recv()) is not None:
            try:
                if box is not None and not box.alive():  # a kernel killed its zygote: a fresh box for the next
                    box.close()
                    box = start_box()
                result = grade_submission(app, student, client, box)
            except Exception as err:  # one broken submission must not stop the class
                app.log.exception("grading %s failed", student)
                result = {"student": student, "ok": False, "seconds": 0.0,
                          "messages": [f"{type(err).__name__}: {err}"]}
            conn.send(result)
    finally:
        if box is not None:
            box.close()


# ---------------------------------------------------------------------------------------------------------------
# The batch: decide what needs grading, feed the workers, show progress, summarise.


class _Worker:
    """A worker process and the student it is grading."""

    def __init__(self, context: Any, lab: str, zygote_socket: str | None, nbgrader_args: list[str],
                 log_path: str, threads: int, sandbox_config: Any) -> None:
        self.conn, child_end = context.Pipe()
        self.process = context.Process(target=_worker_main, daemon=True,
                                       args=(lab, zygote_socket, nbgrader_args, child_end, log_path, threads,
                                             sandbox_config))
        self.process.start()
        child_end.close()
        self.student: str | None = None

    def give(self, student: str | None) -> None:
        self.student = student
        self.conn.send(student)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.process.join(timeout=30)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()


def _process_context() -> Any:
    """Linux: fork workers from this process, which has already imported nbgrader and torch (it runs no tensor
    code, so no thread pool is inherited); elsewhere: start fresh interpreters."""
    import multiprocessing

    from ..box.zygote import Zygote

    return multiprocessing.get_context("fork" if Zygote.supported() else "spawn")


def run_workers(lab: str, students: list[str], workers: int, zygote_socket: str | None, nbgrader_args: list[str],
                log_path: str, sandbox_config: Any = None) -> Iterator[Outcome]:
    """Grade `students` on `workers` worker processes (each with a box of its own if `sandbox_config` is not
    None); yields each outcome as it arrives."""
    from multiprocessing.connection import wait

    if not students:
        return
    queue = list(reversed(students))
    sys.stdout.flush()
    sys.stderr.flush()
    context = _process_context()
    workers = min(workers, len(students))
    threads = thread_share(workers)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # Python >= 3.12 warns about fork and BLAS threads
        pool = [_Worker(context, lab, zygote_socket, nbgrader_args, log_path, threads, sandbox_config)
                for _ in range(workers)]
    try:
        for w in pool:
            w.give(queue.pop())
        while busy := [w for w in pool if w.student is not None]:
            ready = wait([w.conn for w in busy] + [w.process.sentinel for w in busy])
            for w in busy:
                if w.conn in ready:
                    result = w.conn.recv()
                    yield Outcome(result["student"], "graded" if result["ok"] else "failed", result["seconds"],
                                  result["messages"])
                    w.student = None
                    if queue:
                        w.give(queue.pop())
                elif w.process.sentinel in ready:  # died mid-submission: that one is not graded, the rest go on
                    yield Outcome(w.student or "?", "failed", messages=[
                        f"grader process exited ({w.process.exitcode}) while grading; see the log"])
                    w.student = None
    finally:
        for w in pool:
            w.stop()


def gradebook_rows(db_url: str, lab: str, students: list[str]) -> dict[str, tuple[float, float, list[str]]]:
    """{student: (score, max score, notes from the gradebook)}."""
    from nbgrader.api import Gradebook, MissingEntry

    rows = {}
    with Gradebook(db_url) as gb:
        for student in students:
            try:
                sub = gb.find_submission(lab, student)
            except MissingEntry:
                continue
            notes = []
            if sub.needs_manual_grade:
                notes.append("needs manual grading")
            if sub.total_seconds_late > 0:
                notes.append(f"late by {sub.total_seconds_late:.0f} s (penalty {sub.late_submission_penalty:g})")
            rows[student] = (sub.score, sub.max_score, notes)
    return rows


def summary_table(outcomes: dict[str, Outcome], rows: dict[str, tuple[float, float, list[str]]]) -> str:
    header = ("student", "score", "notes")
    lines = []
    for student in sorted(outcomes):
        outcome = outcomes[student]
        score, max_score, notes = rows.get(student, (None, None, []))
        current = outcome.status in ("graded", "up to date") and score is not None  # else the gradebook's is stale
        shown = f"{score:g}/{max_score:g}" if current else "-"
        lines.append((student, shown, "; ".join([outcome.status, *notes, *outcome.messages[:3]])))
    widths = [max(len(row[i]) for row in [header, *lines]) for i in range(2)]
    return "\n".join(f"{a:<{widths[0]}}  {b:>{widths[1]}}  {c}" for a, b, c in [header, *lines])


def autograde_class(lab: str, workers: int | None = None, force: bool = False, use_zygote: bool = True,
                    nbgrader_args: list[str] | None = None, progress: bool = True,
                    cluster: str | None = None) -> dict[str, Outcome]:
    """Grade every submission of `lab` that needs it (all with `force`); print a summary; return the outcomes.
    Stops before grading anyone if the sandbox cannot start (unless the course allows unsandboxed grading).
    `cluster`: a Dask scheduler's address or local:N, whose workers grade instead (`cluster.py`)."""
    nbgrader_args = list(nbgrader_args or [])
    if cluster is not None:
        require_cluster_options(workers, use_zygote)
    app = nbgrader_app(lab, nbgrader_args)
    if cluster is not None:
        from .cluster import ClusterRunner

        runner: Any = ClusterRunner(cluster, str(Path(app.coursedir.root).resolve()), lab, app.coursedir.db_url,
                                    nbgrader_args)
    else:
        runner = LocalRunner(app, workers, use_zygote, nbgrader_args)
    try:
        return grade_submissions(app, lab, force, progress, runner)
    finally:
        runner.close()


def require_cluster_options(workers: int | None, use_zygote: bool) -> None:
    """Refuse the one-machine options that mean nothing on a cluster, saying what to use instead."""
    if workers is not None:
        raise SystemExit(f"--workers {workers} sets this machine's graders, and --cluster grades on the Dask "
                         "cluster's workers instead: choose their number there (--cluster local:N, or start N "
                         "`dask worker ADDRESS --nthreads 1`), without --workers")
    if not use_zygote:
        raise SystemExit("--no-zygote applies to this machine's unsandboxed graders; a cluster's workers grade in "
                         "their own boxes (or, unsandboxed, with ordinary kernels already): drop --no-zygote")


class LocalRunner:
    """The batch's workers on this machine: `workers` processes (default: cores + 1), each sandboxed (checked
    when made), or sharing one zygote where the course allows unsandboxed grading."""

    def __init__(self, app: Any, workers: int | None, use_zygote: bool, nbgrader_args: list[str]) -> None:
        from ..box.sandbox import course_folders, require_sandbox
        from ..box.zygote import Zygote

        sandboxed = require_sandbox(app.config, forbidden=course_folders(app.config, app.coursedir.root))
        self.lab, self.nbgrader_args = app.coursedir.assignment_id, nbgrader_args
        self.workers = max(1, workers or default_workers())
        self.sandbox_config = app.config if sandboxed else None
        self.zygote_log = tempfile.TemporaryFile()
        self.zygote = Zygote(self.zygote_log) if use_zygote and not sandboxed and Zygote.supported() else None
        self.log_path: str | None = None

    def describe(self) -> str:
        return f"{self.workers} workers{', sandboxed' if self.sandbox_config is not None else ''}"

    def run(self, students: list[str], log_path: str) -> Iterator[Outcome]:
        self.workers = min(self.workers, max(len(students), 1))
        self.log_path = log_path
        _preload_for_workers()
        return run_workers(self.lab, students, self.workers, self.zygote.socket_path if self.zygote else None,
                               self.nbgrader_args, log_path, self.sandbox_config)

    def close(self) -> None:
        if self.zygote is not None:
            self.zygote.close()
            if self.log_path is not None:
                with open(self.log_path, "ab") as log:  # the kernels' own output
                    self.zygote.log.seek(0)
                    shutil.copyfileobj(self.zygote.log, log)
            self.zygote = None
        self.zygote_log.close()


def grade_submissions(app: Any, lab: str, force: bool, progress: bool, runner: Any) -> dict[str, Outcome]:
    """Grade the submissions of `lab` that need it (all with `force`) through `runner` (this machine's workers or a
    cluster's), after refusing what intake refuses; print the summary; return every student's outcome."""
    from tqdm.auto import tqdm

    from ..steps.intake import admit_submitted, shown

    coursedir = app.coursedir
    require_assignment(coursedir.db_url, lab)
    refused: list[Path] = []
    found = submissions(coursedir, lab, refused)
    if not found and not refused:
        raise SystemExit(f"no submissions of {lab} in {coursedir.format_path(coursedir.submitted_directory, '*', lab)}")
    outcomes = {shown(folder.parent.name): Outcome(shown(folder.parent.name), "refused",
                                                   messages=admit_submitted(coursedir.root, folder))
                for folder in refused}
    outcomes.update({s.student: no_notebook_outcome(s, lab, app) for s in found if not s.has_notebook()})
    outcomes.update({s.student: Outcome(s.student, "up to date") for s in found if s.student not in outcomes
                     and not force and s.is_up_to_date(autograded_folder(coursedir, lab, s.student))})
    todo = [s.student for s in found if s.student not in outcomes]
    log_path = state_folder(coursedir, lab).with_suffix(".log")
    log_path.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    graded = runner.run(todo, str(log_path)) if todo else iter(())
    print(f"{lab}: {len(found)} submissions, {len(todo)} to grade ({len(found) - len(todo)} up to date or without "
          f"a notebook), {runner.describe()}; log: {log_path}", flush=True)
    bar = tqdm(total=len(todo), unit="submission", disable=not progress or not todo, dynamic_ncols=True)
    try:
        for outcome in graded:
            outcomes[outcome.student] = outcome
            bar.set_postfix_str(f"{outcome.student}: {outcome.status}", refresh=False)
            bar.update()
    except KeyboardInterrupt:
        print("\ninterrupted: run the same command again to grade the rest", file=sys.stderr)
    finally:
        bar.close()
        runner.close()
    for student in todo:
        outcomes.setdefault(student, Outcome(student, "not graded"))
    print(summary_table(outcomes, gradebook_rows(coursedir.db_url, lab, sorted(outcomes))))
    failed = sum(o.status in ("failed", "not graded", "refused") for o in outcomes.values())
    print(f"graded {sum(o.status == 'graded' for o in outcomes.values())}, up to date "
          f"{sum(o.status == 'up to date' for o in outcomes.values())}, no notebook "
          f"{sum(o.status == 'no notebook' for o in outcomes.values())}, failed or not graded {failed}, "
          f"in {time.perf_counter() - start:.1f} s")
    return outcomes


def no_notebook_outcome(submission: Submission, lab: str, app: Any) -> Outcome:
    """A submitted folder without any notebook: nbgrader does not see it; the summary and its report say so."""
    from ..steps.intake import report_no_notebook
    from ..steps.report import WriteGradingReport

    path = Path(app.coursedir.root, WriteGradingReport(config=app.config).report_path(submission.student, lab, lab))
    return Outcome(submission.student, "no notebook",
                   messages=[report_no_notebook(app.coursedir.root, submission.folder, submission.student, lab,
                                                      path)])


def _preload_for_workers() -> None:
    """What every worker imports, imported once before they are forked."""
    import nbclient  # noqa: F401
    import nbgrader.converters
    import nbgrader.preprocessors  # noqa: F401

    from ..box import zygote  # noqa: F401


def default_workers() -> int:
    """One per core, plus one: a kernel spends part of its life waiting for messages, and the spare worker fills
    those gaps."""
    return cores() + 1


def require_assignment(db_url: str, lab: str) -> None:
    """Stop, saying how to fix it, when `lab` was never generated into the gradebook at `db_url`."""
    from nbgrader.api import Gradebook, MissingEntry

    with Gradebook(db_url) as gb:
        try:
            gb.find_assignment(lab)
        except MissingEntry:
            raise SystemExit(f"{lab} is not in the gradebook: run `nbgrader generate_assignment {lab}` first") \
                from None


def command(args: argparse.Namespace) -> int:
    """`gptcourse autograde`."""
    outcomes = autograde_class(args.lab, args.workers, args.force, not args.no_zygote,
                               ["--db", args.db] if args.db else [], cluster=args.cluster)
    return 0 if all(o.status in ("graded", "up to date", "no notebook") for o in outcomes.values()) else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("lab", help="the assignment, e.g. 02_causal_attention")
    parser.add_argument("--workers", type=int, default=None,
                        help="parallel graders on this machine (default: cores + 1; not with --cluster)")
    parser.add_argument("--force", action="store_true", help="grade again submissions already graded")
    parser.add_argument("--db", default=None, help="gradebook URL, as nbgrader's --db (e.g. postgresql://...)")
    parser.add_argument("--cluster", default=None, metavar="ADDRESS",
                        help="grade on a Dask cluster: a scheduler's address (tcp://host:8786) or local:N (N worker "
                             "processes here); needs a PostgreSQL gradebook and the cluster extra")
    parser.add_argument("--no-zygote", action="store_true",
                        help="start an ordinary kernel per notebook (unsandboxed grading on this machine only)")
