"""The course directory as an instructor and a student use it: every lab has its round trip (which checks that
labs/NN is exactly what nbgrader generates from solutions/NN), zip_collect files submissions where autograde
finds them, `gptcourse progress` reports each lab."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import nbformat
import pytest
from lab_roundtrip import RoundTrip

ROOT = Path(__file__).resolve().parents[1]
LABS = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())

pytestmark = pytest.mark.slow


def test_every_lab_has_its_round_trip():
    """Each lab's round trip (tests/test_labs_NN.py, a `RoundTrip`) also checks that labs/NN is what nbgrader
    generates from solutions/NN; here: no lab without one, and no released lab without its source."""
    assert sorted(p.name for p in (ROOT / "labs").iterdir() if p.is_dir()) == LABS
    for lab in LABS:
        module = importlib.import_module(f"test_labs_{lab[:2]}")
        trips = [value for value in vars(module).values()
                 if isinstance(value, type) and issubclass(value, RoundTrip) and value is not RoundTrip]
        assert [trip.LAB for trip in trips] == [lab], f"tests/test_labs_{lab[:2]}.py: expected one RoundTrip of {lab}"


def test_zip_collect_files_downloaded_submissions_for_autograde(fresh_course):
    lab = LABS[0]
    archive = fresh_course.root / "grading" / "downloaded" / lab / "archive"
    archive.mkdir(parents=True)
    released = fresh_course.root / "labs" / lab / f"{lab}.ipynb"
    shutil.copy(released, archive / f"alice_{lab}.ipynb")
    with zipfile.ZipFile(archive / "bob.zip", "w") as zf:
        zf.write(released, f"bob_{lab}.ipynb")
    fresh_course.nbgrader("zip_collect", lab)
    for student in ("alice", "bob"):
        submitted = fresh_course.root / "grading" / "submitted" / student / lab / f"{lab}.ipynb"
        assert submitted.read_bytes() == released.read_bytes()


def test_progress_shows_which_visible_tests_pass(fresh_course, tmp_path):
    done, todo = LABS[0], LABS[1]
    labs = tmp_path / "labs"
    for lab in (done, todo):
        (labs / lab).mkdir(parents=True)
    nbformat.write(fresh_course.solved(done), labs / done / f"{done}.ipynb")
    shutil.copy(ROOT / "labs" / todo / f"{todo}.ipynb", labs / todo)
    proc = subprocess.run([sys.executable, "-m", "gptcourse.cli", "progress", "--labs", str(labs)],
                          capture_output=True, text=True, timeout=600)
    rows = {line.split()[0]: line.split(None, 2)[1:] for line in proc.stdout.splitlines()[1:]}
    assert rows[done] == ["3/3", "all pass"]
    assert rows[todo] == ["0/4", "test_causal_mask, test_attention, test_attention_causal, test_AttentionHead"]
    assert proc.returncode == 1
    assert proc.stderr == "", f"progress printed more than its table:\n{proc.stderr}"  # e.g. the kernels' log
