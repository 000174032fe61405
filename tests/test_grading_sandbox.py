"""The sandbox around graded kernels: every attack of issues 13 and 49 (IPC objects and keys left for the next
kernel) as cells added to an otherwise correct submission of lab 02, graded in ONE batch by plain `nbgrader
autograde` and in one by `gptcourse autograde` (one worker); in both, every submission runs in the same box after
the one before it, and each gets the full 15 points; nothing escapes: the course files and the package are
unchanged, no process is left, the secret is in no output, no IPC object or key reaches the next submission.
Also: grading refuses to start without the sandbox, and the opt-out grades anyway.
"""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbgrader_course import Course, sandbox_problem

import gptcourse
from gptcourse.grading.payload import MIME

LAB = "02_causal_attention"
SECRET = "sandbox-test-secret-5d1f0c"
MARKER = "gptcourse-sandbox-escaped"  # in every file an attack tries to write, and in its leftover processes
PACKAGE = Path(gptcourse.__file__).parent
pytestmark = [pytest.mark.slow, pytest.mark.skipif(sandbox_problem() is not None,
                                                  reason=f"the sandbox cannot start here: {sandbox_problem()}")]
# What JupyterHub's spawner puts in an instructor's server, and other credentials a grader's environment holds:
# no kernel may see any of them (the box keeps variables by exact name).
GRADER_CREDENTIALS = {"JPY_API_TOKEN": "gptcourse-cred-hub-1", "JUPYTERHUB_API_TOKEN": "gptcourse-cred-hub-2",
                      "JUPYTERHUB_USER": "gptcourse-cred-user", "PGPASSWORD": "gptcourse-cred-db",
                      "SOME_SERVICE_TOKEN": "gptcourse-cred-token", "SOME_SECRET": "gptcourse-cred-secret"}
# Small limits, so that hitting them is quick (an instructor sets them the same way, in nbgrader_config.py).
LIMITS = "\nc.Sandbox.memory_gb = 2.0\nc.Sandbox.file_size_mb = 20\nc.Sandbox.scratch_mb = 64\n"

TAMPER_COURSE = '''
import os
targets = {@COURSE@, os.environ.get("PWD", "")}
for pid in os.listdir("/proc"):
    for link in ("cwd", "root"):
        try:
            targets.add(os.readlink(f"/proc/{pid}/{link}"))
        except OSError:
            pass
for target in targets - {"", "/", "/scratch"}:
    for name in ("nbgrader_config.py", "grading/gradebook.db", "grading/submitted/solution/@LAB@/@LAB@.ipynb",
                 "grading/@MARKER@.txt"):
        try:
            with open(os.path.join(target, name), "a") as f:
                f.write("@MARKER@")
        except OSError:
            pass
'''
TAMPER_PACKAGE = '''
import os, sys, gptcourse
package = os.path.dirname(gptcourse.__file__)
for path in (os.path.join(package, "grading", "judge.py"), os.path.join(package, "@MARKER@.py"),
             *(os.path.join(folder, "@MARKER@.pth") for folder in sys.path if folder)):
    try:
        with open(path, "a") as f:
            f.write("# @MARKER@")
    except OSError:
        pass
'''
STEAL_SECRET = '''
import glob, os
found = []
for path in [@COURSE@ + "/grading/secret.txt", *glob.glob("/proc/*/environ")]:
    try:
        found.append(open(path, "rb").read()[:4000])
    except OSError:
        pass
print(found, dict(os.environ))
'''
LEFTOVER_LOOP = '''
import time
for i in range(600):  # a minute
    for path in (@COURSE@ + "/grading/@MARKER@-left.txt", f"/scratch/@MARKER@-left-{i}"):
        try:
            open(path, "a").write("x")
        except OSError:
            pass
    time.sleep(0.1)
'''
LEAVE_PROCESSES = '''
import os, subprocess, sys
subprocess.Popen([sys.executable, "-c", @LOOP@], start_new_session=True, stdin=subprocess.DEVNULL,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
if os.fork() == 0:  # a double fork: the grandchild belongs to no kernel
    if os.fork() == 0:
        os.setsid()
        os.execv(sys.executable, [sys.executable, "-c", @LOOP@])
    os._exit(0)
os.wait()
'''
FORK_BOMB = '''
import subprocess
children = [subprocess.Popen(["sleep", "120"]) for _ in range(2000)]
'''
EAT_MEMORY = "blob = bytearray(8 * 10**9)"
HUGE_FILE = '''
with open("huge.bin", "wb") as f:
    for _ in range(40):
        f.write(bytes(10**6))
'''
FILL_SCRATCH = '''
for i in range(20):
    with open(f"fill{i}.bin", "wb") as f:
        f.write(bytes(8 * 10**6))
'''
CONNECT = '''
import socket
try:
    socket.create_connection(("127.0.0.1", @PORT@), timeout=3).sendall(b"@MARKER@")
except OSError as err:
    print("no network:", type(err).__name__)
'''
# Issue 49: messages forged through the kernel's own session and socket, as ipykernel sends a display. Each must
# cost only its cell (a line in the report), never the submission.
FORGE = '''
pub = get_ipython().display_pub
def forge(msg_type, **content):
    pub.session.send(pub.pub_socket, msg_type, content, parent=pub.parent_header, ident=pub.topic)
'''
FORGED = {
    "forge-execution-count": 'forge("execute_result", data={"text/plain": "1"}, metadata={}, execution_count="one")',
    "forge-html-not-text": 'forge("display_data", data={"text/html": {"not": "text"}}, metadata={})',
    "forge-data-list": 'forge("display_data", data=["@MIME@"], metadata={})',
    "forge-unknown-type": 'forge("made_up_output", data={"text/plain": "?"}, metadata={})',
    "forge-huge-update": 'forge("display_data", data={"text/plain": ""}, metadata={}, transient={"display_id": "d"})\n'
                         'for _ in range(30):\n    forge("update_display_data", data={"text/plain": "x" * 10**6}, '
                         'metadata={}, transient={"display_id": "d"})',
    # a payload for another case, in a cell of its own: no test reads it
    "forge-payload": 'forge("display_data", data={"@MIME@": {"format": 1, "test_id": "02.causal_mask.hidden_single", '
                     '"seed": 0, "outputs": {"mask": {"value": 1}}, "error": None, "reference": None}, '
                     '"text/plain": ""}, metadata={})',
}
# ... and one in every test cell, after its checks ran (the only attack here that costs points: all of them)
FORGE_IN_TESTS = '''
def _forge_in_tests(result):
    if result.info.raw_cell.startswith("check("):
        forge("display_data", data=[], metadata={})
get_ipython().events.register("post_run_cell", _forge_in_tests)
'''
# ... and a hook that sees every cell as it runs and prints all it saw in each later cell (the solution cells after
# a hidden test among them): it may print only handles (issue 49)
HIDDEN_HOOK = '''
_seen = []
def _show_seen(info):
    _seen.append(info.raw_cell)
    print(_seen, list(get_ipython().history_manager.get_range(raw=True)))
get_ipython().events.register("pre_run_cell", _show_seen)
'''
HIDDEN_ID = re.compile(r"\b02\.[A-Za-z_]+\.hidden[a-z_]*")

# IPC that outlives the kernel that made it (issue 49): SysV shared memory (detached, never removed), a message
# queue and a semaphore set, POSIX shared memory (/dev/shm) and a POSIX message queue, and a key in each keyring
# a process can reach. `ipc-leave` makes them all; `ipc-look`, graded next in the same box, looks for them.
IPC_COMMON = '''
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.syscall.restype = ctypes.c_long
KEY, NAME = 0x5eed49, "@MARKER@"
ADD_KEY, KEYCTL = {"x86_64": (248, 250), "aarch64": (217, 219)}[platform.machine()]
RINGS = {"session": -3, "user": -4, "user-session": -5}
class Message(ctypes.Structure):
    _fields_ = [("mtype", ctypes.c_long), ("mtext", ctypes.c_char * 64)]
'''
IPC_LEAVE = IPC_COMMON + '''
from multiprocessing import resource_tracker, shared_memory
made = []
segment = libc.shmget(KEY, 1 << 20, 0o1666)  # IPC_CREAT | 0666
if segment >= 0:
    address = libc.shmat(segment, None, 0)
    ctypes.memmove(address, NAME.encode(), len(NAME))
    made.append("sysv-shm") if libc.shmdt(ctypes.c_void_p(address)) == 0 else None
queue = libc.msgget(KEY, 0o1666)
if queue >= 0 and libc.msgsnd(queue, ctypes.byref(Message(1, NAME.encode())), 64, 0) == 0:
    made.append("sysv-msg")
made += ["sysv-sem"] if libc.semget(KEY, 1, 0o1666) >= 0 else []
posix = shared_memory.SharedMemory(name=NAME, create=True, size=4096)
posix.buf[:len(NAME)] = NAME.encode()
resource_tracker.unregister(posix._name, "shared_memory")  # so that nothing removes it at exit
made.append("posix-shm")
with open(f"/dev/shm/{NAME}-file", "w") as f:
    f.write(NAME)
made += ["posix-mq"] if libc.mq_open(f"/{NAME}".encode(), os.O_CREAT | os.O_RDWR, 0o666, None) >= 0 else []
for ring, ring_id in RINGS.items():
    if libc.syscall(ADD_KEY, b"user", f"{NAME}-{ring}".encode(), NAME.encode(), len(NAME), ring_id) > 0:
        made.append(f"key-{ring}")
persistent = libc.syscall(KEYCTL, 22, -1, RINGS["session"])  # KEYCTL_GET_PERSISTENT, linked into the session's
if persistent > 0 and libc.syscall(ADD_KEY, b"user", f"{NAME}-persistent".encode(), b"x", 1, persistent) > 0:
    made.append("key-persistent")
print("IPC MADE:", made)
'''
IPC_LOOK = IPC_COMMON + '''
found = []
for kind, get in (("sysv-shm", lambda: libc.shmget(KEY, 0, 0)), ("sysv-msg", lambda: libc.msgget(KEY, 0)),
                  ("sysv-sem", lambda: libc.semget(KEY, 0, 0)),
                  ("posix-mq", lambda: libc.mq_open(f"/{NAME}".encode(), os.O_RDONLY))):
    found += [kind] if get() >= 0 else []
for table in ("shm", "msg", "sem"):  # any object at all, whatever its key
    found += [f"/proc/sysvipc/{table}"] if len(open(f"/proc/sysvipc/{table}").read().splitlines()) > 1 else []
found += [f"/dev/shm/{name}" for name in os.listdir("/dev/shm")]
for ring, ring_id in RINGS.items():
    for name in (*RINGS, "persistent"):
        if libc.syscall(KEYCTL, 10, ring_id, b"user", f"{NAME}-{name}".encode(), 0) > 0:  # KEYCTL_SEARCH
            found.append(f"key-{name} in the {ring} keyring")
found += ["/proc/keys"] if NAME in open("/proc/keys").read() else []
print("IPC FOUND:", found)
'''
IN_SUBPROCESS = '''
import subprocess, sys
print(subprocess.run([sys.executable, "-c", @CODE@], text=True, stdout=subprocess.PIPE,
                     stderr=subprocess.STDOUT).stdout)
'''  # a kernel's subprocess shares its namespaces (ctypes in the kernel itself would cost the lab's points)
IPC_KINDS = ["sysv-shm", "sysv-msg", "sysv-sem", "posix-shm", "posix-mq", "key-session", "key-user",
             "key-user-session", "key-persistent"]


def attacks(course: Course, port: int) -> dict[str, list[str]]:
    """student -> the cells added after the setup cell."""

    def cell(source: str) -> str:
        fill = {"@COURSE@": repr(str(course.root)), "@LAB@": LAB, "@MARKER@": MARKER, "@PORT@": str(port),
                "@MIME@": MIME}
        for token, value in fill.items():
            source = source.replace(token, value)
        return source.replace("@LOOP@", repr(cell(LEFTOVER_LOOP))) if "@LOOP@" in source else source

    def in_subprocess(code: str) -> str:
        return IN_SUBPROCESS.replace("@CODE@", repr(code))

    return {"tamper-course": [cell(TAMPER_COURSE)], "tamper-package": [cell(TAMPER_PACKAGE)],
            "steal-secret": [cell(STEAL_SECRET)], "leave-processes": [cell(LEAVE_PROCESSES)],
            "fork-bomb": [FORK_BOMB], "eat-memory": [EAT_MEMORY], "fill-disk": [HUGE_FILE, FILL_SCRATCH],
            "open-network": [cell(CONNECT)], "ipc-leave": [in_subprocess(cell(IPC_LEAVE))],
            "ipc-look": [in_subprocess(cell(IPC_LOOK))],
            **{student: [FORGE + cell(source)] for student, source in FORGED.items()},
            "forge-in-tests": [FORGE + FORGE_IN_TESTS], "hidden-hook": [HIDDEN_HOOK]}


FAILING = {"forge-in-tests": {"test_causal_mask", "test_causal_mask_hidden", "test_attention", "test_attention_causal",
                              "test_attention_hidden", "test_AttentionHead", "test_AttentionHead_hidden"}}


# What the report says about the attacks that hit a limit (cell 3 is the first added cell).
REPORTED = {
    "fork-bomb": [r"kernel hit the process limit \(limit 256 processes and threads\) in cell 3 \(added by you\); tests "
                  r"before it still count"],
    "eat-memory": [r"kernel ran out of memory \(limit 2 GB for the kernel and every process it starts\) in cell 3 "
                   r"\(added by you\); tests before it still count"],
    "fill-disk": [r"a file grew past the file-size limit \(limit 20 MB\) in cell 3 \(added by you\)",
                  r"the kernel filled its scratch space \(limit 64 MB\) in cell 4 \(added by you\)"],
    "forge-execution-count": [r"^- cell 3 \(added by you\): the kernel sent a 'execute_result' message whose "
                              r"execution_count is str, which nbformat does not allow: dropped, and the cell counts as "
                              r"failed$"],
    "forge-html-not-text": [r"^- cell 3 \(added by you\): the kernel sent a 'display_data' message whose text/html is "
                            r"dict"],
    "forge-data-list": [r"^- cell 3 \(added by you\): the kernel sent a 'display_data' message whose data is list"],
    "forge-unknown-type": [r"^- cell 3 \(added by you\): the kernel sent a message of unknown type 'made_up_output'"],
    "forge-huge-update": [r"^- cell 3 \(added by you\) printed more than 2,000,000 bytes: the rest was dropped$"],
    "forge-in-tests": [rf"^- cell {i} \('{test}'\): the kernel sent a 'display_data' message whose data is list"
                       for i, test in ((6, "test_causal_mask"), (7, "test_causal_mask_hidden"), (10, "test_attention"),
                                       (11, "test_attention_causal"), (12, "test_attention_hidden"),
                                       (15, "test_AttentionHead"), (16, "test_AttentionHead_hidden"))],
}


def tree_hashes(folder: Path, skip: tuple[str, ...] = ()) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not str(p.relative_to(folder)).startswith(skip)}


GRADER_OUTPUT = ("grading/autograded", "grading/feedback", "grading/reports", "grading/gradebook.db")


def marked_processes() -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if proc.name.isdigit() and MARKER.encode() in cmdline and int(proc.name) != os.getpid():
            found.append(f"{proc.name}: {cmdline[:100]!r}")
    return found


def make_course(root: Path, listener: socket.socket) -> tuple[Course, dict[str, list[str]]]:
    course = Course(root)
    with open(course.root / "nbgrader_config.py", "a") as config:
        config.write(LIMITS)
    (course.root / "grading").mkdir(exist_ok=True)
    (course.root / "grading" / "secret.txt").write_text(SECRET + "\n")
    course.nbgrader("generate_assignment", LAB, "--force")
    added = attacks(course, listener.getsockname()[1])
    course.submit("solution", LAB, course.solved(LAB))
    for student, cells in added.items():
        nb = course.solved(LAB)
        at = next(i for i, c in enumerate(nb.cells) if c.metadata.nbgrader.get("grade_id") == "setup") + 1
        nb.cells[at:at] = [nbformat.v4.new_code_cell(source) for source in cells]
        course.submit(student, LAB, nb)
    return course, added


@pytest.fixture(scope="module")
def listener():
    """A TCP server on loopback that no kernel may reach."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.setblocking(False)
    yield server
    server.close()


@pytest.fixture(scope="module", params=["nbgrader", "gptcourse"])
def graded(request, tmp_path_factory, listener):
    """(course, attacks, grader output, course files before grading, package files before grading)."""
    course, added = make_course(tmp_path_factory.mktemp(request.param), listener)
    before, package = tree_hashes(course.root, GRADER_OUTPUT), tree_hashes(PACKAGE, ("__pycache__",))
    env = {**os.environ, **GRADER_CREDENTIALS}  # an instructor grading in a JupyterHub terminal
    if request.param == "nbgrader":
        output = course.nbgrader("autograde", LAB, "--Execute.timeout=60", env=env).stdout
    else:
        proc = subprocess.run([sys.executable, "-m", "gptcourse.cli", "autograde", LAB, "--workers", "1"],
                              cwd=course.root, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=900, env=env)
        assert proc.returncode == 0, proc.stdout[-4000:]
        log = course.root / "grading" / "autograded" / ".gptcourse-batch" / f"{LAB}.log"
        output = proc.stdout + log.read_text(errors="replace")
    return course, added, output, before, package


def test_every_attack_gets_the_full_score(graded):
    course, added, _, _, _ = graded
    scores = course.scores(LAB)
    assert scores == {student: course.expected_scores(LAB, FAILING.get(student, set()))
                      for student in ["solution", *added]}


def test_one_box_serves_every_submission_in_turn(graded):
    """The box's zygote imports torch once per grading command, not once per submission (the leftovers of one
    submission reaching the next are what `test_limits_hit_are_reported` and `leave-processes` look for)."""
    _, added, output, _, _ = graded
    assert len(added) >= 8
    assert output.count("ready on its box connection") == 1, output[-4000:]


def test_limits_hit_are_reported(graded):
    course, added, _, _, _ = graded
    for student in ["solution", *added]:
        report = (course.root / "grading" / "reports" / LAB / f"{student}.txt").read_text()
        for pattern in REPORTED.get(student, []):
            assert re.search(pattern, report, re.MULTILINE), (student, pattern, report)
        if student not in REPORTED and student != "leave-processes":
            assert "\n- " not in report, (student, report)  # nothing else happened
        if student != "leave-processes":
            assert "left" not in report, report  # no leftover reached a later submission's scratch folder


def test_nothing_escaped_into_the_course_or_the_package(graded):
    course, _, _, before, package = graded
    assert tree_hashes(course.root, GRADER_OUTPUT) == before
    assert MARKER.encode() not in (course.root / "grading" / "gradebook.db").read_bytes()
    assert tree_hashes(PACKAGE, ("__pycache__",)) == package
    assert not [p for folder in sys.path if folder and os.path.isdir(folder)
                for p in Path(folder).glob(f"{MARKER}*")]


def test_no_process_outlives_grading(graded):
    assert marked_processes() == []


def test_the_secret_is_in_no_output(graded):
    course, _, output, _, _ = graded
    assert SECRET not in output
    printed = (course.root / "grading" / "autograded" / "steal-secret" / LAB / f"{LAB}.ipynb").read_text()
    assert "GPTCOURSE_CASE_INPUTS" in printed  # the cell did run and print what it found
    assert not [name for name, value in GRADER_CREDENTIALS.items() if value in printed or name in printed]
    for path in (course.root / "grading").rglob("*"):
        if path.is_file() and path.name != "secret.txt":
            assert SECRET.encode() not in path.read_bytes(), path


def test_no_kernel_printed_a_hidden_case(graded):
    course, added, _, _, _ = graded
    for student in ["solution", *added]:
        if HIDDEN_ID.search("".join(added.get(student, []))):
            continue  # an attack that writes a hidden id itself (forge-payload)
        nb = course.notebook(f"grading/autograded/{student}", LAB)
        printed = json.dumps([cell.outputs for cell in nb.cells
                              if cell.cell_type == "code" and not cell.metadata.get("nbgrader", {}).get("grade")])
        assert student != "hidden-hook" or "check('hidden-" in printed, printed[:2000]  # it saw the handles
        assert not HIDDEN_ID.search(printed), (student, HIDDEN_ID.search(printed))


def test_no_kernel_reached_the_network(graded, listener):
    course, _, _, _, _ = graded
    with pytest.raises(BlockingIOError):
        listener.accept()
    printed = (course.root / "grading" / "autograded" / "open-network" / LAB / f"{LAB}.ipynb").read_text()
    assert "no network: ConnectionRefusedError" in printed


def test_no_ipc_object_or_key_reaches_the_next_submission(graded):
    """`ipc-leave` made every kind of IPC object and key (so the look below means something); `ipc-look`, graded
    after it in the same box, finds none of them, nor any other."""
    course, _, _, _, _ = graded

    def printed(student: str, prefix: str) -> str:
        text = "".join(output.get("text", "") for cell in course.notebook(f"grading/autograded/{student}", LAB).cells
                       for output in cell.get("outputs", []))
        return next(line for line in text.splitlines() if line.startswith(prefix))

    assert printed("ipc-leave", "IPC MADE:") == f"IPC MADE: {IPC_KINDS}"
    assert printed("ipc-look", "IPC FOUND:") == "IPC FOUND: []"


def test_kernels_talk_over_ipc_with_no_tcp_or_debugger_warning(graded):
    _, _, output, _, _ = graded
    assert "without encryption" not in output
    assert "Debugger warning" not in output  # ipykernel's, about frozen modules, once per kernel


# Refusing to grade unsafely.

def without_bwrap() -> dict[str, str]:
    return {**os.environ, "PATH": "/nonexistent"}


def test_grading_refuses_to_start_without_the_sandbox(tmp_path):
    course = Course(tmp_path / "course")
    course.nbgrader("generate_assignment", LAB, "--force")
    for student in ("first", "second"):
        course.submit(student, LAB, course.solved(LAB))
    run = course.nbgrader("autograde", LAB, ok=False, env=without_bwrap())
    batch = subprocess.run([sys.executable, "-m", "gptcourse.cli", "autograde", LAB], cwd=course.root, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300, env=without_bwrap())
    for proc in (run, batch):
        assert proc.returncode != 0
        assert "autograde stopped before grading anyone" in proc.stdout and "no `bwrap` executable" in proc.stdout
        assert "apt-get install bubblewrap" in proc.stdout and "c.Sandbox.allow_unsandboxed" in proc.stdout
    assert course.scores(LAB) == {}
    assert not (course.root / "grading" / "autograded" / "first").exists()
    # a student's Validate needs no sandbox
    path = course.root / "validate" / f"{LAB}.ipynb"
    path.parent.mkdir()
    nbformat.write(course.solved(LAB), path)
    validated = course.nbgrader("validate", str(path), ok=False, env=without_bwrap())
    assert "Success! Your notebook passes all the tests." in validated.stdout


def test_the_opt_out_grades_without_the_sandbox(tmp_path):
    course = Course(tmp_path / "course")
    with open(course.root / "nbgrader_config.py", "a") as config:
        config.write("\nc.Sandbox.allow_unsandboxed = True\n")
    course.nbgrader("generate_assignment", LAB, "--force")
    course.submit("student", LAB, course.solved(LAB))
    run = course.nbgrader("autograde", LAB, env=without_bwrap())
    assert "grading WITHOUT the sandbox" in run.stdout
    assert course.scores(LAB) == {"student": course.expected_scores(LAB)}


# Run as an ordinary account: a box (bwrap making the user namespaces itself) and, in turn, the kernels whose cells
# are argv's JSON list, each cell in a kernel of its own, the box reset between two as between two submissions.
ORDINARY_KERNEL = '''
import ctypes, json, os, sys
from jupyter_client import BlockingKernelClient
from jupyter_client.connect import write_connection_file
from gptcourse.grading.box.sandbox import Sandbox

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SESSION_KEYRING = 'libc.syscall({"x86_64": 250, "aarch64": 219}[os.uname().machine], 0, -3, 0)'  # KEYCTL_GET_KEYRING_ID
print("grader ipc", os.readlink("/proc/self/ns/ipc"), "keyring", eval(SESSION_KEYRING))
box = Sandbox().start_box([], log=sys.stderr.buffer)
try:  # the kernel's sockets in the folder the box shares, as the grader's (no TCP: the box has its own network)
    for n, code in enumerate(json.loads(sys.argv[1])):
        connection, _ = write_connection_file(os.path.join(box.ipc_dir, f"kernel{n}.json"), transport="ipc",
                                              ip=os.path.join(box.ipc_dir, f"kernel{n}"))
        kernel = box.client.spawn(["-f", connection], cwd=box.scratch, env={})
        client = BlockingKernelClient(connection_file=connection)
        client.load_connection_file()
        client.start_channels()
        client.wait_for_ready(timeout=60)  # where the Hub's autograde failed: "Kernel died before replying"
        printed = []
        reply = client.execute_interactive(
            "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long\\n"
            f"print('kernel uid', os.getuid(), 'ipc', os.readlink('/proc/self/ns/ipc'), 'keyring', {SESSION_KEYRING})"
            f"\\n{code}", timeout=60, output_hook=lambda msg: printed.append(msg["content"].get("text", "")))
        print(f"kernel {n} status", reply["content"]["status"], *printed)
        client.stop_channels()
        kernel.kill()
        kernel.wait(10)
        box.reset()
finally:
    box.close()
'''


@pytest.mark.skipif(not sys.platform.startswith("linux") or os.geteuid() != 0 or shutil.which("runuser") is None,
                    reason="needs root on Linux to run the grader as another, ordinary account")
def test_a_kernel_starts_in_the_box_of_an_ordinary_user(tmp_path_factory):
    """An instructor's server on JupyterHub grades as that instructor's ordinary account, where bwrap makes the
    box's user namespace and each kernel maps its own in `confine._own_namespaces`; every other test grades as
    root. Here `nobody` starts a box, and in it a kernel that must answer, run a cell and leave every kind of IPC
    object and key it can make, then a second kernel, after the box's reset, that must find none. Each kernel is
    in an IPC namespace and session keyring that are not the grader's nor the one before it's; SysV objects, on
    which an ordinary user's kernel can set no bound (and which no watchdog sees), it cannot make at all."""
    from accounts import class_interpreter, readable_by_all

    problem = sandbox_problem()
    if problem is not None:
        pytest.skip(f"the grading sandbox cannot start here: {problem}")
    site = [p for p in sys.path if p.endswith("site-packages")]
    path = [str(PACKAGE.parent), *site]
    if not all(readable_by_all(Path(p)) for p in path):
        pytest.skip(f"the test's packages ({path}) are not readable by every account")
    marker = "gptcourse-ordinary-ipc"
    cells = [IPC_LEAVE.replace("@MARKER@", marker) + 'print("shmget", libc.shmget(KEY + 1, 4096, 0o1600), '
             'os.strerror(ctypes.get_errno()))', IPC_LOOK.replace("@MARKER@", marker)]
    folder = Path(tempfile.mkdtemp(prefix="gptcourse-ordinary-"))  # not under pytest's root-only folder
    try:
        folder.chmod(0o755)
        python = class_interpreter(folder)
        proc = subprocess.run(["runuser", "-u", "nobody", "--", "env", f"PYTHONPATH={os.pathsep.join(path)}",
                               python, "-c", ORDINARY_KERNEL, json.dumps(cells)], cwd=folder, capture_output=True,
                              text=True, timeout=300)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    out = proc.stdout
    assert proc.returncode == 0 and "kernel 0 status ok" in out and "kernel 1 status ok" in out, \
        out[-3000:] + proc.stderr[-3000:]
    grader = re.search(r"grader ipc (\S+) keyring (\d+)", out).groups()
    kernels = re.findall(rf"kernel uid {pwd.getpwnam('nobody').pw_uid} ipc (\S+) keyring (\d+)", out)
    assert len(kernels) == 2 and grader[0] not in {ipc for ipc, _ in kernels}, (grader, kernels)
    assert len({grader[1], *(keyring for _, keyring in kernels)}) == 3, (grader, kernels)
    assert f"IPC MADE: {[kind for kind in IPC_KINDS if not kind.startswith('sysv')]}" in out, out
    assert "shmget -1 Operation not permitted" in out, out
    assert "IPC FOUND: []" in out, out
