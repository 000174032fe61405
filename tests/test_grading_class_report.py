"""`gptcourse report LAB` on synthetic classes: the verdict records a judge writes, each planted mistake counted,
the passed-visible-failed-hidden students, the histogram's bins, the compare, pseudonyms, escaping and the CSV.
The same report on a class that nbgrader graded: tests/test_labs_02.py (`test_class_report_counts_what_was_planted`);
in Chromium: tests/browser/test_class_report_in_browser.py."""

from __future__ import annotations

import csv
import json
import re
import stat

import pytest
from synthetic_class import CELLS, HOSTILE, LAB, PLANTED, ROOT, STOPPED, course_with, score

from gptcourse import cli
from gptcourse.grading.classroom import class_report


@pytest.fixture
def root(tmp_path):
    return course_with(tmp_path, PLANTED)


def test_cells_table_is_the_labs():
    solution = json.loads((ROOT / "solutions" / LAB / f"{LAB}.ipynb").read_text())
    found = {c["metadata"]["nbgrader"]["grade_id"]: (c["metadata"]["nbgrader"]["points"],
                                                     re.findall(r'check\("([^"]+)"', "".join(c["source"])))
             for c in solution["cells"] if c["metadata"].get("nbgrader", {}).get("grade")}
    assert found == CELLS


def test_each_planted_mistake_is_counted_by_student(root):
    report = class_report.build(root, LAB)
    ranked = [(m.key, m.students) for m in report.mistakes()]
    assert ranked == [("attention.unscaled", ("unscaled-1", "unscaled-2", "unscaled-3")),
                      ("mask.wrong_triangle", ("triangle-1", "triangle-2")),
                      ("02.no_value_projection", ("square-1",)), ("attention.swapped", ("swapped-1",))]
    assert report.mistakes()[0].pieces == ("attention", "AttentionHead")
    assert report.mistakes()[0].message == "attention.unscaled: what to do"  # the diagnosis, the case's line cut


def test_passed_visible_failed_hidden_per_piece(root):
    pieces = {row.piece: row for row in class_report.build(root, LAB).pieces()}
    assert pieces["attention"].visible_not_hidden == ("heads-1", "heads-2")
    assert pieces["AttentionHead"].visible_not_hidden == ("square-1",)
    assert sorted(pieces["causal_mask"].visible_not_hidden) == sorted(HOSTILE)
    graded = len(PLANTED) + len(STOPPED)
    assert pieces["causal_mask"].graded == graded
    assert pieces["causal_mask"].visible_passed == graded - 2  # the two triangles
    assert pieces["attention"].visible_passed == graded - 3 - 1  # three unscaled, the stopped one
    assert pieces["AttentionHead"].visible_passed == graded - 1 - 1 - 1  # unscaled-2, swapped-1, the stopped one


def test_histogram_bins_are_one_point_wide_and_hold_every_score(root):
    report = class_report.build(root, LAB)
    assert report.max_score == 15
    scores = [score(f) for f in PLANTED.values()] + [score(dict.fromkeys(CELLS["test_attention"][1]
                                                                         + CELLS["test_AttentionHead"][1]))]
    assert sorted(s.score for s in report.graded) == sorted(scores)
    bins = report.histogram()
    assert [(lo, hi) for lo, hi, _ in bins] == [(k, k + 1) for k in range(15)]
    assert [n for _, _, n in bins] == [sum(min(s, 14) == k for s in scores) for k in range(15)]  # 15 in the last
    assert bins[-1][2] == 2 + len(HOSTILE)  # [14, 15], full marks included: ok-1, ok-2 and those who lost 1 point
    assert bins[13][2] == 4  # heads-1, heads-2, square-1, triangle-1


def test_score_bins_of_a_large_lab_are_twenty():
    bins = class_report.score_bins([0, 49.9, 50, 100], 100)
    assert len(bins) == 20 and bins[9] == (45.0, 50.0, 1) and bins[10][2] == 1 and bins[-1][2] == 1


def test_runs_that_stopped_and_submissions_never_graded_are_listed(root):
    stopped = dict(class_report.build(root, LAB).stopped())
    assert set(stopped) == {"stopped-1", "never-graded"}
    assert stopped["stopped-1"][0] == STOPPED["stopped-1"][0]
    assert "autograde did not finish" in stopped["never-graded"][0]


def test_records_the_grader_did_not_write_for_that_cell_are_ignored(root):
    """A record on a solution cell, on a grade cell whose source does not name its case, of another lab or with
    odd types does not count: only the judge's, on the cell it judged."""
    path = root / "grading" / "autograded" / "ok-1" / LAB / f"{LAB}.ipynb"
    nb = json.loads(path.read_text())
    forged = {"lab": "02", "piece": "attention", "case": "02.attention.visible", "hidden": False, "passed": False,
              "outcome": "wrong", "mistake": "02.forged", "points": 0.0, "max_points": 3.0, "message": "x"}
    for cell in nb["cells"]:
        grading = cell["metadata"].get("nbgrader", {})
        if grading.get("solution") or not grading.get("grade"):
            cell["metadata"]["gptcourse"] = {"verdicts": [forged]}
        elif grading["grade_id"] == "test_causal_mask":
            cell["metadata"]["gptcourse"]["verdicts"] += [forged, forged | {"case": "03.causal_mask.visible"}]
        elif grading["grade_id"] == "test_attention":
            cell["metadata"]["gptcourse"]["verdicts"] += [forged | {"passed": "yes"}, forged | {"points": 1e9},
                                                           forged | {"case": ["02.attention.visible"]}, "x", None]
    path.write_text(json.dumps(nb))
    report = class_report.build(root, LAB)
    assert "02.forged" not in {m.key for m in report.mistakes()}
    assert next(s for s in report.submissions if s.student == "ok-1").score == 15


def test_files_are_written_escaped_and_formula_safe(root, monkeypatch, capsys):
    monkeypatch.chdir(root)
    assert cli.main(["report"]) == 0  # every lab graded: lab 02
    assert "attention.unscaled (3)" in capsys.readouterr().out
    folder = root / "grading" / "reports" / LAB
    page = (folder / "index.html").read_text()
    assert "<script" not in page.lower() and "onerror=alert" not in page.replace("onerror=alert(1)&gt;", "")
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    assert "default-src 'none'" in page and "http://" not in page and "https://" not in page
    assert page.count("<img alt='figure' src='data:image/png;base64,") == 3
    assert "<li>the most common named mistake: attention.unscaled, 3 students</li>" in page
    assert "failed a hidden one (are the instructions clear?): causal_mask 6, attention 2, AttentionHead 1" in page
    assert "lesson 02, 3. Why divide by" in page or "lesson 02, 2. The causal mask" in page
    with open(folder / "report.csv", encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    assert not [r for r in rows if r["student"][:1] in ("=", "+", "-", "@", "\t", "\r")]
    assert {"'" + h for h in HOSTILE if h[0] != "<"} <= {r["student"] for r in rows}
    assert len(rows) == sum(len(cases) for _, cases in CELLS.values()) * (len(PLANTED) + 1) + 1  # + never-graded
    pages = {p.name for p in (folder / "students").iterdir()}
    assert "unscaled-1.html" in pages and len(pages) == len(PLANTED) + 2
    mine = (folder / "students" / "unscaled-2.html").read_text()
    assert "attention.unscaled" in mine and "unscaled-1" not in mine and "triangle" not in mine
    # a report with ids is the instructor's alone: no other user can open its folder
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700 == stat.S_IMODE((folder / "students").stat().st_mode)


def test_anonymous_pseudonyms_are_stable_and_hide_every_id(root, monkeypatch):
    monkeypatch.setenv("GPTCOURSE_SECRET", "s3cret")
    first = class_report.write_report(root, LAB, anonymous=True)
    page = (first.folder / "index.html").read_text()
    assert not any(student in page for student in ("unscaled-1", "heads-2", "square-1", "stopped-1"))
    assert "students/" not in page
    again = class_report.build(root, LAB, anonymous=True)
    assert again.names == first.report.names and len(set(again.names.values())) == len(again.names)
    assert all(name.startswith("student-") for name in again.names.values())
    monkeypatch.setenv("GPTCOURSE_SECRET", "other")
    assert class_report.build(root, LAB, anonymous=True).names != again.names


def test_an_anonymous_report_shares_no_folder_with_a_named_one(root):
    """Named, then anonymous (the order an instructor runs them in before class): the folder shown to the class
    holds only the anonymous page and CSV, with no id anywhere, and the named report is still the instructor's."""
    named = class_report.write_report(root, LAB)
    shown = class_report.write_report(root, LAB, anonymous=True).folder
    assert shown != named.folder and sorted(p.name for p in shown.iterdir()) == ["index.html", "report.csv"]
    text = "".join(p.read_text() for p in shown.iterdir())
    ids = [sub.student for sub in named.report.submissions if re.search("[a-z]", sub.student)]  # not "-2"
    assert len(ids) > 5 and not [student for student in ids if student in text]
    assert "unscaled-1" in (named.folder / "index.html").read_text()
    assert (named.folder / "students" / "unscaled-1.html").is_file()


def test_compare_shows_what_changed_since_another_round(tmp_path):
    first = course_with(tmp_path / "first", PLANTED)
    fixed = PLANTED | {"unscaled-1": {}, "unscaled-2": {},
                       "heads-1": {"02.attention.visible": ("wrong", "attention.swapped")}}
    second = course_with(tmp_path / "second", fixed)
    written = class_report.write_report(second, LAB, compare=first / "grading")
    page = (written.folder / "index.html").read_text()
    section = page.split("Since the other round", 1)[1]
    assert "<tr><td>attention.unscaled</td><td>3</td><td>1</td></tr>" in section
    assert "<tr><td>attention.swapped</td><td>1</td><td>2</td></tr>" in section  # swapped-1, and heads-1 now
    assert "3 students in both rounds changed their score" in section
    with pytest.raises(SystemExit, match="holding autograded/"):
        class_report.write_report(second, LAB, compare=tmp_path)


def test_every_mistake_key_is_one_the_report_reads():
    """Each `Mistake("key", ...)` of the checks and the lab modules: a key the report keeps (`_MISTAKE`), declared
    in one module (twice there for two wordings of one mistake, lab 07's unshifted targets), a lab's own starting
    with its number (lab 04: "04.") and the shared checks' and the attention catalogue's with their topic (a
    parameter count's "params.", a shape's "shape.", a log's eps "loss.")."""
    import ast

    grading = ROOT / "shared" / "gptcourse"
    found: dict[str, list[str]] = {}
    for path in [grading / "checks.py", grading / "grading" / "attention_mistakes.py",
                 *sorted((grading / "grading" / "labs").glob("lab*.py"))]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Mistake" \
                    and isinstance(node.args[0], ast.Constant):  # not `fixtures.switch_key`'s, tested below
                found.setdefault(node.args[0].value, []).append(path.stem)
    assert {"attention.unscaled", "04.post_norm", "mask.wrong_triangle", "params.untied_head",
            "loss.eps_in_log", "shape.whole_position_table"} <= set(found)
    twice = {key: where for key, where in found.items() if len(set(where)) > 1}
    assert not twice, twice
    bad = {key: where for key, where in found.items() if not class_report._MISTAKE.fullmatch(key)
           or not key.startswith(where[0][3:] + "." if where[0].startswith("lab")
                                 else ("mask.", "softmax.", "attention.", "shape.", "params.", "loss."))}
    assert not bad, bad


@pytest.mark.parametrize("gradebook", [False, True])
def test_the_report_imports_neither_torch_nor_nbgrader(root, gradebook):
    """It reads JSON, and the gradebook with one SELECT: seconds of imports saved on every run (nbgrader alone took
    4 s; `spreadsheet.py` and `gradebook_verdicts.SCORES` exist for this)."""
    import subprocess
    import sys

    if gradebook:
        gradebook_of_the_class(root, PLANTED)
    code = ("import sys\nfrom gptcourse.cli import main\nmain(['report', '02_causal_attention'])\n"
            "print(' '.join(sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, check=True).stdout
    modules = set(out.splitlines()[-1].split())
    assert "gptcourse.grading.classroom.class_report" in modules and "matplotlib" in modules
    assert not {"torch", "nbgrader", "nbformat"} & modules
    assert ("sqlalchemy" in modules) == gradebook  # the course's gradebook, read by default
    with pytest.raises(SystemExit, match="not a lab name"):
        cli.main(["report", "lab02"])


@pytest.mark.parametrize(("student", "case", "key"), [
    ("coupled-decay", "09.adamw_step.visible", "09.adamw_step:decay=gradient"),
    ("warmup-from-zero", "09.lr_at.visible", "09.lr_at:warmup_from_zero=True"),
    ("mask-pad-query-sees-nothing", "10.padding_mask.visible", "10.mask_pad_query_sees_nothing"),
    ("pool-mask-sum", "10.last_real_token.left", "10.pool_mask_sum"),
    ("bt-mean-before-log-sigmoid", "10.bradley_terry_loss.visible", "10.bt_mean_before_log_sigmoid"),
    ("targets-shifted-twice", "07.next_token_loss.visible", "07.targets_shifted_twice"),
    ("no-zero-grad", "07.train_step.twice", "07.train_step:zero_grad=False"),
    ("temperature-twice", "07.next_token_probs.visible", "07.temperature_twice"),
    ("first-position", "07.sample_next_token.visible", "07.first_position")])
def test_round_trip_students_are_judged_with_their_mistakes_key(student, case, key):
    """Round-trip students of labs 07, 09 and 10, judged in-process as the grader judges a payload: the mistakes
    that a by-hand function's switches give (`fixtures.mistaken`: labs 09, 13, 15; lab 07's train_step) are keyed by
    them, the tables' by their `Mistake`s (lab 10's mask judge's own loop too)."""
    import importlib

    from lab_roundtrip import solved_namespace

    from gptcourse.grading.cases import case_seed, get_case
    from gptcourse.grading.kernel import run_case
    from gptcourse.grading.payload import judged

    lab = {"07": "07_training_and_generation", "09": "09_training_by_hand", "10": "10_finetuning_and_rewards"}[case[:2]]
    answers = importlib.import_module(f"test_labs_{case[:2]}").WRONG[student][0]
    obj = solved_namespace(lab, answers)[case.split(".")[1]]
    verdict = judged(run_case(get_case(case), case_seed(get_case(case)), obj))
    assert (verdict.passed, verdict.outcome, verdict.mistake) == (False, "wrong", key)
    assert class_report._MISTAKE.fullmatch(key)


def test_the_batchs_resume_records_are_no_submission(root):
    """`gptcourse autograde` (one machine or --cluster) keeps a record per graded submission in
    autograded/.gptcourse-batch/LAB/: no student of the report, no lab."""
    records = root / "grading" / "autograded" / ".gptcourse-batch" / LAB
    records.mkdir(parents=True)
    (records / "ok-1.json").write_text('{"fingerprint": "0", "graded": 0}')
    (root / "grading" / "autograded" / ".gptcourse-batch" / "99_not_a_lab").mkdir()
    report = class_report.build(root, LAB)
    assert ".gptcourse-batch" not in report.names and len(report.submissions) == len(PLANTED) + len(STOPPED) + 1
    assert class_report.graded_labs(root) == [LAB]


def test_an_unreadable_autograded_notebook_is_listed_not_fatal(root):
    folder = root / "grading" / "autograded"
    for student, text in (("not-json", "{"), ("a-list", "[1, 2]"), ("odd-cells", '{"cells": [1, {"metadata": 2}]}')):
        (folder / student / LAB).mkdir(parents=True)
        (folder / student / LAB / f"{LAB}.ipynb").write_text(text)
    stopped = dict(class_report.build(root, LAB).stopped())
    assert stopped["not-json"] == ["unreadable: JSONDecodeError"]
    assert stopped["a-list"][0].startswith("no test was recorded") and stopped["odd-cells"][0] == stopped["a-list"][0]
    assert class_report.write_report(root, LAB).report.max_score == 15


def gradebook_of_the_class(root, failing: dict[str, dict]) -> str:
    """grading/gradebook.db holding what autograde gives the planted class (each cell all or nothing, from CELLS),
    made with nbgrader's API as autograde's SaveAutoGrades does: the course's gradebook URL."""
    from nbgrader.api import Gradebook

    url = f"sqlite:///{root / 'grading' / 'gradebook.db'}"
    with Gradebook(url) as gb:
        gb.add_assignment(LAB)
        gb.add_notebook(LAB, LAB)
        for cell, (points, _) in CELLS.items():
            gb.add_grade_cell(cell, LAB, LAB, max_score=points, cell_type="code")
        for student, cases in failing.items():
            gb.add_student(student)
            gb.add_submission(LAB, student)
            for cell, (points, checked) in CELLS.items():
                grade = gb.find_grade(cell, LAB, LAB, student)
                grade.auto_score, grade.needs_manual_grade = (0.0 if set(checked) & set(cases) else points), False
        gb.db.commit()
    return url


@pytest.fixture
def graded(root):
    """The planted class with its gradebook (the stopped student's unrun cells score 0)."""
    stopped = dict.fromkeys(CELLS["test_attention"][1] + CELLS["test_AttentionHead"][1])
    return root, gradebook_of_the_class(root, PLANTED | {"stopped-1": stopped})


def test_gradebook_scores_agree_with_the_verdicts_when_nothing_changed(graded):
    root, url = graded
    report = class_report.build(root, LAB, db_url=url)
    assert report.gradebook.differences == () and report.gradebook.students == len(PLANTED) + 1
    assert {s.student: s.score for s in report.graded} == {s.student: s.score for s in class_report.build(
        root, LAB).graded}
    assert report.gradebook.only_gradebook == report.gradebook.only_notebooks == ()


def test_a_cell_without_verdicts_counts_its_gradebook_score(graded):
    """ok-2's notebook lost the records of test_AttentionHead_hidden (2 points): the gradebook's score still counts,
    and the page says the cell had no verdict."""
    root, url = graded
    path = root / "grading" / "autograded" / "ok-2" / LAB / f"{LAB}.ipynb"
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        if cell["metadata"].get("nbgrader", {}).get("grade_id") == "test_AttentionHead_hidden":
            del cell["metadata"]["gptcourse"]
    path.write_text(json.dumps(nb))
    assert next(s for s in class_report.build(root, LAB).graded if s.student == "ok-2").score == 13
    report = class_report.build(root, LAB, db_url=url)
    assert next(s for s in report.graded if s.student == "ok-2").score == 15
    [difference] = report.gradebook.differences
    assert (difference.student, difference.cell, difference.verdicts) == ("ok-2", "test_AttentionHead_hidden", None)
    assert "<td>-</td><td>2 / 2</td><td>no verdict recorded for the cell</td>" in class_report.page(report)


def test_a_manual_regrade_in_the_gradebook_changes_the_reports_score(graded, monkeypatch):
    """An instructor gives unscaled-3 full marks for test_attention in formgrader (a manual score, as its API
    saves one) and takes a point of ok-1's test_causal_mask: the report's scores and histogram are the gradebook's,
    the page lists both cells; the mistakes are still the grader's."""
    from nbgrader.api import Gradebook

    root, url = graded
    with Gradebook(url) as gb:
        gb.find_grade("test_attention", LAB, LAB, "unscaled-3").manual_score = 3.0
        gb.find_grade("test_causal_mask", LAB, LAB, "ok-1").manual_score = 1.0
        gb.db.commit()
    monkeypatch.chdir(root)
    assert cli.main(["report", LAB]) == 0  # the course's gradebook, grading/gradebook.db, by default
    page = (root / "grading" / "reports" / LAB / "index.html").read_text()
    assert "2 cells differ" in page
    assert "<tr><td>unscaled-3</td><td>test_attention</td><td>0</td><td>3 / 3</td><td>a manual score" in page
    assert "<tr><td>ok-1</td><td>test_causal_mask</td><td>2</td><td>1 / 2</td><td>a manual score" in page
    report = class_report.build(root, LAB, db_url=url)
    scores = {s.student: s.score for s in report.graded}
    assert scores["unscaled-3"] == score(PLANTED["unscaled-3"]) + 3 == 15
    assert scores["ok-1"] == 14
    ok_1 = next(s for s in report.graded if s.student == "ok-1")
    assert [v.points for v in ok_1.verdicts if v.cell == "test_causal_mask"] == [1.0]
    expected = {student: score(failing) for student, failing in PLANTED.items()} | {"unscaled-3": 15, "ok-1": 14}
    stopped = score(dict.fromkeys(CELLS["test_attention"][1] + CELLS["test_AttentionHead"][1]))
    assert report.histogram() == class_report.score_bins([*expected.values(), stopped], 15)
    assert report.histogram()[-1][2] == 3 + len(HOSTILE)  # [14, 15]: ok-1 (14 now), ok-2, unscaled-3 (15 now)
    assert "unscaled-3" in dict((m.key, m.students) for m in report.mistakes())["attention.unscaled"]
    assert cli.main(["report", LAB, "--db", "none"]) == 0
    assert "cells differ" not in (root / "grading" / "reports" / LAB / "index.html").read_text()


def test_an_anonymous_page_names_no_student_and_no_gradebook_path(root, monkeypatch):
    """A student in the gradebook with no autograded notebook, and a manual regrade, on an --anonymous page: both by
    pseudonym, and the gradebook's URL (a path that may name people) left out."""
    from nbgrader.api import Gradebook

    monkeypatch.setenv("GPTCOURSE_SECRET", "s3cret")
    url = gradebook_of_the_class(root, PLANTED | {"gradebook-only-student": {}})
    with Gradebook(url) as gb:
        gb.find_grade("test_attention", LAB, LAB, "unscaled-3").manual_score = 3.0
        gb.db.commit()
    report = class_report.build(root, LAB, anonymous=True, db_url=url)
    page = class_report.page(report, anonymous=True)
    assert report.gradebook.only_gradebook == ("gradebook-only-student",) and "1 cells differ" in page
    assert not any(s in page for s in ("gradebook-only-student", "unscaled-3", "gradebook.db", str(root)))
    assert report.names["gradebook-only-student"] in page and report.names["unscaled-3"] in page


def test_a_gradebook_that_is_not_there_is_an_error_not_a_new_file(root, tmp_path):
    missing = tmp_path / "typo.db"
    with pytest.raises(SystemExit, match="no such SQLite gradebook"):
        class_report.build(root, LAB, db_url=f"sqlite:///{missing}")
    assert not missing.exists()
    with pytest.raises(SystemExit, match=r"expected nbgrader's db_url"):
        class_report.build(root, LAB, db_url="mysql://user:pw@host/db")
    with pytest.raises(SystemExit, match=r"^--db postgresql://user:\*\*\*@127.0.0.1:1/db: the gradebook could not be "
                                         r"read \(OperationalError.*--db none") as refused:
        class_report.build(root, LAB, db_url="postgresql://user:s3cret@127.0.0.1:1/db")  # nothing listens on port 1
    assert "s3cret" not in str(refused.value)


def test_gradebook_scores_are_nbgrader_s(graded):
    """The report's SELECT counts a cell as nbgrader's `Grade.score` does: a manual score wins, extra credit is added,
    a cell with neither score is 0 (nbgrader's API, the reference)."""
    from nbgrader.api import Gradebook

    from gptcourse.grading.classroom.gradebook_verdicts import gradebook_scores

    url = graded[1]
    edits = {("ok-1", "test_attention"): (None, 1.5, 0.5), ("heads-1", "test_attention_hidden"): (None, None, 1.0),
             ("triangle-1", "test_causal_mask"): (0.0, None, 0.25), ("ok-2", "test_AttentionHead"): (None, 0.0, None)}
    with Gradebook(url) as gb:
        for (student, cell), (auto, manual, extra) in edits.items():
            grade = gb.find_grade(cell, LAB, LAB, student)
            grade.auto_score, grade.manual_score, grade.extra_credit = auto, manual, extra
        gb.db.commit()
        expected = {sub.student.id: {g.name: (g.score, g.max_score) for nb in sub.notebooks for g in nb.grades}
                    for sub in gb.find_assignment(LAB).submissions}
    read = gradebook_scores(url, LAB)
    assert {s: {c: (v.score, v.max_score) for c, v in cells.items()} for s, cells in read.items()} == expected
    assert [read[s][c].score for s, c in edits] == [2.0, 0.0, 0.25, 0.0]
