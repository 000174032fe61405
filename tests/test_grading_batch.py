"""`gptcourse autograde`: the same scores as stock `nbgrader autograde`, resume, an interrupted batch, and the
kernels it forks from the zygote (fresh per notebook, like a stock kernel, interruptible, killable)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import pytest
from nbformat.v4 import new_code_cell, new_notebook
from nbgrader_course import Course

from gptcourse.grading.box.zygote import Zygote, ZygoteClient, ZygoteError, check_fork_safe, thread_count, with_zygote
from gptcourse.grading.classroom.bench_grading import build_class

LAB = "02_causal_attention"
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not Zygote.supported(), reason="the zygote needs Linux (fork, prctl)")]


def gptcourse_autograde(course: Course, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, *args], cwd=course.root,
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    return proc


def make_class(course: Course, students: int) -> None:
    course.nbgrader("generate_assignment", LAB, "--force")
    for student, nb in build_class(course.root, LAB, students).items():
        course.submit(student, LAB, nb)


def rows(course: Course) -> dict[str, int]:
    """Gradebook rows: submissions per (student, lab) and grades per submission, from the SQLite file."""
    with sqlite3.connect(course.root / "grading" / "gradebook.db") as db:
        submissions = db.execute("SELECT COUNT(*), COUNT(DISTINCT student_id) FROM submitted_assignment").fetchone()
        grades = db.execute("SELECT COUNT(*), COUNT(DISTINCT cell_id) FROM grade").fetchone()
    return {"submissions": submissions[0], "students": submissions[1], "grades": grades[0],
            "distinct grades": grades[1]}


@pytest.fixture(scope="module")
def graded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Course, Course, str]:
    """One class of 3 (solved, one piece undone, untouched) graded by stock nbgrader and by gptcourse."""
    stock, fast = Course(tmp_path_factory.mktemp("stock")), Course(tmp_path_factory.mktemp("fast"))
    for course in (stock, fast):
        make_class(course, 3)
    stock.nbgrader("autograde", LAB)
    return stock, fast, gptcourse_autograde(fast, "--workers", "2").stdout


def test_same_scores_as_stock_nbgrader(graded):
    stock, fast, _ = graded
    expected = stock.scores(LAB)
    assert fast.scores(LAB) == expected
    full = stock.expected_scores(LAB)
    assert expected["student000-solved"] == full
    assert expected["student002-untouched"] == {cell: 0.0 for cell in full}
    assert 0 < sum(expected["student001-partial"].values()) < sum(full.values())


def test_summary_table_lists_every_student_with_score(graded):
    stock, _, output = graded
    for student, by_cell in stock.scores(LAB).items():
        line = next(line for line in output.splitlines() if line.startswith(student))
        assert f"{sum(by_cell.values()):g}/{sum(stock.expected_scores(LAB).values()):g}" in line
        assert "graded" in line
    assert "graded 3, up to date 0, no notebook 0, failed or not graded 0" in output


def test_second_run_resumes_and_regrades_only_a_changed_submission(graded):
    _, fast, _ = graded
    autograded = fast.root / "grading" / "autograded"
    before = {p: p.stat().st_mtime_ns for p in autograded.glob(f"*/{LAB}/{LAB}.ipynb")}
    assert "up to date 3" in gptcourse_autograde(fast).stdout
    assert {p: p.stat().st_mtime_ns for p in before} == before

    (fast.root / "grading" / "submitted" / "student002-untouched" / LAB / "timestamp.txt").write_text(
        "2030-01-01 00:00:00.000000 UTC")
    output = gptcourse_autograde(fast).stdout
    assert "graded 1, up to date 2" in output
    changed = {p for p in before if p.stat().st_mtime_ns != before[p]}
    assert changed == {autograded / "student002-untouched" / LAB / f"{LAB}.ipynb"}
    assert rows(fast)["submissions"] == 3


def test_misnamed_and_missing_notebooks_are_reported(graded):
    """Runs after the resume test: it adds two students to the same class."""
    _, fast, _ = graded
    submitted = fast.root / "grading" / "submitted"
    misnamed = submitted / "student100-misnamed" / LAB
    misnamed.mkdir(parents=True)
    shutil.copy(submitted / "student000-solved" / LAB / f"{LAB}.ipynb", misnamed / f"{LAB} (1).ipynb")
    (submitted / "student101-empty" / LAB).mkdir(parents=True)
    (submitted / "student101-empty" / LAB / "notes.txt").write_text("I could not finish")
    output = gptcourse_autograde(fast).stdout
    assert "graded 1, up to date 3, no notebook 1, failed or not graded 0" in output, output
    line = next(line for line in output.splitlines() if line.startswith("student100-misnamed"))
    assert f"0/{sum(fast.expected_scores(LAB).values()):g}" in line
    report = (fast.root / "grading" / "reports" / LAB / "student100-misnamed.txt").read_text()
    assert f"- no {LAB}.ipynb was submitted, only {LAB} (1).ipynb, which is not graded" in report
    empty = (fast.root / "grading" / "reports" / LAB / "student101-empty.txt").read_text()
    assert "- no notebook was submitted (the folder holds notes.txt)" in empty
    assert "student101-empty" not in fast.scores(LAB)
    assert "graded 0, up to date 4, no notebook 1" in gptcourse_autograde(fast).stdout  # the misnamed one resumes


def _processes_in(folder: Path) -> list[int]:
    """Processes whose working directory is inside `folder` (graders, kernels)."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and Path(os.readlink(proc / "cwd")).is_relative_to(folder):
                found.append(int(proc.name))
        except OSError:
            pass
    return found


def test_killed_batch_run_again_ends_consistent(graded, tmp_path):
    stock, _, _ = graded
    course = Course(tmp_path / "course")
    make_class(course, 3)
    records = course.root / "grading" / "autograded" / ".gptcourse-batch" / LAB
    grader = subprocess.Popen([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, "--workers", "2"],
                              cwd=course.root, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 600
    while not (records.exists() and any(records.iterdir())) and time.monotonic() < deadline:
        assert grader.poll() is None, "the batch ended before it could be killed"
        time.sleep(0.05)
    grader.kill()  # SIGKILL: no clean-up in the grader; its workers, zygote and kernels die with it
    grader.wait()
    graded_before = {p.stem for p in records.iterdir()}
    assert 0 < len(graded_before) < 3
    time.sleep(1)
    assert _processes_in(course.root) == []

    output = gptcourse_autograde(course).stdout
    assert f"up to date {len(graded_before)}" in output
    assert "failed or not graded 0" in output
    counts = rows(course)
    assert counts["submissions"] == counts["students"] == 3
    assert counts["grades"] == 3 * counts["distinct grades"]
    assert course.scores(LAB) == stock.scores(LAB)


# The kernels: forked from the zygote, they must behave like the stock kernel and stay apart from each other.

PROBE = """
import builtins, os, sys, torch
print(sys.path, os.getcwd(), os.environ.get("PROBE_VARIABLE"), torch.get_num_threads())
print(hasattr(builtins, "leaked"), torch.allclose(torch.zeros(1), torch.ones(1)))
builtins.leaked = True
torch.allclose = lambda *args, **kwargs: True
x = torch.randn(512, 512)
print(bool(torch.isfinite(x @ x).all()))
"""


def run_notebook(cells: list[str], execute_class: type, folder: Path, **options) -> list[str]:
    """Each cell's text output (error name for an error), run by `execute_class` with cwd `folder`."""
    nb = new_notebook(cells=[new_code_cell(source) for source in cells],
                      metadata={"kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}})
    execute_class(**options).preprocess(nb, {"metadata": {"path": str(folder)}})
    return ["".join(out.get("text", out.get("ename", "")) for out in cell.outputs) for cell in nb.cells]


@pytest.fixture(scope="module")
def zygote():
    with Zygote() as running:
        client = ZygoteClient(running.socket_path)
        yield client
        client.close()


def test_forked_kernel_sees_what_a_stock_kernel_sees_and_nothing_of_another(zygote, tmp_path, monkeypatch):
    from nbgrader.preprocessors import Execute

    monkeypatch.setenv("PROBE_VARIABLE", "set after the zygote started")
    stock = run_notebook([PROBE], Execute, tmp_path)
    forked = [run_notebook([PROBE], with_zygote(Execute, zygote), tmp_path) for _ in range(2)]
    assert forked[0] == forked[1] == stock  # the second fork does not see the first one's patches
    assert "set after the zygote started" in stock[0] and str(tmp_path) in stock[0]
    assert stock[0].splitlines()[1] == "False False" and stock[0].splitlines()[2] == "True"


def test_forked_kernel_is_a_child_of_the_zygote_not_of_the_grader(zygote, tmp_path):
    from nbgrader.preprocessors import Execute

    pids = [run_notebook(["import os; print(os.getpid(), os.getppid(), os.getpgid(0))"], with_zygote(Execute, zygote),
                         tmp_path)[0].split() for _ in range(2)]
    assert pids[0][0] != pids[1][0]
    for pid, parent, group in pids:
        assert int(parent) != os.getpid() and pid == group  # forked by the zygote, leads its own process group


def test_batch_kernels_get_their_share_of_the_cores(zygote, tmp_path):
    from nbgrader.preprocessors import Execute

    one_thread = ZygoteClient(zygote.socket_path, kernel_threads=1)
    probe = "import os, torch; print(torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])"
    assert run_notebook([probe], with_zygote(Execute, one_thread), tmp_path) == ["1 1\n"]
    one_thread.close()


def test_a_forked_kernels_first_optimizer_step_and_dispatch_mode_import_nothing(zygote, tmp_path):
    """The zygote preloaded what torch's first AdamW step, and the first operation under a TorchDispatchMode (the
    cases' TensorsMade), import (torch._dynamo): no kernel pays for it again."""
    from nbgrader.preprocessors import Execute

    step = ("import sys, torch\nfrom gptcourse.grading.student import TensorsMade\nbefore = set(sys.modules)\n"
            "p = torch.nn.Parameter(torch.zeros(3))\np.grad = torch.ones(3)\ntorch.optim.AdamW([p]).step()\n"
            "with TensorsMade():\n    torch.ones(2) + 1\n"
            "print(sorted(m for m in set(sys.modules) - before if m.startswith('torch._'))[:5])")
    assert run_notebook([step], with_zygote(Execute, zygote), tmp_path) == ["[]\n"]


def test_timeout_interrupts_the_forked_kernel_which_goes_on(zygote, tmp_path):
    from nbgrader.preprocessors import Execute

    outputs = run_notebook(["x = 41", "while True: pass", "print(x + 1)"], with_zygote(Execute, zygote), tmp_path,
                           timeout=3)
    assert outputs[1].startswith("KeyboardInterrupt") and outputs[2] == "42\n"  # SIGINT reached the kernel


def in_a_loop_of_its_own(coroutine: Coroutine) -> Any:
    """`asyncio.run(coroutine)` in a thread of its own: a test before this one in the same worker (Playwright's
    sync API) may have left an event loop running in this one, where asyncio.run refuses to start."""
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


def test_a_kernel_that_ignores_interrupts_is_killed(zygote, tmp_path):
    from jupyter_client.manager import AsyncKernelManager

    from gptcourse.grading.box.zygote import ReadyKernelClient, zygote_kernel_manager

    async def scenario() -> tuple[int, bool]:
        km = zygote_kernel_manager(AsyncKernelManager, zygote)(kernel_name="python3")
        await km.start_kernel(cwd=str(tmp_path))
        kc = km.client()
        assert isinstance(kc, ReadyKernelClient)  # ready at its kernel_info's idle, not after a quiet 0.2 s
        kc.start_channels()
        await kc.wait_for_ready(timeout=60)
        kc.execute("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True: pass")
        await asyncio.sleep(1)
        await km.interrupt_kernel()
        await asyncio.sleep(1)
        still_running = await km.is_alive()
        pid = km.provisioner.pid
        await km.shutdown_kernel(now=True)
        kc.stop_channels()
        return pid, still_running

    pid, still_running_after_interrupt = in_a_loop_of_its_own(scenario())
    assert still_running_after_interrupt
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


class Channel:
    """A kernel client's channel that hands out `script`'s messages: a message, or `queue.Empty` for a wait that
    timed out (each message's parent a kernel_info request, by its number: 0 the first sent)."""

    def __init__(self, client: object, script: list) -> None:
        self.client, self.script, self.waits = client, script, []

    async def get_msg(self, timeout: float) -> dict:
        import queue

        self.waits.append(timeout)
        if not self.script:
            raise queue.Empty
        kind, request = self.script.pop(0)
        if kind == "timeout":
            raise queue.Empty
        msg_type, state = ("status", kind) if kind in ("busy", "idle") else (kind, None)
        return {"msg_type": msg_type, "content": {"execution_state": state},
                "parent_header": {"msg_id": self.client.sent[request]}}


def ready_client(shell: list, iopub: list, alive: bool = True):
    """A `ReadyKernelClient` whose channels play `shell` and `iopub` (see `Channel`)."""
    from gptcourse.grading.box.zygote import ReadyKernelClient

    class Scripted(ReadyKernelClient):
        def __init__(self) -> None:
            super().__init__()
            self.sent: list[str] = []
            self.scripted_shell, self.scripted_iopub = Channel(self, shell), Channel(self, iopub)

        shell_channel = property(lambda self: self.scripted_shell)
        iopub_channel = property(lambda self: self.scripted_iopub)

        def kernel_info(self) -> str:
            self.sent.append(f"request-{len(self.sent)}")
            return self.sent[-1]

        async def is_alive(self) -> bool:
            return alive

    return Scripted()


def test_a_kernel_is_ready_at_the_idle_of_its_kernel_info_sent_again_until_iopub_carries_it():
    """IOPub's first idle is lost (the subscription was not made yet: ZeroMQ drops it), so the client asks again,
    allowing twice the wait; the idle that answers the second request ends the wait at once (jupyter_client waits
    0.2 s more for a quiet IOPub); an earlier request's reply or status is skipped, not taken for this one's."""
    client = ready_client(shell=[("kernel_info_reply", 0), ("kernel_info_reply", 0), ("kernel_info_reply", 1)],
                          iopub=[("timeout", None), ("idle", 0), ("busy", 1), ("idle", 1), ("busy", 0)])
    in_a_loop_of_its_own(client.wait_for_ready(timeout=5))
    assert client.sent == ["request-0", "request-1"]
    assert client.iopub_channel.waits == [0.01, 0.02, 0.02, 0.02] and client.iopub_channel.script == [("busy", 0)]


def test_the_ready_clients_sockets_retry_a_connection_every_10_ms():
    """A client connects as its kernel is forked, before the kernel has bound its sockets: ZeroMQ's first try fails
    and, by default, the next comes 100 ms later."""
    import zmq

    from gptcourse.grading.box.zygote import ReadyKernelClient

    def reconnect_interval(context: zmq.Context) -> int:
        with context.socket(zmq.DEALER) as socket:
            return socket.getsockopt(zmq.RECONNECT_IVL)

    client = ReadyKernelClient()
    with zmq.Context() as plain:
        assert reconnect_interval(client.context) == 10 and reconnect_interval(plain) == 100  # ZeroMQ's default
    client.context.term()


def test_a_kernel_that_dies_before_it_answers_fails_at_once_and_one_that_never_answers_times_out():
    with pytest.raises(RuntimeError, match="Kernel died before replying to kernel_info"):
        in_a_loop_of_its_own(ready_client(shell=[], iopub=[], alive=False).wait_for_ready(timeout=60))
    silent = ready_client(shell=[("kernel_info_reply", 0), ("kernel_info_reply", 1)], iopub=[])
    with pytest.raises(RuntimeError, match=r"Kernel didn't respond in 0\.5 seconds"):
        in_a_loop_of_its_own(silent.wait_for_ready(timeout=0.5))


def test_fork_safety_check_refuses_a_started_thread_pool():
    script = ("import torch\nfrom gptcourse.grading.box.zygote import check_fork_safe, thread_count\n"
              "baseline = thread_count()\ncheck_fork_safe(baseline)\n"
              "torch.ones(1 << 22).exp_()\ncheck_fork_safe(baseline)\n")  # an ATen parallel op starts the OpenMP pool
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"})  # (conftest sets 1)
    assert proc.returncode != 0 and "forking kernels from it would be unsafe" in proc.stderr
    check_fork_safe(thread_count())
    with pytest.raises(ZygoteError):
        check_fork_safe(thread_count() - 1)


def test_dead_zygote_fails_over_to_an_ordinary_kernel(tmp_path):
    from nbgrader.preprocessors import Execute

    with Zygote() as running:
        client = ZygoteClient(running.socket_path)
    # the zygote is gone: the kernel starts the ordinary way, as a child of this process
    outputs = run_notebook(["import os; print(os.getppid())"], with_zygote(Execute, client), tmp_path)
    assert outputs[0].strip() == str(os.getpid())
