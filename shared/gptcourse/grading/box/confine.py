"""Inside the box: what the zygote does to each kernel it forks, and between two submissions.

`sandbox.py` is the grader's half of the box (bwrap's command line, the limits, starting and stopping a box);
this module is the half that runs inside it, in the zygote (`zygote.py`, the fork server that calls it): each
kernel's privilege drop (`drop_privileges`: limits, a user and an IPC namespace of its own, the kernel user, no
capability, a new session keyring; `map_kernel_user` from the zygote's side), the environment a kernel may see
(`KERNEL_VARIABLES`, an allowlist), and between two submissions `reset_box` (`kill_the_rest`, then the writable
folders emptied).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import signal
import time
from collections.abc import Mapping
from typing import Any

from ..cases import HIDDEN_SEEDS_ENV
from ..kernel_inputs import INPUTS_ENV as CASE_INPUTS_ENV

BOX_SCRATCH = "/scratch"  # the kernel's working folder inside the box
BOX_TMP = "/tmp"


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



def empty_folder(folder: str) -> None:
    """Delete everything in `folder` without following a symbolic link out of it."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)


# ---- what the zygote does to each kernel it forks, and between two submissions

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
