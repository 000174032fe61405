"""A box's memory, bounded as a whole: a kernel and every process it starts count against one limit.

A per-process limit (RLIMIT_AS, still set as a second line) lets four processes of a cell hold 3 GB each; what
matters to the grading machine is their sum. Two ways to bound it, chosen when a box starts (`BoxMemory`,
`c.Sandbox.memory_bound`):
- a memory cgroup per box (preferred): the grader makes it below its own cgroup (cgroup v1's memory controller,
  or a cgroup v2 whose memory controller this grader may enable for a child), with the limit
  `c.Sandbox.memory_gb`, and hands the zygote an open descriptor of its `cgroup.procs`. Each forked kernel moves
  itself in first thing (`MemoryGuard.join`), before it allocates anything: the zygote and the copy-on-write
  pages every kernel shares with it stay outside, so they neither count against the student nor can the
  kernel's OOM killer pick the zygote. The kernel's OOM killer acts inside that cgroup alone; it may kill one
  process, and the zygote (which watches the cgroup's OOM count) then kills the rest of the kernel's processes.
- a watchdog in the zygote, where no cgroup can be made (an unprivileged grader without delegation): it sums
  the proportional resident memory (`Pss` of /proc/PID/smaps_rollup; `VmRSS`, which overcounts shared pages,
  where that is unreadable) of every process in the box and kills the kernel's processes when the sum, less
  what the zygote held alone, passes the limit. A fast allocation may overshoot it for up to one tick.
Both are checked by the zygote's select loop every `TICK` seconds (a thread would make forking it unsafe, see
zygote.py), and every kernel makes itself the first choice of the machine's OOM killer (oom_score_adj 1000).
The zygote counts the kills; the grader asks that count when a kernel died (`Box.memory_limit_hit`), so the
report names the limit. tmpfs folders are bounded by their sizes (the cgroup counts them too). Shared memory: the
cgroup counts it; the watchdog sees only what is mapped, so as root a kernel's SysV segments are capped at the
limit in its own IPC namespace (`confine.ipc_bounds`), and whatever a kernel left there is freed when it exits.

Leftovers: a box's cgroup is removed when the box closes; a cgroup whose grader died (its name holds the
grader's pid and start time) is removed, with any process left in it, when the next box starts below the same
cgroup.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import signal
import time
from typing import Any

TICK = 0.1  # seconds between two checks of the zygote
PREFIX = "gptcourse-box-"
MODES = ("auto", "cgroup", "watchdog")
# version -> (limit file, swap limit file (RAM + swap in v1, swap alone in v2), file with the `oom_kill` count)
FILES = {1: ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes", "memory.oom_control"),
         2: ("memory.max", "memory.swap.max", "memory.events")}
_numbers = itertools.count()
log = logging.getLogger(__name__)


def own_memory_cgroup() -> tuple[int, str] | None:
    """(version, folder) of this process's memory cgroup where it is mounted here (v1's memory controller
    first, else v2's unified hierarchy), or None."""
    try:
        cgroups = [line.split(":", 2) for line in open("/proc/self/cgroup").read().splitlines()]
        mounts = [line.split() for line in open("/proc/self/mountinfo").read().splitlines()]
    except OSError:
        return None
    for version, wanted in ((1, lambda f: f[-3] == "cgroup" and "memory" in f[-1].split(",")),
                            (2, lambda f: f[-3] == "cgroup2")):
        path = next((p for hid, controllers, p in cgroups
                     if ("memory" in controllers.split(",") if version == 1 else hid == "0")), None)
        mount = next((f for f in mounts if wanted(f)), None)
        if path is not None and mount is not None:
            root, point = mount[3], mount[4]  # a mount may show a subtree of the hierarchy (a cgroup namespace)
            inside = os.path.relpath(path, root) if path.startswith(root) else None
            if inside is not None and not inside.startswith(".."):
                return version, os.path.normpath(os.path.join(point, inside))
    return None


def start_time(pid: int) -> str | None:
    """The start time of process `pid` (field 22 of /proc/PID/stat), or None if there is no such process."""
    try:
        stat = open(f"/proc/{pid}/stat").read()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def _write(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value)


def _remove_cgroup(folder: str) -> bool:
    """Kill what is left in `folder` (a box's cgroup: only its processes) and remove it; False if it stays."""
    for _ in range(200):
        try:
            os.rmdir(folder)
            return True
        except FileNotFoundError:
            return True
        except OSError as err:
            if err.errno != errno.EBUSY:
                return False
        with contextlib.suppress(OSError):
            for pid in open(os.path.join(folder, "cgroup.procs")).read().split():
                with contextlib.suppress(OSError):
                    os.kill(int(pid), signal.SIGKILL)
        time.sleep(0.05)  # exiting processes leave the cgroup a moment after the signal
    return False


def remove_dead_boxes(parent: str) -> int:
    """Remove the cgroups below `parent` of boxes whose grader process is gone; how many were removed."""
    removed = 0
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            parts = name[len(PREFIX):].split("-")
            if not name.startswith(PREFIX) or len(parts) != 3 or not parts[0].isdigit():
                continue
            if start_time(int(parts[0])) != parts[1] and _remove_cgroup(os.path.join(parent, name)):
                removed += 1
    if removed:
        log.warning("removed %d leftover memory cgroup(s) of grading boxes whose grader died, below %s", removed,
                    parent)
    return removed


def _make_box_cgroup(limit_bytes: int) -> tuple[int, str] | str:
    """(version, folder) of a new cgroup bounding its processes to `limit_bytes` together, or why none can be
    made here."""
    found = own_memory_cgroup()
    if found is None:
        return "no memory cgroup is mounted"
    version, parent = found
    remove_dead_boxes(parent)
    if version == 2:
        try:
            if "memory" not in open(os.path.join(parent, "cgroup.subtree_control")).read().split():
                _write(os.path.join(parent, "cgroup.subtree_control"), "+memory")
        except OSError as err:
            return f"cannot enable the memory controller below {parent} ({err.strerror})"
    folder = os.path.join(parent, f"{PREFIX}{os.getpid()}-{start_time(os.getpid())}-{next(_numbers)}")
    try:
        os.mkdir(folder)
    except OSError as err:
        return f"cannot make a cgroup below {parent} ({err.strerror})"
    limit, swap, _ = FILES[version]
    try:
        _write(os.path.join(folder, limit), str(limit_bytes))
        if os.path.exists(os.path.join(folder, swap)):  # no swapping past the limit
            _write(os.path.join(folder, swap), str(limit_bytes) if version == 1 else "0")
        if version == 2 and os.path.exists(os.path.join(folder, "memory.oom.group")):
            _write(os.path.join(folder, "memory.oom.group"), "1")  # the OOM killer takes the kernel whole
    except OSError as err:
        _remove_cgroup(folder)
        return f"cannot set the limit of {folder} ({err.strerror})"
    return version, folder


class NoMemoryCgroup(SystemExit):
    """memory_bound = "cgroup" where no cgroup can be made: the box cannot start (`sandbox.Box` raises it as
    SandboxUnavailable, which stops grading before anyone is graded)."""


class BoxMemory:
    """The grader's side of one box's memory limit: its cgroup (or None: the zygote's watchdog bounds it), what
    the zygote needs (`settings`, with descriptors `fds` to pass it), and the cgroup's removal (`close`).

    `mode` "cgroup" raises NoMemoryCgroup where no cgroup can be made; "auto" falls back to the watchdog."""

    def __init__(self, limit_bytes: int, mode: str = "auto") -> None:
        if mode not in MODES:
            raise ValueError(f"c.Sandbox.memory_bound is {mode!r}; expected one of {', '.join(map(repr, MODES))}")
        self.folder: str | None = None
        self.fds: list[int] = []
        made = _make_box_cgroup(limit_bytes) if mode != "watchdog" else "the watchdog was asked for"
        if isinstance(made, str):
            if mode == "cgroup":
                raise NoMemoryCgroup(f"c.Sandbox.memory_bound = 'cgroup', but {made}: run the grader as root, "
                                         f"in a cgroup it may delegate to, or set memory_bound = 'auto'")
            self.settings: dict[str, Any] = {"watch_bytes": limit_bytes}
            return
        version, self.folder = made
        self.fds = [os.open(os.path.join(self.folder, "cgroup.procs"), os.O_WRONLY),
                    os.open(os.path.join(self.folder, FILES[version][2]), os.O_RDONLY)]
        self.settings = {"procs_fd": self.fds[0], "events_fd": self.fds[1]}

    def started(self) -> None:
        """The zygote has its copies of the descriptors: close ours."""
        for fd in self.fds:
            os.close(fd)
        self.fds = []

    def close(self) -> None:
        """Remove the cgroup (once the box's processes are gone); safe to call twice."""
        self.started()
        if self.folder is not None and not _remove_cgroup(self.folder):
            log.warning("could not remove the memory cgroup %s (the next box's start retries)", self.folder)
        self.folder = None


def _kilobytes(path: str, field: str) -> int:
    """The value of `field` ("Pss:") in /proc file `path`, in bytes; 0 if absent (a zombie)."""
    for line in open(path):
        if line.startswith(field):
            return int(line.split()[1]) * 1024
    return 0


def box_resident_bytes() -> int:
    """The resident memory of every process in this (box's) pid namespace: Pss where readable, else VmRSS."""
    total = 0
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError):
                try:
                    total += _kilobytes(f"/proc/{name}/smaps_rollup", "Pss:")
                except PermissionError:  # a process that made itself undumpable: counted in full
                    total += _kilobytes(f"/proc/{name}/status", "VmRSS:")
    return total


class MemoryGuard:
    """The zygote's side: `join` (in each forked kernel), and `hit` (in the zygote's loop): whether the box's
    kernel has hit the limit since the last look; `kills` counts those times."""

    def __init__(self, settings: dict[str, Any] | None) -> None:
        settings = settings or {}
        self.procs_fd, self.events_fd = settings.get("procs_fd"), settings.get("events_fd")
        self.watch_bytes: int | None = settings.get("watch_bytes")
        self.active = self.events_fd is not None or self.watch_bytes is not None
        self.kills, self._baseline, self._last = 0, 0, 0.0
        self._seen = self._oom_kills()

    def ready(self) -> None:
        """After preloading, before any kernel: what the zygote holds alone is not the kernels'."""
        if self.watch_bytes is not None:
            self._baseline = box_resident_bytes()

    def join(self) -> None:
        """In a forked kernel, before anything else: move into the box's cgroup (the kernel's children follow),
        close the zygote's descriptors, and be the OOM killer's first choice (raising it is always allowed)."""
        if self.procs_fd is not None:
            os.write(self.procs_fd, b"0")  # 0: the writing process
        for fd in (self.procs_fd, self.events_fd):
            if fd is not None:
                os.close(fd)
        with contextlib.suppress(OSError):
            _write("/proc/self/oom_score_adj", "1000")

    def _oom_kills(self) -> int:
        if self.events_fd is None:
            return 0
        text = os.pread(self.events_fd, 4096, 0).decode()
        return next((int(line.split()[1]) for line in text.splitlines() if line.startswith("oom_kill ")), 0)

    def hit(self, now: bool = False) -> bool:
        """True (and one more kill counted) if the limit was hit since the last look: the caller kills the
        kernel's processes. Looks at most once per TICK unless `now`."""
        if not self.active or (not now and time.monotonic() - self._last < TICK):
            return False
        self._last = time.monotonic()
        kills = self._oom_kills()
        over = kills > self._seen or (self.watch_bytes is not None
                                      and box_resident_bytes() - self._baseline > self.watch_bytes)
        self._seen = kills
        self.kills += over
        return over
