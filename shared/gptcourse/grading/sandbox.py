"""The box every graded kernel runs in: bubblewrap (`bwrap`) around the zygote that forks the kernels.

What a kernel sees and may do (`bwrap_argv`):
- a read-only view of only what it needs: /usr and the system library folders, a few files of /etc (the dynamic
  linker's cache, passwd, group), the interpreter and its site-packages (`sys.prefix`, `sys.base_prefix`), the
  folders of `sys.path` outside the course, and the `gptcourse` package folder itself (bound exactly, never the
  course folder an editable install may live in); grading lab NN, a view of the package without that lab's
  references is bound over it (`package_view.py`);
- /scratch, a private size-limited tmpfs that holds only the submission being graded (the grader copies it in
  through `/proc/<box>/root` and empties it afterwards), a private size-limited /tmp (its HOME) and /dev/shm;
- one folder bound read-write at the same path inside and out, holding the kernel's connection file and the Unix
  sockets of Jupyter's `ipc` transport (no TCP port, no unencrypted-TCP warning); as root, a 4 MB tmpfs;
- new pid, network (loopback only), IPC, UTS and mount namespaces, `--die-with-parent`: nothing outlives the box,
  nothing outside it can be seen, signalled, traced or connected to; and each kernel in a user and IPC namespace
  of its own, with a new session keyring (`_own_namespaces`): no SysV or POSIX IPC object, keyring key or
  shared memory of one kernel reaches the next, and what it held is freed when it exits; SysV shared memory, which
  no watchdog sees once detached, is bounded by the namespace's settings as root (`bound_ipc`) and, for an
  ordinary user, who cannot set them, not to be made at all (`deny_sysv_ipc`);
- limits per kernel (`Limits`): memory for the kernel and every process it starts, together (a cgroup per box,
  else a watchdog in the zygote: `memory_limit.py`; the same figure bounds each process's address space with
  setrlimit), processes (threads count; counted per kernel: each is alone in a user namespace), file size; the
  tmpfs sizes bound what it can store (in memory: tmpfs).

Identity: run as root (CI, many graders), bwrap makes the namespaces itself and the zygote keeps only the
capabilities it needs to serve (setuid, kill, file ownership); every kernel it forks drops to the dedicated
unprivileged user `Sandbox.kernel_user` (created with `useradd --system` if missing) with no capabilities left
and no way to regain any (no_new_privs): a real uid that owns nothing outside the box (in a user namespace of
its own that maps only that uid, so that its process limit is its own). Run as an ordinary user,
bwrap makes an unprivileged user namespace and the kernels run as that user, with every capability dropped.

The zygote (`zygote.serve` with a `box`) is the box's main process: it preloads torch once, forks one kernel per
request, and between two submissions graded in the same box `reset` kills every process left in the box's pid
namespace (`kill(-1)`) and empties /scratch, /tmp and /dev/shm. `gptcourse autograde` keeps one box per worker;
`nbgrader autograde` (RobustExecute) one per grading command (`execute.process_box`).

This module is the box's whole policy, outside and in: the end of it is what the zygote does inside the box to
each kernel it forks (`drop_privileges`: limits, user, capabilities; `map_kernel_user`) and between two
submissions (`reset_box`); `zygote.py` is only the fork server that calls them.

Refusing to grade unsafely: `require_sandbox` tries a box once per process; if bwrap is missing or user
namespaces are blocked it stops the whole autograde run (`SandboxUnavailable`, a SystemExit) with how to fix it,
unless `c.Sandbox.allow_unsandboxed = True`, which grades as before (kernels as the grader's user) with a warning.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from traitlets import Bool, Enum, Float, Int, Unicode
from traitlets.config import LoggingConfigurable

from .cases import HIDDEN_SEEDS_ENV
from .kernel_inputs import INPUTS_ENV as CASE_INPUTS_ENV
from .memory_limit import MODES as MEMORY_MODES
from .memory_limit import BoxMemory

BOX_SCRATCH = "/scratch"  # the kernel's working folder inside the box
IPC_BYTES = 4 << 20  # the sockets' folder: a connection file and five sockets per kernel
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 2, 4, 8, 2
BOX_TMP = "/tmp"
SYSTEM_FOLDERS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/passwd", "/etc/group",
             "/etc/nsswitch.conf", "/etc/localtime")
# What the zygote keeps when the grader is root (none of it reaches a kernel): to become the kernel user, to kill
# leftovers and to empty folders the kernels wrote, to drop the bounding set.
ZYGOTE_CAPS = ("CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE", "CAP_FOWNER", "CAP_SETPCAP")
FIX = ("Install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`) and allow user namespaces: on Ubuntu "
       ">= 23.10 `sysctl kernel.apparmor_restrict_unprivileged_userns=0` (or an AppArmor profile for bwrap); in "
       "Docker, run the grading container with `--privileged` (or `--cap-add SYS_ADMIN --security-opt "
       "seccomp=unconfined --security-opt apparmor=unconfined`). Where none of that is possible, grade in a "
       "throw-away VM and set `c.Sandbox.allow_unsandboxed = True` in nbgrader_config.py (the kernels then run "
       "with the grader's powers).")


class SandboxUnavailable(SystemExit):
    """The sandbox cannot start: grading stops before anyone is graded (a SystemExit: nbgrader does not catch it)."""


@dataclass(frozen=True)
class Limits:
    """What one kernel may use; enforced with setrlimit in the kernel and by the box's tmpfs sizes."""

    memory_bytes: int
    processes: int
    file_bytes: int
    scratch_bytes: int
    threads: int  # intra-op threads (0: torch's default)

    def describe(self, kind: str) -> str:
        """"3 GB for the kernel and every process it starts" for kind "memory", "256 MB" for "file", and so on:
        how the report names a limit."""
        value = {"memory": self.memory_bytes, "file": self.file_bytes, "scratch": self.scratch_bytes}.get(kind)
        size = f"{value / 1e9:g} GB" if value is not None and value >= 1e9 else \
            f"{value / 1e6:g} MB" if value is not None else f"{self.processes} processes and threads"
        return f"{size} for the kernel and every process it starts" if kind == "memory" else size


class Sandbox(LoggingConfigurable):
    """The sandbox's settings, as nbgrader-config traits: `c.Sandbox.memory_gb = 4`, ..."""

    allow_unsandboxed = Bool(False, help="Grade without the sandbox where it cannot start (kernels then run as the "
                                         "grader's user, with its powers): only inside a throw-away VM or "
                                         "container").tag(config=True)
    memory_gb = Float(3.0, help="Memory for the kernel and every process it starts, together, in GB (also the "
                                "address space of each)").tag(config=True)
    memory_bound = Enum(MEMORY_MODES, "auto", help="How memory_gb is enforced: 'cgroup' (a memory cgroup per box; "
                                                   "grading stops where none can be made), 'watchdog' (the zygote "
                                                   "sums its processes' resident memory every 0.1 s), 'auto' (a "
                                                   "cgroup where this grader can make one, else the watchdog)"
                        ).tag(config=True)
    max_processes = Int(256, help="Processes and threads per kernel (its own and those it starts)").tag(config=True)
    file_size_mb = Int(256, help="Largest file a kernel may write, in MB").tag(config=True)
    scratch_mb = Int(256, help="Size of each of the kernel's writable folders (/scratch, /tmp, /dev/shm: memory-"
                               "backed), in MB").tag(config=True)
    threads = Int(0, help="Intra-op (torch) threads per kernel; 0: gptcourse autograde's share of the cores, "
                          "torch's default under nbgrader").tag(config=True)
    kernel_user = Unicode("gptcourse-kernel", help="The unprivileged user kernels run as when the grader is root "
                                                   "(created if missing)").tag(config=True)
    bwrap = Unicode("bwrap", help="The bubblewrap executable").tag(config=True)

    def limits(self, threads: int | None = None) -> Limits:
        return Limits(int(self.memory_gb * 1e9), self.max_processes, self.file_size_mb * 1_000_000,
                      self.scratch_mb * 1_000_000, self.threads or threads or 0)

    def start_box(self, forbidden: Iterable[str], log: BinaryIO | None = None, threads: int | None = None,
                  lab: str | None = None) -> Box:
        """A running box (bwrap + zygote) whose kernels see nothing of the `forbidden` folders (the course) and,
        grading `lab`, a view of the package without that lab's references (`package_view.py`)."""
        from .package_view import view_binds

        folders = read_only_folders(forbidden)
        views = view_binds(lab, folders) if lab is not None else {}
        return Box(self.bwrap, self.limits(threads), folders, kernel_ids(self.kernel_user), log, self.memory_bound,
                   views)


def course_folders(config: Any, *more: str) -> list[str]:
    """The folders no kernel may see: the course root (nbgrader's CourseDirectory.root, else the working
    folder) and `more`."""
    root = config.CourseDirectory.get("root") if config is not None and "CourseDirectory" in config else None
    return [str(root or os.getcwd()), *more]


def require_sandbox(config: Any = None, forbidden: Iterable[str] = ()) -> bool:
    """True if kernels must run in the box; raise SandboxUnavailable if it cannot start and the opt-out is unset;
    False (with a warning) if it cannot start and `allow_unsandboxed` is set."""
    sandbox = Sandbox(config=config)
    problem = _probe(sandbox.bwrap, sandbox.kernel_user, tuple(sorted(map(os.path.realpath, forbidden))))
    if problem is None:
        return True
    if sandbox.allow_unsandboxed:
        sandbox.log.warning("grading WITHOUT the sandbox (c.Sandbox.allow_unsandboxed = True): %s", problem)
        return False
    raise SandboxUnavailable(f"autograde stopped before grading anyone: the sandbox that graded notebooks run in "
                             f"cannot start ({problem}).\n{FIX}")


@functools.cache
def _probe(bwrap: str, kernel_user: str, forbidden: tuple[str, ...]) -> str | None:
    """Why a box cannot start here, or None: starts this interpreter in one, as a kernel would be."""
    if not sys.platform.startswith("linux"):
        return "bubblewrap needs Linux"
    if shutil.which(bwrap) is None:
        return f"no `{bwrap}` executable on PATH"
    try:
        ids = kernel_ids(kernel_user)
        argv = bwrap_argv(bwrap, read_only_folders(forbidden), None, Limits(0, 0, 0, 1 << 20, 0), ids)
        proc = subprocess.run([*argv, "--", sys.executable, "-S", "-c", "pass"], capture_output=True, text=True,
                              timeout=60, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        return f"{type(err).__name__}: {err}"
    if proc.returncode != 0:
        return f"`{bwrap}` failed: {proc.stderr.strip() or f'exit status {proc.returncode}'}"
    return None


def kernel_ids(name: str) -> tuple[int, int] | None:
    """(uid, gid) of the kernel user when this process is root (the user is created if missing); None otherwise:
    the kernels then run as this (unprivileged) user."""
    if os.geteuid() != 0:
        return None
    try:
        entry = pwd.getpwnam(name)
    except KeyError:
        useradd = shutil.which("useradd", path=f"{os.environ.get('PATH', '')}:/usr/sbin:/sbin")
        if useradd is None:
            raise SandboxUnavailable(f"the grader runs as root and there is no user {name!r} for its kernels, nor "
                                     f"`useradd` to create one: create an unprivileged user and set "
                                     f"c.Sandbox.kernel_user") from None
        subprocess.run([useradd, "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                        "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
        entry = pwd.getpwnam(name)
    if entry.pw_uid == 0:
        raise SandboxUnavailable(f"c.Sandbox.kernel_user {name!r} is root: kernels must never run as root")
    return entry.pw_uid, entry.pw_gid


def read_only_folders(forbidden: Iterable[str]) -> list[str]:
    """What a kernel needs to read: the interpreter, its libraries and sys.path folders, the gptcourse package;
    nothing that is, holds or lies inside a `forbidden` folder (the course), except the environment and the
    package themselves (a venv or an editable install may live in the course folder)."""
    import gptcourse

    package = os.path.dirname(os.path.realpath(gptcourse.__file__))
    prefixes = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    keep = set(prefixes) | {package, os.path.dirname(os.path.realpath(sys.executable))}
    keep |= {os.path.realpath(p) for p in sys.path if p and os.path.exists(p)}
    blocked = [os.path.realpath(f) for f in forbidden] + [os.path.realpath(os.getcwd())]

    def allowed(path: str) -> bool:
        if any(_inside(b, path) for b in blocked):  # the course itself, or a folder holding it
            return False
        inside_course = any(_inside(path, b) for b in blocked)
        return not inside_course or path == package or any(_inside(path, p) for p in prefixes)

    chosen = sorted(p for p in keep if allowed(p))
    return [p for p in chosen if not any(p != q and _inside(p, q) for q in chosen)]  # outermost only


def _inside(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def bwrap_argv(bwrap: str, folders: list[str], ipc_dir: str | None, limits: Limits,
               ids: tuple[int, int] | None, views: Mapping[str, str] | None = None) -> list[str]:
    """The bwrap command line of a box (without the command); `views`: folder in the box -> the folder bound
    read-only over it (a lab's view of the package), after the `folders` it may lie in."""
    # As root no user namespace (the zygote's setuid to the kernel user must be a real one); otherwise bwrap
    # makes one, as an unprivileged user can only do.
    namespaces = ["--unshare-all"] if ids is None else ["--unshare-ipc", "--unshare-pid", "--unshare-net",
                                                        "--unshare-uts", "--unshare-cgroup-try"]
    argv = [bwrap, *namespaces, "--die-with-parent", "--new-session"]
    for path in SYSTEM_FOLDERS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in ETC_FILES:
        argv += ["--ro-bind-try", path, path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    for path, mode in ((BOX_TMP, "1777"), ("/dev/shm", "1777"), (BOX_SCRATCH, "0777")):
        argv += ["--perms", mode, "--size", str(limits.scratch_bytes), "--tmpfs", path]
    made: set[str] = set()
    for path in folders:
        if not any(_inside(path, system) for system in SYSTEM_FOLDERS):
            parents = [str(p) for p in reversed(Path(path).parents) if str(p) != "/" and str(p) not in made]
            made.update(parents)
            for parent in parents:  # traversable: bwrap would make the folders above a bind 0700
                argv += ["--dir", parent]
            argv += ["--ro-bind", path, path]
    for target, source in (views or {}).items():
        argv += ["--ro-bind", source, target]
    if ipc_dir:
        argv += ["--bind", ipc_dir, ipc_dir]
    argv += ["--chdir", BOX_SCRATCH]
    if ids is not None:  # root: namespaces without a user namespace; the zygote drops to the kernel user per kernel
        argv += ["--cap-drop", "ALL"]
        for cap in ZYGOTE_CAPS:
            argv += ["--cap-add", cap]
    else:
        for cap in ZYGOTE_CAPS[2:]:  # an ordinary user: caps inside the box's user namespace only
            argv += ["--cap-add", cap]
    return argv


def stop_process(process: subprocess.Popen) -> None:
    """Close the stdin of a zygote or box, whose end tells it to stop, and wait for it; kill it after 10 s."""
    if process.stdin and not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class Box:
    """A running sandbox: bwrap with the zygote inside, talking over a socket pair (no path a kernel could reach).

    `client`: the `ZygoteClient`; `scratch`: the kernel's working folder (inside); `host_scratch`: the same
    folder seen from the grader; `ipc_dir`: connection files and sockets (same path inside and out); `memory`: its
    memory cgroup, if any (`memory_bound`: see `Sandbox.memory_bound`)."""

    def __init__(self, bwrap: str, limits: Limits, folders: list[str], ids: tuple[int, int] | None,
                 log: BinaryIO | None, memory_bound: str = "auto", views: Mapping[str, str] | None = None) -> None:
        from .zygote import ZygoteClient

        self.limits, self.ids, self.scratch = limits, ids, BOX_SCRATCH
        self.memory, self._memory_kills = BoxMemory(limits.memory_bytes, memory_bound), 0
        self.ipc_dir = tempfile.mkdtemp(prefix="gptcourse-ipc-")
        self._mounted = ids is not None and _mount_tmpfs(self.ipc_dir, IPC_BYTES, ids)
        if ids is not None:
            os.chown(self.ipc_dir, *ids)
        ours, theirs = socket.socketpair()
        info_read, info_write = os.pipe()
        box = {"fd": theirs.fileno(), "limits": asdict(limits), "ids": ids, "memory": self.memory.settings}
        argv = [*bwrap_argv(bwrap, folders, self.ipc_dir, limits, ids, views), "--info-fd", str(info_write), "--",
                sys.executable, "-m", "gptcourse.grading.zygote", "--box", json.dumps(box)]
        env = box_environment(os.environ)
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=log, stderr=log, env=env,
                                        pass_fds=(theirs.fileno(), info_write, *self.memory.fds),
                                        start_new_session=True)
        self.memory.started()
        theirs.close()
        os.close(info_write)
        with os.fdopen(info_read, "rb") as info:
            started = info.read()
        if not started:
            self.process.wait()
            self.memory.close()
            shutil.rmtree(self.ipc_dir, ignore_errors=True)
            raise SandboxUnavailable(f"the sandbox did not start (bwrap exited {self.process.returncode}; see the "
                                     f"grading log).\n{FIX}")
        self.pid = json.loads(started)["child-pid"]
        self.host_scratch = f"/proc/{self.pid}/root{BOX_SCRATCH}"
        self.client = ZygoteClient(sock=ours, kernel_threads=limits.threads or None)

    def alive(self) -> bool:
        return self.process.poll() is None

    def reset(self) -> None:
        """Kill every process left in the box but the zygote; empty /scratch, /tmp, /dev/shm and the ipc folder."""
        self._memory_kills = self.client.request(op="reset")["memory_kills"]
        empty_folder(self.ipc_dir)

    def memory_limit_hit(self) -> bool:
        """Whether the box's memory limit killed a kernel's processes since the last reset or call."""
        from .zygote import ZygoteError

        try:
            kills = self.client.request(op="memory")["memory_kills"]
        except ZygoteError:
            return False
        hit, self._memory_kills = kills > self._memory_kills, kills
        return hit

    def fill_scratch(self, folder: str) -> None:
        """Copy the submission's files (not its notebooks: the grader runs those) into the empty /scratch."""
        shutil.copytree(folder, self.host_scratch, dirs_exist_ok=True, symlinks=True,
                        ignore=shutil.ignore_patterns("*.ipynb"))
        if self.ids is not None:
            for path in [self.host_scratch, *(str(p) for p in Path(self.host_scratch).rglob("*"))]:
                with contextlib.suppress(OSError):
                    os.chown(path, *self.ids, follow_symlinks=False)

    def scratch_names(self) -> set[str]:
        try:
            return set(os.listdir(self.host_scratch))
        except OSError:
            return set()

    def close(self) -> None:
        """Stop the box (bwrap kills everything in it); safe to call twice."""
        with contextlib.suppress(OSError):
            self.client.close()
        stop_process(self.process)
        self.memory.close()
        if self._mounted:
            _libc().umount2(self.ipc_dir.encode(), _MNT_DETACH)
            self._mounted = False
        shutil.rmtree(self.ipc_dir, ignore_errors=True)

    def __enter__(self) -> Box:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(folder: str, size: int, ids: tuple[int, int]) -> bool:
    """Root: make `folder` a small tmpfs owned by the kernel user, so that the one host folder a kernel may write
    (its sockets' folder) cannot fill the grader's disk. False if the mount fails (the folder stays as it is)."""
    options = f"size={size},mode=0700,uid={ids[0]},gid={ids[1]}".encode()
    return _libc().mount(b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) == 0


def empty_folder(folder: str) -> None:
    """Delete everything in `folder` without following a symbolic link out of it."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


# The grader's variables a kernel may see, by exact name (an allowlist: a token, a password or a secret in the
# grader's environment, such as the JPY_API_TOKEN JupyterHub gives an instructor's server, never reaches a kernel).
KERNEL_VARIABLES = frozenset({
    # how Python starts and finds the package (the folders of sys.path are bound read-only in the box)
    "PYTHONPATH", "PYTHONHASHSEED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE",
    # how torch, OpenMP, MKL and OpenBLAS compute (threads, SIMD level: a portability run sets them)
    "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "MKL_NUM_THREADS", "MKL_ENABLE_INSTRUCTIONS",
    "OPENBLAS_NUM_THREADS", "OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE", "ATEN_CPU_CAPABILITY",
    # locale and time zone
    "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ",
    # what nbgrader tells a notebook, and what the grader hands this kernel
    "NBGRADER_EXECUTION", "NBGRADER_VALIDATING", HIDDEN_SEEDS_ENV, CASE_INPUTS_ENV,
})


def kernel_variables(environ: Mapping[str, str]) -> dict[str, str]:
    """The variables of `environ` that a kernel may see (`KERNEL_VARIABLES`); nothing else."""
    return {name: value for name, value in environ.items() if name in KERNEL_VARIABLES}


def box_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment inside a box: the allowed variables of `environ`, and HOME, PATH and the temporary and
    Jupyter folders inside the box."""
    env = kernel_variables(environ)
    env.update(PATH="/usr/local/bin:/usr/bin:/bin", HOME=BOX_TMP, TMPDIR=BOX_TMP, IPYTHONDIR=f"{BOX_TMP}/.ipython",
               MPLCONFIGDIR=f"{BOX_TMP}/matplotlib", JUPYTER_CONFIG_DIR=f"{BOX_TMP}/.jupyter",
               JUPYTER_DATA_DIR=f"{BOX_TMP}/.local/jupyter", JUPYTER_RUNTIME_DIR=f"{BOX_TMP}/.local/jupyter/runtime",
               # ipykernel's debugger warns on every start about Python 3.11's frozen modules; no one debugs here
               PYDEVD_DISABLE_FILE_VALIDATION="1")
    return env


# ---- inside the box: what the zygote does to each kernel it forks, and between two submissions

_PR_SET_DUMPABLE = 4
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL = 47, 4
_LAST_CAP = 63
_CLONE_NEWUSER, _CLONE_NEWIPC = 0x10000000, 0x08000000
_KEYCTL_JOIN_SESSION_KEYRING = 1
_KEYCTL = {"x86_64": 250, "i686": 288, "aarch64": 219, "riscv64": 219, "loongarch64": 219, "ppc64le": 271,
           "s390x": 280}  # the keyctl syscall's number (no libc wrapper)


def _prctl(*args: int) -> int:
    return ctypes.CDLL(None, use_errno=True).prctl(*args)


def undumpable() -> None:
    """The zygote: no process of the box (a kernel) may trace it or read its memory."""
    _prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0)


def drop_privileges(box: dict[str, Any], handshake: tuple[int, int] | None) -> None:
    """In a box's kernel: its limits, then no capability (bounding, ambient, effective, permitted, inheritable),
    as the kernel user when the zygote is root. Exits the child if any step fails: a kernel never runs with more."""
    import resource

    limits = box["limits"]
    for name, value in (("RLIMIT_AS", limits["memory_bytes"]), ("RLIMIT_NPROC", limits["processes"]),
                        ("RLIMIT_FSIZE", limits["file_bytes"]), ("RLIMIT_CORE", 0)):
        resource.setrlimit(getattr(resource, name), (value, value))
    _own_namespaces(handshake)  # (which gives a full bounding set, dropped next)
    if box.get("ids"):
        bound_ipc(limits["memory_bytes"])
    else:
        deny_sysv_ipc()
    for cap in range(_LAST_CAP + 1):
        _prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0)  # EINVAL past the last cap the kernel knows: ignored
    _prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    if box.get("ids"):
        uid, gid = box["ids"]
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    _new_session_keyring()
    _clear_capabilities()
    status = open("/proc/self/status").read()
    if any(line.split()[1].strip("0") for line in status.splitlines()
           if line.startswith(("CapEff:", "CapPrm:", "CapInh:", "CapAmb:", "CapBnd:"))) or os.geteuid() == 0:
        raise PermissionError("a kernel would have kept privileges")
    _prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)


def _own_namespaces(handshake: tuple[int, int] | None) -> None:
    """Move this kernel into a user and an IPC namespace of its own. The IPC namespace holds the SysV shared
    memory, message queues, semaphores and POSIX message queues the kernel makes: the next kernel in the box
    sees none of them, and they are freed, with the memory they hold, when the kernel's last process exits
    (a segment detached but never removed included). The user namespace owns it, and holds the user keyrings.

    Root in a box (`handshake`): the zygote maps only the kernel user to itself (`map_kernel_user`; only a
    process outside the namespace may). The kernel runs as that real uid all the same, but its processes count
    against its process limit in this namespace alone, so kernels of other boxes running as the same user
    neither share nor starve one limit. An ordinary user's box: the kernel maps its own uid and gid."""
    uid, gid = os.geteuid(), os.getegid()
    if ctypes.CDLL(None, use_errno=True).unshare(_CLONE_NEWUSER | _CLONE_NEWIPC) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER | CLONE_NEWIPC) failed")
    if handshake is None:
        # A fork of the undumpable zygote is undumpable too: its /proc/self files then belong to root, and it
        # could not write its own maps (EACCES). Dumpable, as it ends anyway; from here it is alone in its user
        # namespace, where the box's other kernels (each in its own) hold no capability: none can trace it.
        _prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
        for name, value in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1\n"), ("gid_map", f"{gid} {gid} 1\n")):
            with open(f"/proc/self/{name}", "w") as mapping:
                mapping.write(value)
        return
    ready, mapped = handshake
    os.write(ready, b"u")
    if os.read(mapped, 1) != b"m":
        raise PermissionError("the zygote did not map the kernel user")


def ipc_bounds(memory_bytes: int) -> dict[str, str]:
    """/proc/sys/kernel settings of a kernel's IPC namespace: its SysV shared memory together at most its memory
    limit (the watchdog sees only what is mapped; a memory cgroup counts it too), a few small message queues."""
    return {"shmmax": str(memory_bytes), "shmall": str(memory_bytes // os.sysconf("SC_PAGE_SIZE")),
            "shmmni": "256", "msgmni": "32", "msgmnb": str(64 << 10), "msgmax": str(8 << 10)}


def bound_ipc(memory_bytes: int) -> None:
    """Root in a box, in the kernel's new IPC namespace, before it drops to the kernel user (who may only read
    them): set `ipc_bounds`. An ordinary user's kernel cannot set them (its namespace's settings belong to a root
    its user namespace does not map), so there `deny_sysv_ipc` keeps SysV IPC out of it instead."""
    for name, value in ipc_bounds(memory_bytes).items():
        with open(f"/proc/sys/kernel/{name}", "w") as setting:
            setting.write(value)


# SysV IPC objects an ordinary user's kernel may not make (no bound can be set on them there: `deny_sysv_ipc`):
# per machine, the audit architecture and the numbers of shmget, semget and msgget.
_SYSV_GET = {"x86_64": (0xC000003E, (29, 64, 68)), "aarch64": (0xC00000B7, (194, 190, 186))}
_X32_SYSCALL = 0x40000000  # x86_64's x32 ABI: the same calls under other numbers
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2
_SECCOMP_ALLOW, _SECCOMP_ERRNO = 0x7FFF0000, 0x00050000


def deny_sysv_ipc() -> None:
    """An ordinary user's kernel, where the IPC namespace's bounds cannot be set (`bound_ipc`: its sysctls
    belong to a root that user namespace does not map) and no watchdog sees SysV shared memory that no process
    maps: a seccomp filter makes shmget, semget and msgget fail with EPERM (calls of another ABI too), so no
    kernel holds memory that its limit does not count. POSIX shared memory lives in the box's bounded /dev/shm."""
    machine = os.uname().machine
    if machine not in _SYSV_GET:
        raise OSError(f"no seccomp filter known for {machine}: cannot keep SysV IPC out of the kernel")
    arch, calls = _SYSV_GET[machine]
    deny = _SECCOMP_ERRNO | errno.EPERM

    class Instruction(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8),
                    ("k", ctypes.c_uint32)]

    class Program(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(Instruction))]

    load, equal, at_least, answer = 0x20, 0x15, 0x35, 0x06  # BPF_LD|W|ABS, BPF_JMP|JEQ|K, BPF_JMP|JGE|K, BPF_RET|K
    program = [(load, 0, 0, 4), (equal, 1, 0, arch), (answer, 0, 0, deny),  # seccomp_data.arch: another ABI
               (load, 0, 0, 0), (at_least, len(calls) + 1, 0, _X32_SYSCALL),  # seccomp_data.nr
               *((equal, len(calls) - i, 0, number) for i, number in enumerate(calls)),
               (answer, 0, 0, _SECCOMP_ALLOW), (answer, 0, 0, deny)]
    instructions = (Instruction * len(program))(*(Instruction(*op) for op in program))
    if _prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or ctypes.CDLL(None, use_errno=True).prctl(
            _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(Program(len(program), instructions)), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP) failed")


def _new_session_keyring() -> None:
    """Join a new, empty session keyring: the one inherited from the grader (a login's, holding its keys) is
    out of reach, and nothing a kernel adds to its session keyring reaches the next (its user keyrings are its
    user namespace's). Where keyctl is blocked (a container's seccomp profile), no kernel has keyrings at all."""
    number = _KEYCTL.get(os.uname().machine)
    if number is None:
        raise OSError(f"no keyctl syscall number known for {os.uname().machine}: cannot give the kernel its own "
                      "session keyring")
    syscall = ctypes.CDLL(None, use_errno=True).syscall
    syscall.restype = ctypes.c_long
    if syscall(ctypes.c_long(number), ctypes.c_int(_KEYCTL_JOIN_SESSION_KEYRING), None) < 0 \
            and ctypes.get_errno() not in (errno.ENOSYS, errno.EPERM):
        raise OSError(ctypes.get_errno(), "keyctl(KEYCTL_JOIN_SESSION_KEYRING) failed")


def map_kernel_user(pid: int, ids: tuple[int, int], handshake: tuple[int, int]) -> None:
    """In the zygote: once kernel `pid` is in its own user namespace, map the kernel user's uid and gid there."""
    ready, mapped = handshake
    if os.read(ready, 1) != b"u":
        return  # the child failed before; it exits
    uid, gid = ids
    for name, value in (("uid_map", uid), ("gid_map", gid)):
        with open(f"/proc/{pid}/{name}", "w") as mapping:
            mapping.write(f"{value} {value} 1\n")
    os.write(mapped, b"m")


def _clear_capabilities() -> None:
    """capset(2): empty effective, permitted and inheritable sets of this process."""

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    data = (Data * 2)()
    if ctypes.CDLL(None, use_errno=True).capset(ctypes.byref(Header(0x20080522, 0)), data) != 0:
        raise OSError(ctypes.get_errno(), "capset failed")


def in_box() -> bool:
    """Whether this is a box's zygote (pid 2, under bwrap's pid 1): kill(-1) outside a pid namespace would hit
    everything."""
    return os.getpid() == 2 and os.getppid() == 1


def kill_the_rest() -> None:
    """In a box: SIGKILL every process but this one and init, atomically (a fork bomb included)."""
    if in_box():
        with contextlib.suppress(OSError):
            os.kill(-1, signal.SIGKILL)


def reset_box(children: set[int]) -> dict[str, Any]:
    """In a box: kill every other process in the box's pid namespace and empty its writable folders, so the next
    submission finds nothing of the last one."""
    if not in_box():
        return {"error": "reset outside a box refused"}
    for _ in range(100):
        kill_the_rest()
        for pid in list(children):
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, 0)
            children.discard(pid)
        left = [p for p in os.listdir("/proc") if p.isdigit() and int(p) not in (1, os.getpid())]
        if not left:
            break
        time.sleep(0.01)  # zombies that bwrap's init has not reaped yet
    else:
        return {"error": f"processes left in the box: {left}"}
    for folder in (BOX_SCRATCH, BOX_TMP, "/dev/shm"):
        empty_folder(folder)
    return {"reset": True}
