"""`gptcourse autograde LAB --cluster`: on Dask workers (each grading in its own box) into a PostgreSQL gradebook,
the same scores as one-machine `gptcourse autograde`; resume; a worker killed mid-batch loses only the submission
it was grading; each start-up check stops the batch with its error before anyone is graded.

One class of lab 02 (the cheapest) is graded three times in this module: on one machine (SQLite, the reference),
on `--cluster local:2`, and on a scheduler and two `dask worker` processes this test starts, one of them killed."""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from nbgrader_course import Course
from test_grading_batch import LAB, gptcourse_autograde, make_class
from test_grading_postgres import postgres_url  # noqa: F401 (the module's throwaway PostgreSQL server)

from gptcourse.grading.bench_grading import build_class
from gptcourse.grading.zygote import Zygote

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Zygote.supported(), reason="gptcourse autograde's graders need Linux")]
STUDENTS = 4


def database(server_url: str, name: str) -> str:
    """A new database on the throwaway server: each course its own gradebook."""
    import psycopg

    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f"CREATE DATABASE {name}")
    return server_url.rsplit("/", 1)[0] + f"/{name}"


def postgres_scores(db_url: str) -> dict[str, dict[str, float]]:
    from nbgrader.api import Gradebook

    with Gradebook(db_url) as gb:
        return {sub.student.id: {grade.name: grade.score for nb in sub.notebooks for grade in nb.grades}
                for sub in gb.find_assignment(LAB).submissions}


def row_counts(db_url: str) -> tuple[int, int, int, int]:
    """Submissions, distinct students, grades, distinct graded cells."""
    import psycopg

    with psycopg.connect(db_url) as db:
        return (*db.execute("SELECT COUNT(*), COUNT(DISTINCT student_id) FROM submitted_assignment").fetchone(),
                *db.execute("SELECT COUNT(*), COUNT(DISTINCT cell_id) FROM grade").fetchone())


def postgres_course(root: Path, db_url: str) -> Course:
    course = Course(root, sqlite_gradebook=False)
    course.nbgrader("generate_assignment", LAB, "--force", "--db", db_url)
    for student, nb in build_class(course.root, LAB, STUDENTS).items():
        course.submit(student, LAB, nb)
    return course


def autograde(course: Course, *args: str, ok: bool = True) -> str:
    """`gptcourse autograde LAB ARGS` from the course root: its output (stderr merged)."""
    proc = subprocess.run([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, *args], cwd=course.root,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert (proc.returncode == 0) == ok, proc.stdout[-4000:]
    return proc.stdout


@contextlib.contextmanager
def dask_cluster(folder: Path, workers: int, worker_env: dict[str, str] | None = None,
                 scheduler_preload: Path | None = None) -> Iterator[tuple[str, list[subprocess.Popen]]]:
    """A Dask scheduler and `workers` worker processes (no nanny: a killed worker stays dead) on loopback:
    (the scheduler's address, the worker processes); all stopped afterwards."""
    folder.mkdir(parents=True, exist_ok=True)
    scheduler_file = folder / "scheduler.json"
    preload = ["--preload", str(scheduler_preload)] if scheduler_preload else []
    log = open(folder / "dask.log", "ab")
    processes = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                                   "--port", "0", "--no-dashboard", "--scheduler-file", str(scheduler_file),
                                   *preload], stdout=log, stderr=log)]
    try:
        deadline = time.monotonic() + 120
        while not scheduler_file.exists():
            assert time.monotonic() < deadline and processes[0].poll() is None, (folder / "dask.log").read_text()
            time.sleep(0.1)
        time.sleep(0.2)  # the file is written whole once it exists; let the writer close it
        address = json.loads(scheduler_file.read_text())["address"]
        grading = [subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", address, "--nthreads", "1",
                                     "--no-nanny", "--no-dashboard", "--local-directory", str(folder / f"w{i}")],
                                    stdout=log, stderr=log, env={**os.environ, **(worker_env or {})})
                   for i in range(workers)]
        processes += grading
        if workers:
            from distributed import Client

            with Client(address, timeout="60s") as client:
                client.wait_for_workers(workers, timeout=120)
        yield address, grading
    finally:
        for proc in reversed(processes):
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, float]]:
    """The class graded by one-machine `gptcourse autograde` (SQLite): {student: {test cell: score}}."""
    course = Course(tmp_path_factory.mktemp("one-machine"))
    make_class(course, STUDENTS)
    gptcourse_autograde(course, "--workers", "2")
    return course.scores(LAB)


@pytest.fixture(scope="module")
def on_local_cluster(postgres_url, tmp_path_factory) -> tuple[Course, str, str]:  # noqa: F811
    """The same class graded by `--cluster local:2` into PostgreSQL: (course, gradebook URL, output)."""
    db_url = database(postgres_url, "local_cluster")
    course = postgres_course(tmp_path_factory.mktemp("local-cluster"), db_url)
    return course, db_url, autograde(course, "--cluster", "local:2", "--db", db_url)


def test_local_cluster_gives_the_one_machine_scores(reference, on_local_cluster):
    _, db_url, output = on_local_cluster
    assert postgres_scores(db_url) == reference
    assert len({sum(scores.values()) for scores in reference.values()}) == 3  # solved, partial, untouched differ
    assert "2 Dask workers" in output
    assert f"graded {STUDENTS}, up to date 0, no notebook 0, failed or not graded 0" in output, output
    submissions, students, grades, cells = row_counts(db_url)
    assert submissions == students == STUDENTS and grades == STUDENTS * cells
    for student, by_cell in reference.items():  # the summary table, as on one machine
        line = next(line for line in output.splitlines() if line.startswith(student))
        assert f"{sum(by_cell.values()):g}/" in line and "graded" in line


def test_local_cluster_resumes(on_local_cluster):
    course, db_url, _ = on_local_cluster
    notebooks = sorted((course.root / "grading" / "autograded").glob(f"*/{LAB}/{LAB}.ipynb"))
    before = {p: p.stat().st_mtime_ns for p in notebooks}
    assert len(before) == STUDENTS
    output = autograde(course, "--cluster", "local:2", "--db", db_url)
    assert f"graded 0, up to date {STUDENTS}" in output, output
    assert {p: p.stat().st_mtime_ns for p in notebooks} == before


def test_killed_worker_loses_only_its_current_submission(reference, postgres_url, tmp_path):  # noqa: F811
    db_url = database(postgres_url, "killed_worker")
    course = postgres_course(tmp_path / "course", db_url)
    autograded = course.root / "grading" / "autograded"
    records = autograded / ".gptcourse-batch" / LAB
    with dask_cluster(tmp_path / "dask", 2) as (address, workers):
        grader = subprocess.Popen([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, "--cluster", address,
                                   "--db", db_url], cwd=course.root, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)

        def grading_now() -> set[str]:  # started (autograded folder made) and not finished (no record)
            started = {p.parent.name for p in autograded.glob(f"*/{LAB}")}
            return {s for s in started if not (records / f"{s}.json").exists()}

        deadline = time.monotonic() + 600
        # one submission done and both workers grading: the killed one is mid-submission
        while not (records.exists() and any(records.iterdir()) and len(grading_now()) == 2):
            assert grader.poll() is None, f"the batch ended before a worker could be killed:\n{grader.stdout.read()}"
            assert time.monotonic() < deadline, "no point where both workers were grading"
            time.sleep(0.05)
        killed_during = grading_now()
        os.kill(workers[0].pid, signal.SIGKILL)
        output, _ = grader.communicate(timeout=900)
    assert grader.returncode == 0, output[-4000:]
    assert len(killed_during) == 2
    assert f"graded {STUDENTS}, up to date 0, no notebook 0, failed or not graded 0" in output, output
    assert postgres_scores(db_url) == reference
    submissions, students, grades, cells = row_counts(db_url)
    assert submissions == students == STUDENTS and grades == STUDENTS * cells  # each graded exactly once
    assert len(list(records.iterdir())) == STUDENTS


# The start-up checks: each mismatch is an error naming the worker and what to do, before anyone is graded.


def test_worker_checks_name_the_course_folder_sandbox_and_gradebook(tmp_path):
    from gptcourse.grading.cluster import file_digest, worker_problems

    course = tmp_path / "course"
    course.mkdir()
    config = course / "nbgrader_config.py"
    config.write_text("c = get_config()  # noqa: F821\nc.Sandbox.bwrap = '/nonexistent/bwrap'\n")
    unreachable = "postgresql://postgres@127.0.0.1:1/gradebook"

    elsewhere = worker_problems(str(tmp_path / "not-here"), file_digest(config), unreachable)["problems"]
    assert len(elsewhere) == 2
    assert elsewhere[0].startswith("the course folder: ") and "is missing here" in elsewhere[0]
    assert "same path on every worker" in elsewhere[0]
    assert elsewhere[1].startswith(f"the gradebook: {unreachable} is not reachable (OperationalError")

    differs = worker_problems(str(course), "0" * 64, unreachable)["problems"]
    assert "is a different file here" in differs[0]

    facts = worker_problems(str(course), file_digest(config), unreachable)
    assert facts["problems"][0].startswith("the sandbox: ") and "/nonexistent/bwrap" in facts["problems"][0]
    assert len(facts["problems"]) == 2 and facts["cores"] >= 1


def test_cluster_needs_postgres(tmp_path):
    course = Course(tmp_path / "course")  # a SQLite gradebook
    output = autograde(course, "--cluster", "local:2", ok=False)
    assert "--cluster needs a gradebook every worker can write to at once: PostgreSQL" in output


def test_workers_without_bubblewrap_or_gradebook_stop_the_batch(postgres_url, tmp_path):  # noqa: F811
    db_url = database(postgres_url, "checks")
    course = Course(tmp_path / "course", sqlite_gradebook=False)
    course.nbgrader("generate_assignment", LAB, "--force", "--db", db_url)
    course.submit("student000", LAB, course.solved(LAB))
    no_bwrap = tmp_path / "bin"  # a PATH with python only
    no_bwrap.mkdir()
    os.symlink(sys.executable, no_bwrap / "python")
    with dask_cluster(tmp_path / "dask", 1, worker_env={"PATH": str(no_bwrap)}) as (address, _):
        output = autograde(course, "--cluster", address, "--db", db_url, ok=False)
        assert "autograde stopped before grading anyone: the cluster's workers are not ready" in output
        assert "the sandbox: " in output and "no `bwrap` executable on PATH" in output, output
        unreachable = "postgresql://postgres@127.0.0.1:1/gradebook"
        output = autograde(course, "--cluster", address, "--db", unreachable, ok=False)
    assert f"the gradebook: {unreachable} is not reachable" in output, output
    assert not (course.root / "grading" / "autograded").exists()


def test_scheduler_with_another_package_version_stops_the_batch(postgres_url, tmp_path):  # noqa: F811
    preload = tmp_path / "other_version.py"  # the scheduler's gptcourse reports another version
    preload.write_text("import importlib.metadata as m\n_real = m.version\n"
                       "m.version = lambda name: '9.9.9' if name == 'gptcourse' else _real(name)\n")
    course = Course(tmp_path / "course", sqlite_gradebook=False)
    with dask_cluster(tmp_path / "dask", 0, scheduler_preload=preload) as (address, _):
        output = autograde(course, "--cluster", address, "--db", postgres_url, ok=False)
    here = importlib.metadata.version("gptcourse")
    assert f"the scheduler has gptcourse 9.9.9, this machine {here}: install the same version" in output, output
    assert "the Dask cluster has no workers" in output
