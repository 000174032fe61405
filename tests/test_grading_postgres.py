"""The gradebook on PostgreSQL (nbgrader's db_url), written by `gptcourse autograde` with 2 concurrent workers:
a consistent gradebook and the same scores as stock nbgrader on SQLite.

A throwaway server (Debian's `postgresql` package; `.ci/run` installs it) runs on loopback from a temporary data
folder, as the `postgres` user when the tests run as root (PostgreSQL refuses to run as root)."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from nbgrader_course import Course

from gptcourse.grading.bench_grading import build_class
from gptcourse.grading.zygote import Zygote

LAB = "02_causal_attention"
pytestmark = pytest.mark.slow


def postgres_bin() -> Path | None:
    """The folder of initdb and pg_ctl: on PATH, or Debian's /usr/lib/postgresql/VERSION/bin."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).resolve().parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """postgresql://... of a fresh server on 127.0.0.1, stopped and deleted afterwards."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (initdb not found): `apt-get install postgresql` (CI does)")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver: pip install -e '.[dev]'")
    as_user: list[str] = []
    folder = Path(tempfile.mkdtemp(prefix="gptcourse-pg-"))
    if os.geteuid() == 0:  # the server refuses root: run it as Debian's postgres user
        as_user = ["runuser", "-u", "postgres", "--"]
        shutil.chown(folder, "postgres")
    data, port = folder / "data", free_port()

    def run(*command: str) -> None:
        proc = subprocess.run([*as_user, *command], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"{' '.join(command)}:\n{proc.stdout}\n{proc.stderr}"

    run(str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync")
    run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(folder / "server.log"), "-w", "-o",
        f"-h 127.0.0.1 -p {port} -k {folder} -c fsync=off", "start")
    try:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres",
                             autocommit=True) as admin:  # CREATE DATABASE runs outside a transaction
            admin.execute("CREATE DATABASE gradebook")
        yield f"postgresql://postgres@127.0.0.1:{port}/gradebook"
    finally:
        run(str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.skipif(not Zygote.supported(), reason="gptcourse autograde's workers need Linux")
def test_concurrent_batch_on_postgres_matches_sqlite(postgres_url, tmp_path):
    import psycopg

    students = 4
    on_postgres, on_sqlite = Course(tmp_path / "postgres", sqlite_gradebook=False), Course(tmp_path / "sqlite")
    for course, db in ((on_postgres, ["--db", postgres_url]), (on_sqlite, [])):
        course.nbgrader("generate_assignment", LAB, "--force", *db)
        for student, nb in build_class(course.root, LAB, students).items():
            course.submit(student, LAB, nb)
    on_sqlite.nbgrader("autograde", LAB)
    proc = subprocess.run([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, "--workers", "2",
                           "--db", postgres_url], cwd=on_postgres.root, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert f"graded {students}, up to date 0, no notebook 0, failed or not graded 0" in proc.stdout
    assert not (on_postgres.root / "grading" / "gradebook.db").exists()  # nothing went to the default SQLite

    from nbgrader.api import Gradebook

    with Gradebook(postgres_url) as gb:
        on_pg = {sub.student.id: {grade.name: grade.score for nb in sub.notebooks for grade in nb.grades}
                 for sub in gb.find_assignment(LAB).submissions}
    assert on_pg == on_sqlite.scores(LAB)
    with psycopg.connect(postgres_url) as db:
        assert db.execute("SELECT COUNT(*), COUNT(DISTINCT student_id) FROM submitted_assignment").fetchone() \
            == (students, students)
        total, per_submission = db.execute(
            "SELECT COUNT(*), COUNT(DISTINCT cell_id) FROM grade").fetchone()
        assert total == students * per_submission
