"""The thread budget (`gptcourse.threads`) and the lesson timer (`python -m gptcourse.bench_lessons`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import nbformat
import pytest

from gptcourse import bench_lessons
from gptcourse.threads import cores, thread_budget, thread_share, wait_passively


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


def test_waiting_is_passive_unless_set():
    env: dict[str, str] = {}
    wait_passively(env)
    assert env == {"OMP_WAIT_POLICY": "PASSIVE"}
    env = {"OMP_WAIT_POLICY": "ACTIVE"}
    wait_passively(env)
    assert env == {"OMP_WAIT_POLICY": "ACTIVE"}  # a learner's own choice is kept


def test_importing_gptcourse_before_torch_makes_its_threads_wait_passively():
    """In a fresh interpreter, as a lesson's first cell runs: the variable is set before OpenMP reads it."""
    probe = ("import os, sys; import gptcourse; assert 'torch' not in sys.modules; import torch; "
             "print(os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "PASSIVE", proc.stderr


def _lesson(folder, name: str, source: str) -> None:
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(source)])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / name)


def test_the_lesson_timer_times_each_lesson_alone_and_beside(tmp_path, capsys):
    _lesson(tmp_path, "00_quick.ipynb", "x = sum(range(10**6))")
    bench_lessons.main(["--lessons-dir", str(tmp_path), "--beside", "busy-loop", "--json"])
    rows = [bench_lessons.Timing(**json.loads(line)) for line in capsys.readouterr().out.splitlines()]
    assert [(r.lesson, r.beside, r.ok) for r in rows] == [("00_quick", "alone", True), ("00_quick", "busy-loop", True)]
    assert all(r.wall_s > 0 and r.cpu_s > 0.1 for r in rows)  # the kernel's CPU time is counted, not only the parent's


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
