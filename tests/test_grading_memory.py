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

from gptcourse.grading.box.memory_limit import PREFIX, BoxMemory, own_memory_cgroup, start_time

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

# Shared memory left behind (issue 49): a correct submission's last cell has a subprocess (ctypes in the kernel
# itself would cost the lab's points) make 2.9 GB of SysV shared memory, 100 MB a segment, each touched, detached
# and never removed, and as much POSIX shared memory as /dev/shm takes; then ask for one more segment.
LEAVE_SHARED_MEMORY = """
import ctypes
from multiprocessing import resource_tracker, shared_memory
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
made = 0
for key in range(0x5eed00, 0x5eed00 + 29):
    segment = libc.shmget(key, ctypes.c_size_t(100_000_000), 0o1600)  # IPC_CREAT | 0600
    address = libc.shmat(segment, None, 0) if segment >= 0 else None
    if address in (None, ctypes.c_void_p(-1).value):
        break
    ctypes.memset(ctypes.c_void_p(address), 1, 100_000_000)  # resident, not only reserved
    libc.shmdt(ctypes.c_void_p(address))
    made += 1
print("segments made:", made)
posix = shared_memory.SharedMemory(name="gptcourse-shm-test", create=True, size=1 << 20)
resource_tracker.unregister(posix._name, "shared_memory")
try:
    with open("/dev/shm/gptcourse-shm-test-file", "wb") as f:
        for _ in range(2900):
            f.write(bytes(10**6))
except OSError as err:
    print("/dev/shm is full:", err.strerror)
more = libc.shmget(0x5eed49, ctypes.c_size_t(1_000_000_000), 0o1600)
print("one more segment:", "refused" if more < 0 else "made")
"""
USE_HALF_A_GIGABYTE = 'block = bytearray(b"x") * 500_000_000  # written, so resident'
IN_SUBPROCESS = "import subprocess, sys\nprint(subprocess.run([sys.executable, '-c', {code!r}], text=True, " \
                "stdout=subprocess.PIPE, stderr=subprocess.STDOUT).stdout)"


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


@pytest.mark.parametrize("grader, bound", [
    pytest.param("gptcourse", "cgroup", marks=pytest.mark.skipif(cgroup_problem() is not None,
                                                                 reason=f"{cgroup_problem()}")),
    ("gptcourse", "watchdog"),
    ("nbgrader", "auto")])
def test_shared_memory_left_by_a_kernel_is_freed_before_the_next(tmp_path, grader, bound):
    """A correct submission whose last cell leaves 2.9 GB of SysV shared memory (the limit is 3 GB) and fills
    /dev/shm (64 MB here): the correct submission graded after it in the same box, which uses 0.5 GB, gets the
    full score and no report line: its memory is its own again. Under the watchdog as root, a kernel's SysV
    shared memory is capped at its limit."""
    course = Course(tmp_path / "course")
    with open(course.root / "nbgrader_config.py", "a") as config:
        config.write(f"\nc.Sandbox.memory_gb = 3.0\nc.Sandbox.scratch_mb = 64\nc.Sandbox.memory_bound = {bound!r}\n")
    course.nbgrader("generate_assignment", LAB, "--force")
    leaver = course.solved(LAB)
    leaver.cells.append(nbformat.v4.new_code_cell(IN_SUBPROCESS.format(code=LEAVE_SHARED_MEMORY)))
    course.submit("a-shared-memory", LAB, leaver)  # graded first: the next one runs in the same box after it
    honest = course.solved(LAB)
    honest.cells.append(nbformat.v4.new_code_cell(USE_HALF_A_GIGABYTE))  # well within its 3 GB, unless a's are left
    course.submit("b-next", LAB, honest)
    if grader == "nbgrader":
        course.nbgrader("autograde", LAB)
    else:
        proc = subprocess.run([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, "--workers", "1"],
                              cwd=course.root, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-4000:]
    full = course.expected_scores(LAB)
    assert course.scores(LAB) == {"a-shared-memory": full, "b-next": full}
    report = (course.root / "grading" / "reports" / LAB / "b-next.txt").read_text()
    assert "\n- " not in report, report
    printed = "".join(output.get("text", "") for output in
                      course.notebook("grading/autograded/a-shared-memory", LAB).cells[-1].get("outputs", []))
    if bound != "watchdog":  # a memory cgroup counts the segments: the limit may stop the last ones
        assert "segments made: 29" in printed or "out of memory" in (
            course.root / "grading" / "reports" / LAB / "a-shared-memory.txt").read_text(), printed
    else:
        assert "segments made: 29" in printed and "/dev/shm is full: No space left on device" in printed, printed
        if os.geteuid() == 0:
            assert "one more segment: refused" in printed, printed
