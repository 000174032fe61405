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
  of its own, with a new session keyring (`confine.drop_privileges`): no SysV or POSIX IPC object, keyring key or
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

This module is the grader's half of the box (its command line, its limits, starting, resetting and stopping it);
`confine.py` is the half inside it: what the zygote does to each kernel it forks (`drop_privileges`: limits,
user, capabilities; `map_kernel_user`), the environment a kernel may see, and between two submissions
(`reset_box`); `zygote.py` is only the fork server that calls them.

Refusing to grade unsafely: `require_sandbox` tries a box once per process; if bwrap is missing or user
namespaces are blocked it stops the whole autograde run (`SandboxUnavailable`, a SystemExit) with how to fix it,
unless `c.Sandbox.allow_unsandboxed = True`, which grades as before (kernels as the grader's user) with a warning.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, BinaryIO

from traitlets import Bool, Enum, Float, Int, Unicode
from traitlets.config import LoggingConfigurable

from .confine import BOX_SCRATCH, BOX_TMP, box_environment, empty_folder
from .memory_limit import MODES as MEMORY_MODES
from .memory_limit import BoxMemory, NoMemoryCgroup
from .zygote import ZygoteClient, ZygoteError, stop_process

IPC_BYTES = 4 << 20  # the sockets' folder: a connection file and five sockets per kernel
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MNT_DETACH = 2, 4, 8, 2
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


class Box:
    """A running sandbox: bwrap with the zygote inside, talking over a socket pair (no path a kernel could reach).

    `client`: the `ZygoteClient`; `scratch`: the kernel's working folder (inside); `host_scratch`: the same
    folder seen from the grader; `ipc_dir`: connection files and sockets (same path inside and out); `memory`: its
    memory cgroup, if any (`memory_bound`: see `Sandbox.memory_bound`)."""

    def __init__(self, bwrap: str, limits: Limits, folders: list[str], ids: tuple[int, int] | None,
                 log: BinaryIO | None, memory_bound: str = "auto", views: Mapping[str, str] | None = None) -> None:
        self.limits, self.ids, self.scratch = limits, ids, BOX_SCRATCH
        try:
            self.memory, self._memory_kills = BoxMemory(limits.memory_bytes, memory_bound), 0
        except NoMemoryCgroup as unavailable:
            raise SandboxUnavailable(str(unavailable)) from None
        self.ipc_dir = tempfile.mkdtemp(prefix="gptcourse-ipc-")
        self._mounted = ids is not None and _mount_tmpfs(self.ipc_dir, IPC_BYTES, ids)
        if ids is not None:
            os.chown(self.ipc_dir, *ids)
        ours, theirs = socket.socketpair()
        info_read, info_write = os.pipe()
        box = {"fd": theirs.fileno(), "limits": asdict(limits), "ids": ids, "memory": self.memory.settings}
        argv = [*bwrap_argv(bwrap, folders, self.ipc_dir, limits, ids, views), "--info-fd", str(info_write), "--",
                sys.executable, "-m", "gptcourse.grading.box.zygote", "--box", json.dumps(box)]
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

    return ctypes.CDLL(None, use_errno=True)


def _mount_tmpfs(folder: str, size: int, ids: tuple[int, int]) -> bool:
    """Root: make `folder` a small tmpfs owned by the kernel user, so that the one host folder a kernel may write
    (its sockets' folder) cannot fill the grader's disk. False if the mount fails (the folder stays as it is)."""
    options = f"size={size},mode=0700,uid={ids[0]},gid={ids[1]}".encode()
    return _libc().mount(b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, options) == 0
