"""A kernel's memory is bounded as a whole: a correct lab-02 submission plus one cell that starts four processes
of 1.5 GB each (6 GB together, each under the 3 GB limit) is stopped, its processes killed, the report names the
limit, the tests after the cell still score, and the next submission graded in the same box (`gptcourse
autograde`, one worker) is graded normally. Once with the box's memory cgroup, once with the zygote's watchdog.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbgrader_course import Course, sandbox_problem

from gptcourse.grading.memory_limit import PREFIX, BoxMemory, own_memory_cgroup, start_time

LAB = "02_causal_attention"
MARKER = "gptcourse-memory-test"  # in the command line of every process the cell starts
pytestmark = [pytest.mark.slow, pytest.mark.skipif(sandbox_problem() is not None,
                                                  reason=f"the sandbox cannot start here: {sandbox_problem()}")]
HOLD = f"""
# {MARKER}
import time
block = bytearray(1500 * 10**6)
for i in range(0, len(block), 4096):
    block[i] = 1  # resident, not only reserved
time.sleep(30)
"""
FOUR_PROCESSES = f"""
import subprocess, sys
children = [subprocess.Popen([sys.executable, "-c", {HOLD!r}]) for _ in range(4)]
for child in children:
    child.wait()
"""


def cgroup_problem() -> str | None:
    """Why this grader cannot make a memory cgroup for a box, or None."""
    try:
        BoxMemory(10**9, "cgroup").close()
    except SystemExit as unavailable:
        return str(unavailable)
    return None


def marked_processes() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and MARKER.encode() in (proc / "cmdline").read_bytes():
                found.append(proc.name)
        except OSError:
            pass
    return found


def box_cgroups() -> list[str]:
    """The box cgroups left by graders that are gone (`PREFIX` + the grader's pid + ...): a cgroup of a grader
    still running belongs to another test (pytest's other worker), not to a leftover of this one."""
    found = own_memory_cgroup()
    names = [] if found is None else [n for n in os.listdir(found[1]) if n.startswith(PREFIX)]
    return [n for n in names if not os.path.exists(f"/proc/{n[len(PREFIX):].split('-')[0]}")]


@pytest.mark.parametrize("bound", [
    pytest.param("cgroup", marks=pytest.mark.skipif(cgroup_problem() is not None, reason=f"{cgroup_problem()}")),
    "watchdog"])
def test_a_kernel_and_its_processes_share_one_memory_limit(tmp_path, bound):
    course = Course(tmp_path / "course")
    with open(course.root / "nbgrader_config.py", "a") as config:
        config.write(f"\nc.Sandbox.memory_gb = 3.0\nc.Sandbox.memory_bound = {bound!r}\n")
    course.nbgrader("generate_assignment", LAB, "--force")
    hog = course.solved(LAB)
    at = next(i for i, c in enumerate(hog.cells) if c.metadata.nbgrader.get("grade_id") == "attention") + 1
    hog.cells.insert(at, nbformat.v4.new_code_cell(FOUR_PROCESSES))
    course.submit("a-four-processes", LAB, hog)  # graded first: the next one runs in the same box after it
    course.submit("b-next", LAB, course.solved(LAB))
    proc = subprocess.run([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, "--workers", "1"],
                          cwd=course.root, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert marked_processes() == []
    assert box_cgroups() == []  # the box's cgroup went with it
    full = course.expected_scores(LAB)
    assert course.scores(LAB) == {"a-four-processes": full, "b-next": full}
    reports = {s: (course.root / "grading" / "reports" / LAB / f"{s}.txt").read_text() for s in course.scores(LAB)}
    line = (rf"kernel ran out of memory \(limit 3 GB for the kernel and every process it starts\) in cell {at + 1} "
            r"\(added by you\); tests before it still count")
    assert re.search(line, reports["a-four-processes"]), reports["a-four-processes"]
    assert reports["a-four-processes"].count("\n- ") == 1, reports["a-four-processes"]
    assert "\n- " not in reports["b-next"], reports["b-next"]


@pytest.mark.skipif(own_memory_cgroup() is None or cgroup_problem() is not None, reason="no memory cgroup here")
def test_cgroups_of_dead_graders_are_removed_when_a_box_starts():
    parent = own_memory_cgroup()[1]
    dead = subprocess.Popen(["true"])
    dead.wait()
    leftover = os.path.join(parent, f"{PREFIX}{dead.pid}-1-0")  # a pid that is gone, with any start time
    os.mkdir(leftover)
    left = subprocess.Popen(["sleep", "60"])  # a process the dead grader's box left behind
    with open(os.path.join(leftover, "cgroup.procs"), "w") as procs:
        procs.write(str(left.pid))
    alive = os.path.join(parent, f"{PREFIX}{os.getpid()}-{start_time(os.getpid())}-999")  # this process's: kept
    os.mkdir(alive)
    memory = BoxMemory(10**9, "cgroup")
    try:
        assert not os.path.exists(leftover)
        assert left.wait(timeout=5) == -9
        assert os.path.isdir(alive) and os.path.isdir(memory.folder)
    finally:
        left.kill()
        made = memory.folder
        memory.close()
        for folder in (leftover, alive):
            if os.path.exists(folder):
                os.rmdir(folder)
    assert not os.path.exists(made)
