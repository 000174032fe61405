"""`gptcourse autograde LAB --cluster`: on Dask workers (each grading in its own box) into a PostgreSQL gradebook,
the same scores as plain `nbgrader autograde`; a worker killed mid-batch loses only the submission it was
grading; resume; each start-up check stops the batch with its error before anyone is graded.

One class of 14 submissions of lab 02 (the cheapest): solved, untouched, one piece left as released, four known
mistakes (lab 02's round trip), six sly or broken ones (the attacks' table: a kernel that dies, patched checks,
edited locked cells, a notebook that is not JSON, deleted cells, report lines forged in its metadata), and one of
the intake's (links to the course's secrets, a FIFO and a hard link beside an honest notebook), whose refusals
each worker makes as plain nbgrader does. It is graded twice: by plain `nbgrader autograde` (SQLite, the
reference) and on a scheduler and two `dask worker` processes this test starts, one of them killed mid-batch;
`--cluster local:2` then resumes that class and grades a resubmission."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.metadata
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest
from nbgrader_course import Course
from test_grading_attacks import FORGED_NOTE
from test_grading_attacks import submissions as attacks
from test_grading_batch import LAB
from test_grading_intake import ROOT_ONLY, hostile_folder, leaks
from test_grading_intake import SECRET as INTAKE_SECRET
from test_grading_postgres import postgres_url  # noqa: F401 (the module's throwaway PostgreSQL server)
from test_labs_02 import PLANTED_MISTAKES, WRONG

from gptcourse.grading.box.zygote import Zygote
from gptcourse.grading.classroom.bench_grading import answered
from gptcourse.grading.classroom.throwaway_postgres import create_database

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Zygote.supported(), reason="gptcourse autograde's graders need Linux")]
ATTACKS = ("solution", "untouched", "kernel-dies", "patch-torch", "edited-locked-cells", "malformed-json",
           "deleted-cells", "forged-report")
MISTAKES = ("softmax-wrong-axis", "mask-wrong-triangle", "mask-diagonal-masked", "no-value-projection")
PARTIAL = "attentionhead-left-as-released"  # a student id: lowercase (gptcourse.grading.steps.intake.STUDENT_ID)
HOSTILE = "links-beside-the-notebook"  # the intake's
STUDENTS = len(ATTACKS) + len(MISTAKES) + 2
RESUBMITTED = "no-value-projection"


def the_class(course: Course) -> dict[str, tuple[nbformat.NotebookNode | str, set[str]]]:
    """{student: (notebook, or the text of a file that is not one; the test cells it fails)}."""
    sly = attacks(course)
    class_ = {student: sly[student][:2] for student in ATTACKS}
    class_.update({student: (course.solved(LAB, WRONG[student][0]), WRONG[student][1]) for student in MISTAKES})
    class_[PARTIAL] = (answered(course.root, LAB, {"AttentionHead"}),  # the released stub fails the head's tests
                       {"test_AttentionHead", "test_AttentionHead_hidden"})
    return class_


def hand_in(course: Course) -> dict[str, set[str]]:
    """Hand in the class (the lab already released): {student: the test cells it fails}."""
    class_ = the_class(course)
    for student, (nb, _) in class_.items():
        if isinstance(nb, str):
            folder = course.root / "grading" / "submitted" / student / LAB
            folder.mkdir(parents=True)
            (folder / f"{LAB}.ipynb").write_text(nb)
        else:
            course.submit(student, LAB, nb)
    submitted = course.root / "grading" / "submitted"
    root_only, outside = course.root / "root-only.txt", course.root / "outside.txt"
    root_only.write_text(ROOT_ONLY)
    root_only.chmod(0o600)
    outside.write_text(INTAKE_SECRET)
    hostile_folder(course, submitted / HOSTILE / LAB, root_only, outside)
    return {**{student: failing for student, (_, failing) in class_.items()}, HOSTILE: set()}


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
    hand_in(course)
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
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Course, dict[str, set[str]],
                                                                 dict[str, dict[str, float]]]:
    """The class graded by plain `nbgrader autograde` (SQLite): (course, {student: test cells it fails},
    {student: {test cell: score}})."""
    course = Course(tmp_path_factory.mktemp("nbgrader"))
    course.nbgrader("generate_assignment", LAB, "--force")
    failing = hand_in(course)
    course.nbgrader("autograde", LAB)
    return course, failing, course.scores(LAB)


@pytest.fixture(scope="module")
def killed_worker(postgres_url, tmp_path_factory) -> tuple[Course, str, str, set[str], int]:  # noqa: F811
    """The class graded on a scheduler and two workers started here, one killed while both were grading:
    (course, gradebook URL, the batch's output, the submissions being graded when the worker was killed, the
    batch's exit status)."""
    db_url = create_database(postgres_url, "killed_worker")
    folder = tmp_path_factory.mktemp("killed-worker")
    course = postgres_course(folder / "course", db_url)
    autograded = course.root / "grading" / "autograded"
    records = autograded / ".gptcourse-batch" / LAB
    with dask_cluster(folder / "dask", 2) as (address, workers):
        grader = subprocess.Popen([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, "--cluster", address,
                                   "--db", db_url], cwd=course.root, text=True, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT)

        def grading_now() -> set[str]:  # started (autograded folder made) and not finished (no record); pathlib's
            # "*" matches the records' own folder, .gptcourse-batch, which nbgrader's glob skips
            started = {p.parent.name for p in autograded.glob(f"*/{LAB}") if not p.parent.name.startswith(".")}
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
    return course, db_url, output, killed_during, grader.returncode


def test_the_class_is_a_mix_that_nbgrader_grades_as_expected(reference):
    course, failing, scores = reference
    assert len(scores) == STUDENTS
    for student, fails in failing.items():
        assert scores[student] == course.expected_scores(LAB, fails), student
    assert len({sum(by_cell.values()) for by_cell in scores.values()}) >= 6  # solved, blank, wrong in many ways


def test_killed_worker_loses_only_its_current_submission(reference, killed_worker):
    _, _, expected = reference
    course, db_url, output, killed_during, returncode = killed_worker
    assert returncode == 0, output[-4000:]
    assert len(killed_during) == 2
    assert "2 Dask workers" in output
    assert f"graded {STUDENTS}, up to date 0, no notebook 0, failed or not graded 0" in output, output
    assert postgres_scores(db_url) == expected
    submissions, students, grades, cells = row_counts(db_url)
    assert submissions == students == STUDENTS and grades == STUDENTS * cells  # each graded exactly once
    records = course.root / "grading" / "autograded" / ".gptcourse-batch" / LAB
    assert sorted(p.stem for p in records.iterdir()) == sorted(expected)


def test_summary_table_lists_every_student_with_its_score(reference, killed_worker):
    course, _, expected = reference
    output, full = killed_worker[2], sum(course.expected_scores(LAB).values())
    for student, by_cell in expected.items():  # the summary table, as on one machine
        line = next(line for line in output.splitlines() if line.startswith(student + " "))
        assert f" {sum(by_cell.values()):g}/{full:g}  graded" in line, line


def test_what_a_submission_holds_besides_code_is_refused_under_both_graders(reference, killed_worker):
    """Each Dask worker admits its submission as plain nbgrader does (the course's pre-convert hook): what a link,
    FIFO or hard link led to is in no autograded file, and the report names each refusal; report lines forged in
    the notebook's metadata are not in the report. (The scores are the tests' above.)"""
    for course in (killed_worker[0], reference[0]):
        assert FORGED_NOTE not in (course.root / "grading" / "reports" / LAB / "forged-report.txt").read_text()
        assert not leaks(course.root / "grading" / "autograded")
        report = (course.root / "grading" / "reports" / LAB / f"{HOSTILE}.txt").read_text()
        for name in ("secret.txt", "shadow.txt", "gradebook.txt", "config.py", "theirs.ipynb", "environ.txt",
                     "zero.txt", "etc"):
            assert f"- not graded: {name} (a symbolic link, to '" in report, (name, report)
        assert "- not graded: pipe.txt (a FIFO, not a file)" in report, report
        assert "- not graded: hard.txt (a hard link to a file outside the submission)" in report, report


# The class report after --cluster grading: the mistakes planted in this class (lab 02's round trip's keys, and the
# attacks' unscaled attention: NO_SCALING under patched checks or edited locked cells) and the one hidden failure
# (kernel-dies dies in the 4-d hidden case).
PLANTED_KEYS = {key: students & set(MISTAKES) for key, students in PLANTED_MISTAKES.items() if students & set(MISTAKES)}
PLANTED_KEYS["attention.unscaled"] = {"patch-torch", "edited-locked-cells"}


def test_class_report_after_cluster_grading_counts_what_was_planted(reference, killed_worker):
    """`gptcourse report` reads the shared PostgreSQL gradebook and the autograded notebooks the Dask workers wrote:
    each planted mistake with its students, every score the gradebook's (no cell differs from the verdicts), and
    the same numbers as the one-machine report of the class graded by plain nbgrader (SQLite, the course's
    default gradebook)."""
    from gptcourse.grading.classroom import class_report
    from gptcourse.grading.classroom.gradebook_verdicts import course_db_url

    course, db_url, *_ = killed_worker
    start = time.perf_counter()
    cluster = class_report.build(course.root, LAB, db_url=db_url)
    one_machine = class_report.build(reference[0].root, LAB, db_url=course_db_url(reference[0].root))
    seconds = time.perf_counter() - start
    assert {m.key: set(m.students) for m in cluster.mistakes()} == PLANTED_KEYS
    assert {row.piece: row.visible_not_hidden for row in cluster.pieces()} == {
        "causal_mask": (), "attention": ("kernel-dies",), "AttentionHead": ()}
    totals = {student: sum(by_cell.values()) for student, by_cell in reference[2].items()}
    assert {s.student: s.score for s in cluster.graded} == {s: t for s, t in totals.items() if s in cluster.names}
    assert cluster.gradebook.differences == () and cluster.gradebook.only_notebooks == ()
    assert cluster.gradebook.students == STUDENTS
    for numbers in ("mistakes", "pieces", "histogram"):
        assert getattr(cluster, numbers)() == getattr(one_machine, numbers)(), numbers
    # kernel-dies's kernel exits right after its hidden_single payload, which the kernel may or may not have sent
    # (ipykernel sends from a thread that os._exit stops): passed or not run, its cell fails either way
    def without_kernel_dies(report: class_report.ClassReport) -> class_report.ClassReport:
        return dataclasses.replace(report, submissions=[s for s in report.submissions if s.student != "kernel-dies"])

    for numbers in ("cases", "stopped"):
        assert getattr(without_kernel_dies(cluster), numbers)() == getattr(without_kernel_dies(one_machine), numbers)()
    assert {s.student: s.score for s in cluster.graded} == {s.student: s.score for s in one_machine.graded}
    assert one_machine.gradebook.url.endswith("grading/gradebook.db")
    print(f"two class reports with their gradebooks in {seconds:.2f} s")


def test_each_pieces_verdict_is_its_solution_cells_comment(killed_worker):
    """nbgrader holds comments for solution cells only (`verdict_comments`): each piece's verdict is there, in the
    cluster's gradebook, after nbgrader's own "No response." for an answer left as released."""
    from nbgrader.api import Gradebook

    with Gradebook(killed_worker[1]) as gb:
        def comment(piece: str, student: str) -> str:
            return gb.find_comment(piece, LAB, LAB, student).auto_comment or ""

        assert comment("attention", "softmax-wrong-axis") == (  # T = 1: a softmax over one query is over one key
            "Grader's verdict on `attention`: 1 of 4 cases passed. Failed: `02.attention.visible`, "
            "`02.attention.causal`, `02.attention.hidden_heads`. Mistakes named: `attention.softmax_dim`.")
        assert comment("causal_mask", "softmax-wrong-axis") == "Grader's verdict on `causal_mask`: all 3 cases passed."
        assert "Mistakes named: `02.no_value_projection`." in comment("AttentionHead", "no-value-projection")
        assert comment("AttentionHead", PARTIAL).startswith("No response.\n\nGrader's verdict on `AttentionHead`: 0 of")


def test_local_cluster_resumes_and_grades_only_a_resubmission(reference, killed_worker):
    """Runs after the killed worker's tests: it grades one submission of that class again."""
    _, _, expected = reference
    course, db_url, *_ = killed_worker
    notebooks = sorted((course.root / "grading" / "autograded").glob(f"*/{LAB}/{LAB}.ipynb"))
    before = {p: p.stat().st_mtime_ns for p in notebooks}
    assert len(before) == STUDENTS
    (course.root / "grading" / "submitted" / RESUBMITTED / LAB / "notes.txt").write_text("handed in again")
    output = autograde(course, "--cluster", "local:2", "--db", db_url)
    assert "2 Dask workers" in output
    assert f"graded 1, up to date {STUDENTS - 1}, no notebook 0, failed or not graded 0" in output, output
    changed = {p.parent.parent.name for p in notebooks if p.stat().st_mtime_ns != before[p]}
    assert changed == {RESUBMITTED}
    assert postgres_scores(db_url) == expected
    assert row_counts(db_url)[:2] == (STUDENTS, STUDENTS)


def test_one_machine_options_are_refused_with_cluster(tmp_path):
    from gptcourse.grading.classroom.batch import require_cluster_options

    with pytest.raises(SystemExit, match=r"^--no-zygote applies to this machine's .*: drop --no-zygote$"):
        require_cluster_options(None, use_zygote=False)
    require_cluster_options(None, use_zygote=True)
    course = Course(tmp_path / "course", sqlite_gradebook=False)
    output = autograde(course, "--cluster", "local:2", "--workers", "3", ok=False)
    assert "--workers 3 sets this machine's graders, and --cluster grades on the Dask cluster's workers" in output
    assert "(--cluster local:N, or start N `dask worker ADDRESS --nthreads 1`), without --workers" in output


# The start-up checks: each mismatch is an error naming the worker and what to do, before anyone is graded.


def test_worker_checks_name_the_course_folder_sandbox_and_gradebook(tmp_path):
    from gptcourse.grading.classroom.cluster import SHARED_COURSE, file_digest, shared_folder_probe, worker_problems

    course = tmp_path / "course"
    course.mkdir()
    config = course / "nbgrader_config.py"
    config.write_text("c = get_config()  # noqa: F821\nc.Sandbox.bwrap = '/nonexistent/bwrap'\n")
    digest, unreachable = file_digest(config), "postgresql://postgres@127.0.0.1:1/gradebook"
    assert SHARED_COURSE.startswith("expected the grading machine's course folder at the same path on every worker")

    with shared_folder_probe(str(course)) as probe:
        elsewhere = worker_problems(str(tmp_path / "not-here"), digest, unreachable, probe)["problems"]
        assert elsewhere[0] == f"the course folder: {tmp_path / 'not-here'} does not exist here; {SHARED_COURSE}"
        assert len(elsewhere) == 2
        assert elsewhere[1].startswith(f"the gradebook: {unreachable} is not reachable (OperationalError")

        (tmp_path / "empty").mkdir()
        empty = worker_problems(str(tmp_path / "empty"), digest, unreachable, probe)["problems"]
        assert empty[0] == f"the course folder: {tmp_path / 'empty'} has no nbgrader_config.py here; {SHARED_COURSE}"
        differs = worker_problems(str(course), "0" * 64, unreachable, probe)["problems"]
        assert differs[0] == f"the course folder: {course} has another nbgrader_config.py here; {SHARED_COURSE}"
        copy = worker_problems(str(course), digest, unreachable, probe + "-elsewhere")["problems"]
        assert copy[0] == (f"the course folder: {course} is a copy here, not the shared folder: {probe}-elsewhere, "
                           f"just written there, is missing; {SHARED_COURSE}")

        facts = worker_problems(str(course), digest, unreachable, probe)
        assert facts["problems"][0].startswith("the sandbox: ") and "/nonexistent/bwrap" in facts["problems"][0]
        assert len(facts["problems"]) == 2 and facts["cores"] >= 1
    assert sorted(p.name for p in course.iterdir()) == ["nbgrader_config.py"]  # the probe is gone


def test_cluster_needs_postgres(tmp_path):
    course = Course(tmp_path / "course")  # a SQLite gradebook
    output = autograde(course, "--cluster", "local:2", ok=False)
    assert "--cluster needs a gradebook every worker can write to at once: PostgreSQL" in output


def test_workers_without_bubblewrap_or_gradebook_stop_the_batch(tmp_path):
    course = Course(tmp_path / "course", sqlite_gradebook=False)
    course.submit("student000", LAB, course.solved(LAB))
    no_bwrap = tmp_path / "bin"  # a PATH with python only
    no_bwrap.mkdir()
    os.symlink(sys.executable, no_bwrap / "python")
    unreachable = "postgresql://postgres@127.0.0.1:1/gradebook"
    with dask_cluster(tmp_path / "dask", 1, worker_env={"PATH": str(no_bwrap)}) as (address, _):
        output = autograde(course, "--cluster", address, "--db", unreachable, ok=False)
    assert "autograde stopped before grading anyone: the cluster's workers are not ready" in output
    assert "the sandbox: " in output and "no `bwrap` executable on PATH" in output, output
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
