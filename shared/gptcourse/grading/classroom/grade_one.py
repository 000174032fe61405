"""One submission graded through nbgrader: what `gptcourse autograde`'s workers (`batch.py`) and a Dask cluster's
(`cluster.py`) both run, so that every path grades a submission the same way.

`nbgrader_app(lab, args)` is `nbgrader autograde LAB ARGS` initialised with the course's config;
`grade_submission(app, student, ...)` runs nbgrader's `Autograde` converter on one student's submission (its
kernels forked in a box, or by an unsandboxed zygote), grading it again after a failure that says nothing about it
(`RETRY_WHEN`), and writes the resume record (`Submission.record`: a hash of the submitted files and the lab's
source) once it is graded.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STATE_FOLDER = ".gptcourse-batch"  # inside the autograded folder; nbgrader's "*" globs skip dot-names
SQLITE_BUSY_TIMEOUT_MS = 300_000
RETRIES = 3
# Failures that say nothing about the submission, so it is graded again: a busy SQLite gradebook; a kernel that
# died before running any cell (parallel kernels can race for the same free TCP port).
RETRY_WHEN = ("database is locked", "while starting new kernel client")


def nbgrader_app(lab: str, nbgrader_args: list[str]) -> Any:
    """An initialised `nbgrader autograde LAB ARGS` application: the course's config, loaded as nbgrader does."""
    from nbgrader.apps import AutogradeApp

    app = AutogradeApp()
    app.initialize([lab, *nbgrader_args])
    app.coursedir.assignment_id = lab
    return app


def folder_hash(*folders: Path) -> str:
    """A hash of every file's name and bytes in `folders`."""
    from ..steps.intake import is_regular

    digest = hashlib.sha256()
    for folder in folders:
        for path in sorted(p for p in folder.rglob("*") if is_regular(p)):
            digest.update(str(path.relative_to(folder)).encode() + b"\0" + path.read_bytes() + b"\0")
        digest.update(b"\1")
    return digest.hexdigest()


@dataclass(frozen=True)
class Submission:
    student: str
    folder: Path  # the submitted folder
    source: Path  # the lab's source folder (solutions and tests)
    record: Path  # what was graded, written after a successful grade

    def fingerprint(self) -> str:
        """What a grade depends on: the submitted files (timestamp.txt included) and the lab's source."""
        return folder_hash(self.folder, self.source)

    def is_up_to_date(self, autograded: Path) -> bool:
        try:
            graded = json.loads(self.record.read_text())["fingerprint"]
        except (OSError, ValueError, KeyError):
            return False
        notebooks = [p.name for p in self.source.glob("*.ipynb")]  # the lab's, whatever the student named theirs
        return graded == self.fingerprint() and all((autograded / name).exists() for name in notebooks)

    def has_notebook(self) -> bool:
        return any(self.folder.glob("*.ipynb"))


def submissions(coursedir: Any, lab: str, refused: list[Path] | None = None) -> list[Submission]:
    """Every submission of `lab` in the submitted folder, as nbgrader finds them, whose student id is allowed
    (`intake.STUDENT_ID`) and whose folder is not a link; the others are added to `refused`."""
    from ..steps.intake import student_id_problem

    pattern = re.compile(coursedir.format_path(coursedir.submitted_directory, "(?P<student_id>[^/]+)", lab,
                                               escape=True) + "$")
    excluded = set(filter(None, coursedir.student_id_exclude.split(",")))
    source = Path(coursedir.format_path(coursedir.source_directory, ".", lab))
    found = []
    for folder in sorted(glob.glob(coursedir.format_path(coursedir.submitted_directory, "*", lab))):
        match = pattern.match(folder)
        if match and os.path.isdir(folder) and match["student_id"] not in excluded:
            student = match["student_id"]
            if student_id_problem(student) is not None or os.path.islink(folder):
                if refused is not None:
                    refused.append(Path(folder))
                continue
            found.append(Submission(student, Path(folder), source, state_folder(coursedir, lab) / f"{student}.json"))
    return found


def state_folder(coursedir: Any, lab: str) -> Path:
    return Path(coursedir.root, coursedir.autograded_directory, STATE_FOLDER, lab)


def wait_for_sqlite_locks() -> None:
    """Every SQLite connection in this process waits for another writer's lock instead of failing at once."""
    import sqlite3

    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _busy_timeout(dbapi_connection: Any, _: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")


class _Messages(logging.Handler):
    """Collects the warnings and errors nbgrader logs while one submission is graded."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _is_execute(preprocessor: Any) -> bool:
    from nbclient import NotebookClient

    return isinstance(preprocessor, type) and issubclass(preprocessor, NotebookClient)


def grade_submission(app: Any, student: str, zygote_client: Any, box: Any = None) -> dict[str, Any]:
    """nbgrader's autograde of one student's submission (forced: the caller decided it needs grading), its
    kernels forked by `zygote_client`'s zygote or run in `box`."""
    from nbgrader.converters import Autograde
    from nbgrader.converters.base import NbGraderException
    from traitlets.utils.importstring import import_item

    from ..box.zygote import with_zygote
    from ..steps.execute import with_box

    lab = app.coursedir.assignment_id
    submission = next(s for s in submissions(app.coursedir, lab) if s.student == student)
    submission.record.unlink(missing_ok=True)
    app.coursedir.student_id = student
    messages = _Messages()
    app.log.addHandler(messages)
    start = time.perf_counter()
    try:
        for attempt in range(RETRIES):
            messages.lines.clear()
            converter = Autograde(coursedir=app.coursedir, parent=app, force=True)
            preprocessors = [import_item(p) if isinstance(p, str) else p for p in converter.autograde_preprocessors]
            if box is not None:
                converter.autograde_preprocessors = [with_box(p, box) if _is_execute(p) else p for p in preprocessors]
            elif zygote_client is not None:
                converter.autograde_preprocessors = [with_zygote(p, zygote_client) if _is_execute(p) else p
                                                     for p in preprocessors]
            try:
                converter.start()
                ok = True
            except NbGraderException:
                ok = False
            retry = [line for line in messages.lines if any(reason in line for reason in RETRY_WHEN)]
            if ok or not retry or attempt == RETRIES - 1:
                break
            app.log.warning("grading %s again after: %s", student, retry[0].splitlines()[0])
    finally:
        app.log.removeHandler(messages)
    if ok:
        submission.record.parent.mkdir(parents=True, exist_ok=True)
        submission.record.write_text(json.dumps({"fingerprint": submission.fingerprint(), "graded": time.time()}))
    return {"student": student, "ok": ok, "seconds": time.perf_counter() - start,
            "messages": [line.splitlines()[0] for line in messages.lines if line.strip()]}


@dataclass
class Outcome:
    student: str
    status: str  # "graded", "up to date", "no notebook", "failed", "not graded", "refused" (its student id)
    seconds: float = 0.0
    messages: list[str] = field(default_factory=list)


