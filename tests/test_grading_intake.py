"""What a student hands in besides code is hostile too (gptcourse.grading.steps.intake, archives, csv_export).

In-process: what `inspect` refuses, how `copy_submission` copies, the id allowlist, the bounded extractor, the
grades CSV. Then one course of lab 02 (grading/secret.txt and all) through the real commands: `nbgrader collect`
from an exchange whose inbound a student planted links in, `gptcourse autograde` and plain `nbgrader autograde`
over submissions holding links to the course's secrets, a FIFO, a device, a hard link, a notebook that is a link,
ids that are formulas or markup; `generate_feedback`, `release_feedback`, `export`, `zip_collect`. After each,
nothing of any target is under grading/autograded, grading/feedback or the exchange's feedback, and every honest
notebook is graded.
"""

from __future__ import annotations

import csv
import os
import pwd
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from nbgrader_course import Course

from gptcourse.grading.classroom.archives import BoundedExtractor
from gptcourse.grading.classroom.csv_export import SafeCsvExportPlugin
from gptcourse.grading.steps import intake

LAB = "02_causal_attention"
POINTS = 15  # lab 02's total
SECRET = "the-instructors-course-secret"
ROOT_ONLY = "a root-only line"
ENV_MARK = "GPTCOURSE_INTAKE_TEST_MARK"
MARK = "the-graders-environment-value"


# ---------------------------------------------------------------------------------------------------------------
# In-process


def plant(folder: Path, targets: dict[str, str]) -> None:
    """Symbolic links in `folder`: {name: target}."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, target in targets.items():
        os.symlink(target, folder / name)


def test_inspect_admits_regular_files_and_refuses_everything_else(tmp_path):
    sub = tmp_path / "sub"
    (sub / "data").mkdir(parents=True)
    (sub / "lab.ipynb").write_text("{}")
    (sub / "data" / "table.csv").write_text("1,2")
    (tmp_path / "outside.txt").write_text("x")
    os.link(tmp_path / "outside.txt", sub / "hard.txt")
    (sub / "twice.txt").write_text("y")
    os.link(sub / "twice.txt", sub / "data" / "twice-again.txt")  # both names inside: admitted
    plant(sub, {"link.txt": "../outside.txt", "zero.txt": "/dev/zero", "etc": "/etc"})
    os.mkfifo(sub / "pipe.txt")
    for name in (".hidden.txt", "a..b.txt", "bell\x07.txt", "tool.exe"):
        (sub / name).write_text("z")
    found = intake.inspect(sub)
    assert sorted(a.path for a in found.accepted) == ["data/table.csv", "data/twice-again.txt", "lab.ipynb",
                                                      "twice.txt"]
    reasons = {r.path: r.reason for r in found.refused}
    assert reasons.keys() == {"hard.txt", "link.txt", "zero.txt", "etc", "pipe.txt", ".hidden.txt", "a..b.txt",
                              "bell\x07.txt", "tool.exe"}
    assert reasons["link.txt"].startswith("a symbolic link, to '../outside.txt'")
    assert reasons["hard.txt"] == "a hard link to a file outside the submission"
    assert reasons["pipe.txt"] == "a FIFO, not a file"
    assert [r.line() for r in found.refused if r.path.startswith("bell")] == [
        "not graded: bell\\x07.txt (its name holds control characters)"]
    with pytest.raises(OSError):  # the submission folder itself may not be a link
        intake.inspect(_linked(tmp_path / "sub-link", sub))


def _linked(link: Path, target: Path) -> Path:
    os.symlink(target, link)
    return link


def test_copy_follows_no_link_and_drops_mode_bits(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (sub / "lab.ipynb").write_text("{}")
    (sub / "run.py").write_text("print(1)")
    os.chmod(sub / "run.py", 0o4755)
    plant(sub, {"zero.txt": "/dev/zero", "secret.txt": str(tmp_path / "secret.txt")})
    (tmp_path / "secret.txt").write_text(SECRET)
    lines = intake.copy_submission(sub, tmp_path / "out")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["lab.ipynb", "run.py"]
    assert stat.S_IMODE(os.stat(tmp_path / "out" / "run.py").st_mode) == 0o644
    assert len(lines) == 2 and all(line.startswith("not graded: ") for line in lines)


@pytest.mark.parametrize("student,allowed", [
    ("ada", True), ("a-1", True), ("7", True), ("x" * 64, True),
    ("x" * 65, False), ("Ada", False), ("..", False), ("-ada", False), ("ada_1", False), ("=1+1", False),
    ("@SUM(3)", False), ("<img src=x onerror=alert(1)>", False), ("a\nb", False), ("a\rb", False),
    ("\x1b[31mred", False), ("", False), ("ada.", False)])
def test_student_ids_are_an_allowlist(student, allowed):
    assert (intake.student_id_problem(student) is None) == allowed


def test_hub_accounts_use_the_same_student_ids(tmp_path, monkeypatch):
    from test_hub_config import settings

    from gptcourse import hub

    monkeypatch.setattr(hub, "require_root", lambda: None)
    def passed(python: str) -> None:  # the next step of setup: the names were accepted
        raise AssertionError("the names passed")

    monkeypatch.setattr(hub, "check_environment", passed)
    with pytest.raises(hub.HubSetupError, match="not a student id: \\['ada_b'\\]"):
        hub.setup(settings(tmp_path, students=["ada", "ada_b"]), "psql", "/run/postgresql", 5432, "gradebook")


FORGED = ["=1+1", "@SUM(3)", "+1", "-1", "\tx", "ok\r\nforged,LAB,,,,,,999,0,999,15", "nl\nforged,999"]


def _exported(plugin: type, tmp_path: Path) -> list[list[str]]:
    from nbgrader.api import Gradebook
    from nbgrader_course import empty_gradebook

    (tmp_path / "gb.db").write_bytes(empty_gradebook())
    with Gradebook(f"sqlite:///{tmp_path / 'gb.db'}") as gb:
        gb.add_assignment("lab")
        for student in FORGED:
            gb.add_student(student)
        plugin(to=str(tmp_path / "grades.csv")).export(gb)
    with open(tmp_path / "grades.csv", newline="", encoding="utf-8") as grades:
        return list(csv.reader(grades))


def test_grades_csv_has_one_row_per_student_and_no_formulas(tmp_path):
    rows = _exported(SafeCsvExportPlugin, tmp_path)
    assert len(rows) == 1 + len(FORGED)
    assert sorted(row[3] for row in rows[1:]) == sorted("'" + s if s[0] in "=+-@\t" else s for s in FORGED)
    assert not [cell for row in rows for cell in row if cell[:1] in ("=", "+", "-", "@", "\t", "\r", "\n")]


def test_similarity_reads_no_notebook_through_a_link(tmp_path):
    from gptcourse.grading.classroom.similarity import read_notebook, submitted_notebook

    (tmp_path / "real.ipynb").write_text('{"cells": []}')
    plant(tmp_path / "sub", {f"{LAB}.ipynb": str(tmp_path / "real.ipynb")})
    assert submitted_notebook(tmp_path / "sub", LAB) is None
    with pytest.raises(ValueError, match="not a regular file"):
        read_notebook(tmp_path / "sub" / f"{LAB}.ipynb")


def test_the_committed_hook_admits_a_submission_before_nbgrader_copies_it(tmp_path, monkeypatch):
    """nbgrader_config.py's pre-convert hook, which nbgrader's Autograde runs under every grader (plain
    `nbgrader autograde`, `gptcourse autograde`'s workers and a cluster's, all through `grade_one.grade_submission`):
    refused entries leave the folder, and a notebook list of an id that is not allowed is emptied."""
    from nbgrader.converters import Autograde

    from gptcourse.grading.classroom.grade_one import nbgrader_app

    course = Course(tmp_path / "course")
    monkeypatch.chdir(course.root)
    app = nbgrader_app(LAB, [])  # as grade_submission makes its converter, on this machine or a Dask worker
    hook = Autograde(coursedir=app.coursedir, parent=app).pre_convert_hook
    submitted = course.root / "grading" / "submitted"
    (submitted / "linked").mkdir(parents=True)
    os.symlink(course.root / "solutions" / LAB, submitted / "linked" / LAB)
    for student in ("ada", "Not_An_Id", "linked"):
        folder = submitted / student / LAB
        if student != "linked":
            folder.mkdir(parents=True)
            (folder / f"{LAB}.ipynb").write_text("{}")
            os.symlink(course.root / "grading" / "gradebook.db", folder / "gradebook.txt")
        notebooks = [str(folder / f"{LAB}.ipynb")]
        hook(assignment=LAB, student="*", notebooks=notebooks)
        if student == "ada":
            assert os.listdir(folder) == [f"{LAB}.ipynb"] and notebooks == [str(folder / f"{LAB}.ipynb")]
            assert (course.root / "grading" / "refused" / LAB / "ada" / "gradebook.txt").is_symlink()
        else:
            assert notebooks == [] and not os.path.lexists(folder)
    assert (course.root / "solutions" / LAB / f"{LAB}.ipynb").is_file()  # the link moved, not its target


def test_gptcourse_autograde_refuses_an_id_before_any_runner_sees_it(tmp_path, monkeypatch):
    """`gptcourse autograde`, one machine or --cluster, share `grade_submissions`."""
    from gptcourse.grading.classroom import batch, grade_one

    course = Course(tmp_path / "course")
    for student in ("ada", "Not_An_Id"):
        folder = course.root / "grading" / "submitted" / student / LAB
        folder.mkdir(parents=True)
        (folder / f"{LAB}.ipynb").write_text("{}")
    (course.root / "grading" / "submitted" / "linked").mkdir()
    os.symlink(course.root / "solutions" / LAB, course.root / "grading" / "submitted" / "linked" / LAB)
    seen = []

    class Runner:
        def run(self, students, log_path):
            seen.extend(students)
            return iter(())

        def describe(self):
            return "a test runner"

        def close(self):
            pass

    monkeypatch.setattr(batch, "require_assignment", lambda db_url, lab: None)
    monkeypatch.chdir(course.root)
    app = grade_one.nbgrader_app(LAB, [])
    outcomes = batch.grade_submissions(app, LAB, force=True, progress=False, runner=Runner())
    assert seen == ["ada"]
    assert outcomes["Not_An_Id"].status == "refused" and "is not allowed" in outcomes["Not_An_Id"].messages[0]
    assert outcomes["linked"].status == "refused" and "is a symbolic link" in outcomes["linked"].messages[0]


def test_a_notebook_refused_on_one_run_is_reported_refused_on_the_next(tmp_path, monkeypatch):
    """A notebook that is a link is moved out on the run that grades it 0; on every later run (plain nbgrader's
    hook reports folders without a notebook, `gptcourse autograde` resumes) its report still gives the refusal,
    not "no notebook was submitted"."""
    from nbgrader.converters import Autograde

    from gptcourse.grading.classroom import batch, grade_one

    course = Course(tmp_path / "course")
    monkeypatch.chdir(course.root)
    app = grade_one.nbgrader_app(LAB, [])
    hook = Autograde(coursedir=app.coursedir, parent=app).pre_convert_hook
    submitted = course.root / "grading" / "submitted"
    _notebook_link(course, submitted / "linked-notebook" / LAB, course.root / "solutions" / LAB / f"{LAB}.ipynb")
    (submitted / "notes-only" / LAB).mkdir(parents=True)
    (submitted / "notes-only" / LAB / "notes.txt").write_text("I could not finish")
    (submitted / "ada" / LAB).mkdir(parents=True)
    (submitted / "ada" / LAB / f"{LAB}.ipynb").write_text("{}")
    (submitted / "Not_An_Id" / LAB).mkdir(parents=True)  # no notebook, and an id no path is made from
    hook(assignment=LAB, student="*", notebooks=[str(submitted / "linked-notebook" / LAB / f"{LAB}.ipynb")])
    refusal = f"not graded: {LAB}.ipynb (a symbolic link, to '{course.root}/solutions/{LAB}/{LAB}.ipynb'"
    reports = course.root / "grading" / "reports" / LAB

    hook(assignment=LAB, student="*", notebooks=[str(submitted / "ada" / LAB / f"{LAB}.ipynb")])  # a later run
    lines = (reports / "linked-notebook.txt").read_text().splitlines()
    assert lines[0] == f"linked-notebook {LAB}: no submission" and lines[1].startswith(f"- {refusal}"), lines
    assert lines[2:] == ["- no notebook is left to grade: what was submitted was refused (the lines above); it "
                         "scores 0 points"], lines
    assert "- no notebook was submitted (the folder holds notes.txt)" in (reports / "notes-only.txt").read_text()
    assert sorted(path.name for path in reports.iterdir()) == ["linked-notebook.txt", "notes-only.txt"]

    (reports / "linked-notebook.txt").unlink()
    resumed = next(s for s in grade_one.submissions(app.coursedir, LAB) if s.student == "linked-notebook")
    outcome = batch.no_notebook_outcome(resumed, LAB, app)  # what `gptcourse autograde` does with it on a later run
    assert outcome.status == "no notebook" and outcome.messages[0].startswith("no notebook is left to grade")
    assert (reports / "linked-notebook.txt").read_text().splitlines()[1].startswith(f"- {refusal}")


# ---------------------------------------------------------------------------------------------------------------
# Archives: nbgrader zip_collect's extraction, bounded


def _zip(path: Path, members: dict[str, bytes], modes: dict[str, int] | None = None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = (modes or {}).get(name, 0o100644) << 16
            archive.writestr(info, data)
    return path


def downloaded(folder: Path, notebook: bytes) -> Path:
    """An LMS download: one good archive and one per attack."""
    folder.mkdir(parents=True)
    _zip(folder / "good.zip", {f"ada_{LAB}.ipynb": notebook, f"grace_{LAB}.ipynb": notebook})
    _zip(folder / "bomb.zip", {f"bomb_{LAB}.ipynb": b"0" * 5_000_000})
    _zip(folder / "setuid.zip", {f"suid_{LAB}.ipynb": notebook, "run.py": b"print(1)"}, {"run.py": 0o104755})
    _zip(folder / "traversal.zip", {f"../trav_{LAB}.ipynb": notebook})
    _zip(folder / "absolute.zip", {f"/tmp/abs_{LAB}.ipynb": notebook})
    _zip(folder / "link.zip", {f"link_{LAB}.ipynb": b"/etc/passwd"}, {f"link_{LAB}.ipynb": 0o120777})
    _zip(folder / "dots.zip", {f".._{LAB}.ipynb": notebook})
    (folder / f".._{LAB}.ipynb").write_bytes(notebook)  # files downloaded as they are: ids ".." and "EVE"
    (folder / f"EVE_{LAB}.ipynb").write_bytes(notebook)
    return folder


def test_extractor_bounds_each_archive_and_extracts_the_rest(tmp_path):
    out = tmp_path / "extracted"
    out.mkdir()
    BoundedExtractor(member_mb=20).extract(str(downloaded(tmp_path / "archive", b"{}")), str(out))
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    # good.zip whole; setuid.zip whole, without its setuid bit; the files as they are (the collector refuses ids)
    assert files == [f".._{LAB}.ipynb", f"EVE_{LAB}.ipynb", f"good/ada_{LAB}.ipynb", f"good/grace_{LAB}.ipynb",
                     "setuid/run.py", f"setuid/suid_{LAB}.ipynb"]
    assert stat.S_IMODE(os.stat(out / "setuid" / "run.py").st_mode) == 0o644


def test_extractor_bounds_members_and_time(tmp_path):
    good = _zip(tmp_path / "good.zip", {f"ada_{LAB}.ipynb": b"{}" * 10, f"grace_{LAB}.ipynb": b"{}"})
    assert BoundedExtractor().extract_archive(good, tmp_path / "all")
    assert not BoundedExtractor(max_members=1).extract_archive(good, tmp_path / "count")
    assert not BoundedExtractor(seconds=0).extract_archive(good, tmp_path / "time")
    assert not (tmp_path / "count").exists() and not (tmp_path / "time").exists()  # nothing of a refused one kept


# ---------------------------------------------------------------------------------------------------------------
# One course, every grader


def _targets(course: Course, root_only: Path) -> dict[str, str]:
    """What a student's links point at: the course's secrets, a root-only file, another student's notebook, the
    grader's environment, a device."""
    root = course.root
    return {"secret.txt": str(root / "grading" / "secret.txt"), "shadow.txt": str(root_only),
            "gradebook.txt": str(root / "grading" / "gradebook.db"), "config.py": str(root / "nbgrader_config.py"),
            "theirs.ipynb": str(root / "grading" / "submitted" / "victim" / LAB / f"{LAB}.ipynb"),
            "environ.txt": "/proc/self/environ", "zero.txt": "/dev/zero", "etc": "/etc"}


def hostile_folder(course: Course, folder: Path, root_only: Path, outside: Path) -> None:
    """An honest notebook and, beside it, every link, a FIFO and a hard link to a file outside."""
    import nbformat

    folder.mkdir(parents=True)
    nbformat.write(course.solved(LAB), folder / f"{LAB}.ipynb")
    plant(folder, _targets(course, root_only))
    os.mkfifo(folder / "pipe.txt")
    os.link(outside, folder / "hard.txt")
    (folder / "notes.txt").write_text("an honest file")


def _notebook_link(course: Course, folder: Path, target: Path) -> None:
    folder.mkdir(parents=True)
    os.symlink(target, folder / f"{LAB}.ipynb")


def leaks(*folders: Path) -> list[str]:
    """Files under `folders` that hold anything of a target, or are not a plain file."""
    found = []
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_symlink() or not (path.is_file() or path.is_dir()):
                found.append(f"{path}: not a plain file")
            elif path.is_file():
                data = path.read_bytes()
                for what in (SECRET, ROOT_ONLY, MARK, "c.CourseDirectory.root", "SQLite format", "root:x:0:0"):
                    if what.encode() in data:
                        found.append(f"{path}: {what}")
                if path.name in ("secret.txt", "shadow.txt", "gradebook.txt", "config.py", "theirs.ipynb",
                                 "environ.txt", "zero.txt", "pipe.txt", "hard.txt"):
                    found.append(f"{path}: a refused name")
    return found


OTHER_ACCOUNT = next(account.pw_name for account in pwd.getpwall()  # an account these tests do not run as
                     if account.pw_uid != os.getuid() and intake.STUDENT_ID.fullmatch(account.pw_name))


def _inbound(exchange: Path, name: str) -> Path:
    folder = exchange / "gptcourse" / "inbound" / name
    folder.parent.mkdir(parents=True, exist_ok=True)
    return folder


def _gptcourse(course: Course, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "gptcourse.cli", *args], cwd=course.root, text=True, env=env,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """The course after collect, gptcourse autograde, plain nbgrader autograde, feedback and export."""
    import nbformat

    tmp = tmp_path_factory.mktemp("intake")
    course = Course(tmp / "course")
    (course.root / "grading" / "secret.txt").write_text(SECRET + "\n")
    exchange = tmp / "exchange"
    with open(course.root / "nbgrader_config.py", "a", encoding="utf-8") as config:
        config.write(f"\nc.Exchange.root = {str(exchange)!r}\nc.Execute.timeout = 20\n")
    root_only = tmp / "root-only.txt"
    root_only.write_text(ROOT_ONLY)
    os.chmod(root_only, 0o600)
    outside = tmp / "outside.txt"
    outside.write_text(SECRET)
    env = {**os.environ, ENV_MARK: MARK}
    course.nbgrader("generate_assignment", LAB, "--force", env=env)
    submitted = course.root / "grading" / "submitted"
    course.submit("victim", LAB, course.solved(LAB))

    # nbgrader collect, from an inbound the students wrote
    stamp = "2026-01-01 10:00:00.000000 UTC"
    hostile_folder(course, _inbound(exchange, f"exchange+{LAB}+{stamp}"), root_only, outside)
    for bad in ("=1+1", "<img src=x onerror=alert(1)>", "nl\nx"):
        folder = _inbound(exchange, f"{bad}+{LAB}+{stamp}")
        folder.mkdir()
        nbformat.write(course.solved(LAB), folder / f"{LAB}.ipynb")
    os.symlink(course.root / "solutions" / LAB, _inbound(exchange, f"linked+{LAB}+{stamp}"))
    _inbound(exchange, f"garbled+{LAB}+not-a-time").mkdir()
    # an honest notebook beside a timestamp.txt that is markup and a formula (nbgrader parses it at autograde)
    stamped = _inbound(exchange, f"stamped+{LAB}+{stamp}")
    stamped.mkdir()
    nbformat.write(course.solved(LAB), stamped / f"{LAB}.ipynb")
    (stamped / "timestamp.txt").write_text("<img src=x onerror=alert(2)>\n=1+1")
    # a later folder under the name of an account of this machine, not owned by it (on a Hub: another student's)
    claimed = _inbound(exchange, f"{OTHER_ACCOUNT}+{LAB}+2026-01-02 10:00:00.000000 UTC")
    claimed.mkdir()
    nbformat.write(course.notebook("labs", LAB), claimed / f"{LAB}.ipynb")
    collected = course.nbgrader("collect", LAB, "--update", env=env)

    # gptcourse autograde (one machine), over submissions placed by hand
    hostile_folder(course, submitted / "batch-links" / LAB, root_only, outside)
    _notebook_link(course, submitted / "batch-solution-link" / LAB, course.root / "solutions" / LAB / f"{LAB}.ipynb")
    (submitted / "Batch_Bad_Id" / LAB).mkdir(parents=True)
    nbformat.write(course.solved(LAB), submitted / "Batch_Bad_Id" / LAB / f"{LAB}.ipynb")
    batch = _gptcourse(course, "autograde", LAB, "--workers", "2", env=env)

    # plain nbgrader autograde: grades only what has no autograded folder yet
    hostile_folder(course, submitted / "plain-links" / LAB, root_only, outside)
    _notebook_link(course, submitted / "plain-solution-link" / LAB, course.root / "solutions" / LAB / f"{LAB}.ipynb")
    _notebook_link(course, submitted / "plain-other-link" / LAB, submitted / "victim" / LAB / f"{LAB}.ipynb")
    (submitted / "=2+2" / LAB).mkdir(parents=True)
    nbformat.write(course.solved(LAB), submitted / "=2+2" / LAB / f"{LAB}.ipynb")
    plain = course.nbgrader("autograde", LAB, ok=False, env=env)

    course.nbgrader("generate_feedback", LAB, env=env)
    course.nbgrader("db", "student", "add", "roster", "--last-name", "=2+2", env=env)
    released = course.nbgrader("release_feedback", LAB, ok=False, env=env)
    course.nbgrader("export", env=env)
    return course, exchange, {"collect": collected.stdout, "batch": batch.stdout, "plain": plain.stdout,
                              "release": released.stdout}


@pytest.mark.slow
def test_every_honest_notebook_is_graded_and_a_linked_one_scores_zero(graded):
    course, _, _ = graded
    scores = {student: sum(by_cell.values()) for student, by_cell in course.scores(LAB).items()
              if intake.student_id_problem(student) is None}
    honest = ("victim", "exchange", "stamped", "batch-links", "plain-links")
    assert {s: scores.get(s) for s in honest} == dict.fromkeys(honest, POINTS)
    linked = ("batch-solution-link", "plain-solution-link", "plain-other-link")
    assert {s: scores.get(s) for s in linked} == dict.fromkeys(linked, 0)


@pytest.mark.slow
def test_nothing_of_a_target_reaches_autograded_feedback_or_the_exchange(graded):
    course, exchange, _ = graded
    assert not leaks(course.root / "grading" / "autograded", course.root / "grading" / "feedback",
                      exchange / "gptcourse" / "feedback")
    assert (course.root / "grading" / "feedback" / "plain-links" / LAB / "notes.txt").read_text() == \
        "an honest file"


@pytest.mark.slow
def test_each_refusal_is_a_report_line(graded):
    course, _, _ = graded
    for student in ("exchange", "batch-links", "plain-links"):
        report = (course.root / "grading" / "reports" / LAB / f"{student}.txt").read_text()
        for name in ("secret.txt", "shadow.txt", "gradebook.txt", "config.py", "theirs.ipynb", "environ.txt",
                     "zero.txt", "etc"):
            assert f"- not graded: {name} (a symbolic link, to '" in report, (student, name, report)
        assert "- not graded: pipe.txt (a FIFO, not a file)" in report
        assert "- not graded: hard.txt (a hard link to a file outside the submission)" in report
    report = (course.root / "grading" / "reports" / LAB / "stamped.txt").read_text()
    assert "- not graded: timestamp.txt (not a time as nbgrader submit writes it" in report
    for student in ("plain-solution-link", "batch-solution-link"):  # the batch one's reported again by plain's run
        report = (course.root / "grading" / "reports" / LAB / f"{student}.txt").read_text()
        assert f"- not graded: {LAB}.ipynb (a symbolic link, to '{course.root}/solutions/{LAB}/{LAB}.ipynb'" in \
            report, (student, report)


@pytest.mark.slow
def test_ids_that_are_not_allowed_are_refused_by_name_and_the_rest_collected(graded):
    course, _, out = graded
    submitted = sorted(p.name for p in (course.root / "grading" / "submitted").iterdir())
    assert "exchange" in submitted
    assert not (course.root / "grading" / "submitted" / "linked" / LAB).exists()  # its record says why
    assert not [name for name in submitted if intake.student_id_problem(name)
                and (course.root / "grading" / "submitted" / name / LAB).exists()]
    errors = [line for line in out["collect"].splitlines() if "ERROR] not collected: " in line]
    for shown in ("the student id '<img src=x onerror=alert(1)>' is not allowed", "the student id 'nl\\nx' is not "
                  "allowed", f"not STUDENT+LAB+TIMESTAMP (nbgrader submit's), in the exchange's =1+1+{LAB}+",
                  f"not STUDENT+LAB+TIMESTAMP (nbgrader submit's), in the exchange's garbled+{LAB}+not-a-time"):
        assert [line for line in errors if shown in line], (shown, errors)
    claimed = f"it claims to be {OTHER_ACCOUNT}'s but is owned by {pwd.getpwuid(os.getuid()).pw_name}"
    assert [line for line in errors if claimed in line], (claimed, errors)
    assert not (course.root / "grading" / "submitted" / OTHER_ACCOUNT).exists()
    assert "is not a folder that can be read without following a link" in "".join(
        intake.read_record(course.root, LAB, "linked"))
    assert "Batch_Bad_Id" in out["batch"] and "refused" in out["batch"]
    # plain nbgrader autograde: the id's folder moved out, named in an error line, nothing of it graded and no
    # gradebook row of it (under either grader), the others after it graded
    assert not (course.root / "grading" / "submitted" / "=2+2").joinpath(LAB).exists()
    assert not (course.root / "grading" / "autograded" / "=2+2" / LAB / f"{LAB}.ipynb").exists()
    assert [line for line in out["plain"].splitlines() if "ERROR] not graded: the student id '=2+2' is not allowed"
            in line and "was not graded (moved to" in line], out["plain"]
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course.root / 'grading' / 'gradebook.db'}") as gb:
        students = {student.id for student in gb.students}
    assert "exchange" in students and "plain-links" in students
    assert not {"=2+2", "Batch_Bad_Id"} & students, students


@pytest.mark.slow
def test_grades_csv_guards_a_name_on_the_roster(graded):
    """No id that is not allowed reaches the gradebook, but the roster's names are the instructor's import."""
    course, _, _ = graded
    with open(course.root / "grading" / "grades.csv", newline="", encoding="utf-8") as grades:
        rows = list(csv.reader(grades))
    last_names = {row[3]: row[4] for row in rows[1:]}
    assert last_names.get("roster") == "'=2+2", last_names
    assert "exchange" in last_names


@pytest.mark.slow
def test_zip_collect_is_bounded_and_refuses_ids_before_making_paths(graded, tmp_path):
    course, _, _ = graded
    archive = course.root / "grading" / "downloaded" / LAB / "archive"
    import nbformat

    downloaded(archive, nbformat.writes(course.solved(LAB)).encode())
    run = course.nbgrader("zip_collect", LAB, "--force")
    assert "bomb.zip" in run.stdout and "expands" in run.stdout
    for name in ("traversal.zip", "absolute.zip", "link.zip"):
        assert f"the archive {course.root}/grading/downloaded/{LAB}/archive/{name}" in run.stdout, name
    assert "the student id '..' is not allowed" in run.stdout and "the student id 'EVE' is not allowed" in run.stdout
    submitted = course.root / "grading" / "submitted"
    assert (submitted / "ada" / LAB / f"{LAB}.ipynb").is_file() and (submitted / "suid" / LAB).is_dir()
    assert not (course.root / "grading" / LAB).exists() and not (submitted / "bomb").exists()
    for student in ("ada", "grace", "suid"):
        for path in (submitted / student / LAB).iterdir():
            assert stat.S_IMODE(path.stat().st_mode) & 0o7111 == 0, path



def test_a_timestamp_that_is_not_a_time_is_refused(tmp_path):
    (tmp_path / "lab.ipynb").write_text("{}")
    for text in ("<img src=x onerror=alert(2)>\n=1+1", "2026-13-45 99:99:99 UTC", "x" * 500):
        (tmp_path / "timestamp.txt").write_text(text)
        assert [(r.path, r.reason.split(" (")[0]) for r in intake.inspect(tmp_path).refused] == [
            ("timestamp.txt", "not a time as nbgrader submit writes it")], text
    for text in ("2026-12-03 19:41:00.123456 UTC\n", "2026-12-03 19:41:00 +0100"):
        (tmp_path / "timestamp.txt").write_text(text)
        assert not intake.inspect(tmp_path).refused, text


def test_a_folder_is_its_students_only_if_their_account_owns_it(tmp_path):
    me = pwd.getpwuid(os.getuid()).pw_name
    assert intake.owner_problem(tmp_path, me) is None
    assert intake.owner_problem(tmp_path, "no-such-account-here") is None  # no accounts: nbgrader's warning only
    assert intake.owner_problem(tmp_path, OTHER_ACCOUNT) == f"it claims to be {OTHER_ACCOUNT}'s but is owned by {me}"
