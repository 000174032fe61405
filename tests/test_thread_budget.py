"""The thread budget (`gptcourse.threads`) and the lesson timer (`python -m gptcourse.bench_lessons`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest

from gptcourse import bench_lessons
from gptcourse.threads import WAITS, cores, spin_briefly_then_sleep, thread_budget, thread_share


@pytest.mark.parametrize(("given", "workers", "share"), [
    ({"OMP_NUM_THREADS": "8"}, 2, 4), ({"OMP_NUM_THREADS": "8"}, 3, 2), ({"OMP_NUM_THREADS": "1"}, 4, 1),
    ({"OMP_NUM_THREADS": "not a number"}, 1, None), ({}, 1, None)])
def test_processes_side_by_side_split_the_budget(given, workers, share):
    expected = share if share is not None else len(os.sched_getaffinity(0))  # no valid budget: every core
    assert thread_share(workers, dict(given)) == expected
    assert thread_budget(dict(given)) == (int(given["OMP_NUM_THREADS"]) if share is not None else cores())


def test_no_share_for_no_worker():
    with pytest.raises(ValueError, match="workers=0: expected at least one process"):
        thread_share(0, {})


@pytest.mark.parametrize(("given", "expected"), [
    ({}, {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "1000"}),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, {"OMP_WAIT_POLICY": "ACTIVE"}),  # a learner's own choice is kept
    ({"GOMP_SPINCOUNT": "0"}, {"GOMP_SPINCOUNT": "0"})])
def test_waiting_threads_spin_briefly_unless_told_otherwise(given, expected):
    env = dict(given)
    spin_briefly_then_sleep(env)
    assert env == expected


def test_importing_gptcourse_before_torch_makes_its_threads_spin_briefly():
    """In a fresh interpreter, as a lesson's first cell runs: the variables are set before OpenMP reads them."""
    probe = ("import os, sys; import gptcourse; assert 'torch' not in sys.modules; import torch; "
             "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'])")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["PASSIVE", "1000"], proc.stderr


def _lesson(folder, name: str, source: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / name)


def test_the_lesson_timer_times_each_lesson_alone_and_beside(tmp_path, capsys):
    seen = tmp_path / "seen.txt"  # each run's kernel appends how its threads were told to wait
    record = "print(os.environ['OMP_WAIT_POLICY'], os.environ['GOMP_SPINCOUNT'], file=f)"
    source = f"import os\nx = sum(range(10**6))\nwith open({str(seen)!r}, 'a') as f:\n    {record}"
    _lesson(tmp_path, "00_quick.ipynb", source)
    bench_lessons.main(["--lessons-dir", str(tmp_path), "--beside", "busy-loop", "--wait", "passive", "--json"])
    rows = [bench_lessons.Timing(**json.loads(line)) for line in capsys.readouterr().out.splitlines()]
    assert [(r.lesson, r.wait, r.beside, r.ok) for r in rows] == [("00_quick", "passive", "alone", True),
                                                                  ("00_quick", "passive", "busy-loop", True)]
    assert all(r.wall_s > 0 and r.cpu_s > 0.1 for r in rows)  # the kernel's CPU time is counted, not only the parent's
    assert seen.read_text().splitlines() == ["PASSIVE 0"] * 2 == [" ".join(WAITS["passive"].values())] * 2


def test_the_lesson_timer_says_when_a_lesson_fails(tmp_path, monkeypatch):
    wall, _, ok = bench_lessons.timed_run([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ))
    assert not ok and wall > 0
    _lesson(tmp_path, "00_quick.ipynb", "pass")
    monkeypatch.setattr(bench_lessons, "timed_run", lambda command, env: (1.0, 1.0, False))
    with pytest.raises(SystemExit, match="a lesson failed to run"):
        bench_lessons.main(["--lessons-dir", str(tmp_path), "--beside", "busy-loop"])


def test_the_lesson_timer_names_a_missing_lesson(tmp_path):
    _lesson(tmp_path, "00_quick.ipynb", "pass")
    with pytest.raises(SystemExit, match=r"no lesson numbered 42 in .*; there are 00"):
        bench_lessons.find_lessons(tmp_path, ["42"])
