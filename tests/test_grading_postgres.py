"""The gradebook on PostgreSQL (nbgrader's db_url), written by `gptcourse autograde` with 2 concurrent workers:
a consistent gradebook and the same scores as stock nbgrader on SQLite.

A throwaway server (Debian's `postgresql` package; `.ci/run` installs it) runs on loopback from a temporary data
folder (`grading/classroom/throwaway_postgres.py`)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from nbgrader_course import Course

from gptcourse.grading.box.zygote import Zygote
from gptcourse.grading.classroom.bench_grading import build_class
from gptcourse.grading.classroom.throwaway_postgres import postgres_bin, throwaway_server

LAB = "02_causal_attention"
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    """postgresql://... of a fresh server on 127.0.0.1, stopped and deleted afterwards."""
    bindir = postgres_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (initdb not found): `apt-get install postgresql` (CI does)")
    pytest.importorskip("psycopg", reason="the PostgreSQL driver: pip install -e '.[dev]'")
    with throwaway_server(bindir) as url:
        yield url


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
