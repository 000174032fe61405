"""A warm "zygote" process that forks a fresh Jupyter kernel for each notebook the grader runs.

Why: starting an IPython kernel and importing torch costs about 2 s per notebook, far more than a lab's checks.
The zygote imports torch, ipykernel and gptcourse once, then for every kernel the grader asks for it forks a
child that becomes a brand-new ipykernel process. Student code still runs in a process of its own: never in the
zygote, the grader, or another student's kernel (fork copies the zygote's memory; nothing flows back).

Forking after `import torch` is safe only while no OpenMP (intra-op) thread pool has started: a child would
inherit a pool whose threads do not exist and hang in its first parallel op. Importing torch starts no pool (only
numpy's OpenBLAS threads, which OpenBLAS shuts down before a fork and restarts after); the zygote runs no tensor
code, and after preloading it checks that it has no more threads than when it began. If that check fails it
refuses to serve and grading falls back to ordinary kernels.

Pieces:
- `serve(path)`: the zygote (`python -m gptcourse.grading.box.zygote SOCKET`); one JSON line per request on a Unix
  socket: spawn a kernel, poll one. It exits, killing its kernels, when its stdin closes (its owner is gone).
  `serve(box=...)` (`--box JSON`) is the zygote as the main process of a sandbox (`sandbox.Box`): one connection,
  an inherited socket; each kernel drops to the kernel user and every capability and gets the box's limits
  (`confine.drop_privileges`: what the box does inside lives in confine.py); it
  also signals its kernels (their pids are the box's), `reset`s the box between submissions, and kills a kernel
  with every process it started when their memory together hits the limit (`memory_limit.MemoryGuard`, looked at
  from the select loop: a thread would make forking unsafe). If forking is unsafe there, it forks and execs
  ordinary kernels, in the box.
- `Zygote`: starts that process; `ZygoteClient`: one connection; `spawn(args, cwd, env)` -> `ForkedKernel`, a
  Popen-like handle (poll, wait, send_signal, kill) of a forked kernel.
- `ZygoteProvisioner`: jupyter_client's `LocalProvisioner`, except that `python -m ipykernel_launcher ...` is
  forked by the zygote. Interrupts, timeouts and kills signal the kernel's process group exactly as for a
  normal kernel (each forked kernel leads its own session). `ReadyKernelClient`: the client of such a kernel,
  ready at the idle of its kernel_info request, not after jupyter_client's quiet 0.2 s, its sockets reconnecting
  every 10 ms.
- `with_zygote(execute_class, client)`: nbgrader's Execute preprocessor (or a configured subclass), unchanged
  except that its kernel manager uses the provisioner; `gptcourse autograde` swaps it in programmatically.

Linux only (fork + prctl); elsewhere `Zygote.supported()` is False and kernels start as usual.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import ctypes
import importlib
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from pathlib import Path
from queue import Empty
from typing import Any, BinaryIO

import zmq
import zmq.asyncio
from jupyter_client.asynchronous import AsyncKernelClient
from jupyter_client.manager import AsyncKernelManager
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Instance, default

from ..cases import SECRET_ENV
from .confine import box_environment, drop_privileges, kill_the_rest, map_kernel_user, reset_box, undumpable
from .memory_limit import TICK, MemoryGuard

# What a lab's kernel imports; a name that is not installed is skipped. torch._dynamo: a kernel's first optimizer
# step imports it, and so does the first operation under a TorchDispatchMode (student.TensorsMade, which the cases
# of labs 01, 05, 06, 11, 12 and others run): seconds in every kernel, against once per box here. It starts no thread.
PRELOAD = ("torch", "torch._dynamo", "gptcourse", "gptcourse.grading", "ipykernel.kernelapp", "ipykernel.ipkernel",
           "ipykernel.debugger", "IPython.core.debugger", "IPython.core.completerlib",
           "IPython.extensions.storemagic", "ipywidgets", "sqlite3", "psutil", "tqdm")
_PR_SET_PDEATHSIG = 1
_CONNECT_TIMEOUT = 300.0  # preloading torch on a loaded machine


def stop_process(process: subprocess.Popen) -> None:
    """Close the stdin of a zygote or box, whose end tells it to stop, and wait for it; kill it after 10 s."""
    if process.stdin and not process.stdin.closed:
        process.stdin.close()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()



class ZygoteError(RuntimeError):
    """The zygote is not running or refused a request."""


def die_with_parent() -> None:
    """Linux: get SIGKILL when the parent process exits, so nothing outlives a killed grader."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def thread_count() -> int:
    return len(os.listdir("/proc/self/task"))


def check_fork_safe(baseline: int) -> None:
    """Raise unless this process has no more threads than `baseline` (counted before any tensor code could run:
    the main thread and numpy's OpenBLAS pool)."""
    if thread_count() > baseline:
        raise ZygoteError(f"{thread_count() - baseline} thread(s) started since the zygote began (an OpenMP or "
                          "intra-op pool?): forking kernels from it would be unsafe")


def preload(baseline: int) -> None:
    """Import what kernels need, then check that no thread pool started."""
    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)
    from ..cases import registry

    registry()
    check_fork_safe(baseline)


def _become_kernel(request: dict[str, Any], zygote_pid: int, inherited: list[Any],
                   box: dict[str, Any] | None = None, fork_safe: bool = True,
                   handshake: tuple[int, int] | None = None, guard: MemoryGuard | None = None) -> None:
    """In a forked child: turn into `python -m ipykernel_launcher ARGS` run in `cwd` with `env` (in a box: in its
    memory cgroup, with its limits, unprivileged; if forking is unsafe: exec a fresh interpreter). Never returns."""
    code: Any = 1
    try:
        if guard is not None:
            guard.join()  # first: what the kernel allocates from here on counts against the box's limit
        os.setsid()  # own process group: the grader's interrupt and kill reach the kernel and its subprocesses
        die_with_parent()
        if os.getppid() != zygote_pid:
            os._exit(1)
        for sock in inherited:
            sock.close()
        if box is not None:
            drop_privileges(box, handshake)
        if not fork_safe:
            os.chdir(request["cwd"])
            env = {**request["env"], "JPY_PARENT_PID": str(zygote_pid)}
            os.execve(sys.executable, [sys.executable, "-m", "ipykernel_launcher", *request["args"]], env)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        os.environ["JPY_PARENT_PID"] = str(zygote_pid)  # the kernel's parent poller watches the zygote
        if request.get("threads"):
            _limit_threads(request["threads"])
        _reseed()
        if box is not None:
            _start_thread_pool()
        # ipykernel read JPY_PARENT_PID when the zygote imported it, so pass it as an argument too.
        args = [*request["args"], f"--IPKernelApp.parent_handle={zygote_pid}"]
        sys.argv = ["ipykernel_launcher", *args]
        from ipykernel import kernelapp

        kernelapp.launch_new_instance(argv=args)
        code = 0
    except SystemExit as stop:
        code = stop.code
    except BaseException:
        traceback.print_exc()
    finally:
        with contextlib.suppress(BaseException):
            atexit._run_exitfuncs()
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code if isinstance(code, int) else (0 if code is None else 1))


def _limit_threads(threads: int) -> None:
    """Intra-op threads for this kernel: torch's OpenMP/MKL settings were read when the zygote imported torch, so
    set them directly (no pool starts); the variables are for the kernel's subprocesses."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(threads)
    sys.modules["torch"].set_num_threads(threads)


def _start_thread_pool() -> None:
    """In a box's kernel, before any student code: start torch's intra-op (OpenMP) threads now. Started lazily,
    after a cell has used up the box's process limit, they would fail to start, and OpenMP aborts the process."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() > 1:
        torch.ones(1 << 20).exp_()  # a parallel op: large enough for ATen to split it


def _reseed() -> None:
    """A fresh process draws fresh seeds for `random` and numpy's global generator; a forked one must redraw them
    (torch's default generator starts from a fixed seed in any new process, and the zygote never used it)."""
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status)


def serve(socket_path: str | None = None, box: dict[str, Any] | None = None) -> None:
    """The zygote's loop: preload, then answer {"op": "spawn", "args", "cwd", "env"} -> {"pid"} and
    {"op": "poll", "pid"} -> {"returncode": None or int} until stdin closes (or, in a box, its connection);
    in a box also {"op": "signal", "pid", "signum"}, {"op": "reset"} -> {"memory_kills"} and {"op": "memory"}
    -> {"memory_kills"}: how many times the box's memory limit (`memory_limit.py`, checked every TICK while a
    kernel runs) killed a kernel's processes."""
    baseline = thread_count()  # torch is imported (by gptcourse) but has run nothing: main + OpenBLAS threads
    die_with_parent()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the grader; it closes our stdin
    selector = selectors.DefaultSelector()
    buffers: dict[socket.socket, bytes] = {}
    listener = None
    if box is None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(socket_path)
        listener.listen(64)  # clients may connect (and wait) while we preload
        selector.register(listener, selectors.EVENT_READ)
    else:
        undumpable()  # no kernel may trace it or read its memory
        conn = socket.socket(fileno=box["fd"])
        buffers[conn] = b""
        selector.register(conn, selectors.EVENT_READ)
    fork_safe = True
    guard = MemoryGuard(box.get("memory") if box else None)
    try:
        preload(baseline)
    except ZygoteError as err:
        if box is None:
            raise
        print(f"{err}: the box's kernels start as fresh processes instead", flush=True)
        fork_safe = False
    zygote_pid = os.getpid()
    children: set[int] = set()
    guard.ready()
    selector.register(sys.stdin, selectors.EVENT_READ)
    print(f"zygote {zygote_pid} ready on {socket_path or 'its box connection'}", flush=True)

    def answer(request: dict[str, Any]) -> dict[str, Any]:
        if request.get("op") == "spawn":
            ids = box.get("ids") if box else None
            to_zygote, to_kernel = (os.pipe(), os.pipe()) if ids else ((-1, -1), (-1, -1))
            pid = os.fork()
            if pid == 0:
                _become_kernel(request, zygote_pid, [s for s in (listener, *buffers) if s is not None], box,
                               fork_safe, (to_zygote[1], to_kernel[0]) if ids else None, guard if box else None)
            children.add(pid)
            if ids:
                try:
                    map_kernel_user(pid, ids, (to_zygote[0], to_kernel[1]))
                finally:
                    for fd in (*to_zygote, *to_kernel):
                        os.close(fd)
            return {"pid": pid}
        if request.get("op") == "poll" and request.get("pid") in children:
            pid, status = os.waitpid(request["pid"], os.WNOHANG)
            if pid == 0:
                return {"returncode": None}
            children.discard(pid)
            return {"returncode": _exit_code(status)}
        if box is not None and request.get("op") == "signal" and request.get("pid") in children:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(request["pid"], int(request["signum"]))
            return {"signalled": True}
        if box is not None and request.get("op") in ("reset", "memory"):
            if guard.hit(now=True):  # a kill the loop has not seen yet belongs to the kernel just gone
                kill_the_rest()
            reply = reset_box(children) if request["op"] == "reset" else {}
            return {**reply, "memory_kills": guard.kills}
        return {"error": f"bad request {request!r}"}

    try:
        while True:
            events = selector.select(timeout=TICK if guard.active and children else None)
            if children and guard.hit():
                kill_the_rest()  # the kernel and every process it started; the grader's poll finds it dead
            for key, _ in events:
                if key.fileobj is sys.stdin:
                    if not os.read(sys.stdin.fileno(), 4096):
                        return
                elif key.fileobj is listener:
                    conn, _ = listener.accept()
                    buffers[conn] = b""
                    selector.register(conn, selectors.EVENT_READ)
                else:
                    conn = key.fileobj
                    data = conn.recv(1 << 20)
                    if not data and box is not None:
                        return  # the box's owner is gone
                    if not data:
                        selector.unregister(conn)
                        del buffers[conn]
                        conn.close()
                        continue
                    buffers[conn] += data
                    while b"\n" in buffers[conn]:
                        line, buffers[conn] = buffers[conn].split(b"\n", 1)
                        conn.sendall(json.dumps(answer(json.loads(line))).encode() + b"\n")
    finally:
        for pid in children:
            with contextlib.suppress(OSError):
                os.killpg(pid, signal.SIGKILL)


class Zygote:
    """Owns a zygote process (`serve`) and the temporary folder of its socket."""

    def __init__(self, log: BinaryIO | None = None) -> None:
        self.log = log  # where the zygote and its kernels print (default: this process's stdout and stderr)
        self._folder = tempfile.TemporaryDirectory(prefix="gptcourse-zygote-")
        self.socket_path = os.path.join(self._folder.name, "zygote.sock")
        env = {name: value for name, value in os.environ.items() if name != SECRET_ENV}  # kernels are forked from it
        self.process = subprocess.Popen([sys.executable, "-m", "gptcourse.grading.box.zygote", self.socket_path],
                                        stdin=subprocess.PIPE, stdout=log, stderr=log, env=env)

    @staticmethod
    def supported() -> bool:
        return sys.platform.startswith("linux") and hasattr(os, "fork")

    def close(self) -> None:
        """Stop the zygote (it kills its kernels); safe to call twice."""
        stop_process(self.process)
        self._folder.cleanup()

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ZygoteClient:
    """A connection to a zygote at `socket_path` (thread-safe; a request takes well under a millisecond).

    `kernel_threads`: intra-op threads of each kernel it forks (None: torch's default, one per core). A batch
    running W kernels at once on C cores gives each C // W: tiny lab tensors gain nothing from more, and OpenMP
    threads that outnumber the cores spin instead of working."""

    def __init__(self, socket_path: str | None = None, timeout: float = _CONNECT_TIMEOUT,
                 kernel_threads: int | None = None, sock: socket.socket | None = None) -> None:
        self.socket_path, self.kernel_threads = socket_path, kernel_threads
        self.boxed = sock is not None  # the zygote of a box: its pids are the box's, so it sends the signals
        self._sock = sock if sock is not None else self._connect(socket_path, timeout)
        self._reader = self._sock.makefile("rb")
        self._lock = threading.Lock()
        self._sock.settimeout(timeout)  # the first answer waits for the zygote's preloading

    @staticmethod
    def _connect(socket_path: str | None, timeout: float) -> socket.socket:
        deadline = time.monotonic() + timeout
        while True:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.connect(socket_path)
                return sock
            except OSError as err:
                sock.close()
                if time.monotonic() > deadline:
                    raise ZygoteError(f"no zygote listening on {socket_path}: {err}") from None
                time.sleep(0.05)

    def request(self, **message: Any) -> dict[str, Any]:
        with self._lock:
            try:
                self._sock.sendall(json.dumps(message).encode() + b"\n")
                line = self._reader.readline()
            except OSError as err:
                raise ZygoteError(f"lost the zygote: {err}") from None
        if not line:
            raise ZygoteError("the zygote exited (see the grading log for why)")
        reply = json.loads(line)
        if "error" in reply:
            raise ZygoteError(reply["error"])
        return reply

    def spawn(self, args: list[str], cwd: str, env: dict[str, str]) -> ForkedKernel:
        reply = self.request(op="spawn", args=args, cwd=cwd, env=env, threads=self.kernel_threads)
        return ForkedKernel(self, reply["pid"])

    def close(self) -> None:
        self._reader.close()
        self._sock.close()


class ForkedKernel:
    """What `subprocess.Popen` offers LocalProvisioner, for a kernel forked by the zygote.

    The zygote reaps the child only when a poll finds it exited, so its pid cannot be reused while signals may
    still be sent to it."""

    stdin = stdout = stderr = None

    def __init__(self, client: ZygoteClient, pid: int) -> None:
        self.client, self.pid, self.returncode = client, pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self.client.request(op="poll", pid=self.pid)["returncode"]
            except ZygoteError:  # a dead zygote took its kernels with it (PR_SET_PDEATHSIG)
                self.returncode = -signal.SIGKILL
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"kernel {self.pid}", timeout or 0)
            time.sleep(0.01)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        """To the kernel's process group (it leads one): the kernel and what it started."""
        if self.returncode is not None:
            return
        if self.client.boxed:
            with contextlib.suppress(ZygoteError):
                self.client.request(op="signal", pid=self.pid, signum=int(signum))
        else:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def ipykernel_args(cmd: list[str]) -> list[str] | None:
    """The arguments of `THIS_PYTHON -m ipykernel_launcher ARGS`, or None for any other kernel command."""
    if len(cmd) >= 3 and cmd[1:3] == ["-m", "ipykernel_launcher"] \
            and os.path.realpath(cmd[0]) == os.path.realpath(sys.executable):
        return cmd[3:]
    return None


class ZygoteProvisioner(LocalProvisioner):
    """LocalProvisioner whose ipykernel processes are forked by a zygote (any other kernel starts as usual; in a
    box, no kernel starts outside it)."""

    client = Instance(ZygoteClient, allow_none=True)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        args = ipykernel_args(cmd)
        boxed = self.client is not None and self.client.boxed
        if (self.client is None or args is None) and not boxed:
            return await super().launch_kernel(cmd, **kwargs)
        if args is None:
            raise ZygoteError(f"only this Python's ipykernel runs in the sandbox, not {cmd[:3]}")
        cwd = str(kwargs.get("cwd") or Path.cwd())
        env = {str(k): str(v) for k, v in (kwargs.get("env") or os.environ).items()}
        if boxed:
            env = box_environment(env)
        try:
            self.process = self.client.spawn(args, cwd, env)
        except ZygoteError as err:
            if boxed:
                raise ZygoteError(f"the sandbox's zygote is gone ({err}): no kernel starts outside it") from None
            self.log.warning("zygote unavailable (%s): starting an ordinary kernel", err)
            return await super().launch_kernel(cmd, **kwargs)
        self.pid = self.pgid = None if boxed else self.process.pid  # a box's pids mean nothing out here
        self.cwd = cwd
        return self.connection_info

    async def send_signal(self, signum: int) -> None:
        if isinstance(self.process, ForkedKernel):
            self.process.send_signal(signum)
        else:
            await super().send_signal(signum)

    async def wait(self) -> int | None:
        if isinstance(self.process, ForkedKernel):
            while self.process.poll() is None:
                await asyncio.sleep(0.01)
            code, self.process = self.process.returncode, None
            return code
        return await super().wait()


class ReadyKernelClient(AsyncKernelClient):
    """jupyter_client's asynchronous client, except that a kernel is ready as soon as IOPub carries the "idle" that
    ends its reply to kernel_info, where jupyter_client then waits for IOPub to be quiet for 0.2 s: idle time in
    every submission graded, most of a forked kernel's start. ZeroMQ drops what a kernel publishes before the
    client's subscription is made, so a request whose idle does not come is sent again, each time waiting twice as
    long (a kernel publishes its idle right after its reply, later on a loaded machine). The zygote forks only
    this Python's ipykernel, whose protocol version is jupyter_client's own. Its sockets retry a connection every
    10 ms, not ZeroMQ's 100: they connect as the kernel is forked, before it has bound its own."""

    def _context_default(self) -> zmq.asyncio.Context:
        context = super()._context_default()
        context.setsockopt(zmq.RECONNECT_IVL, 10)  # ms; a default of every socket the context makes
        return context

    async def wait_for_ready(self, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (float("inf") if timeout is None else timeout)
        grace = 0.01
        while not await self._answered(self.kernel_info(), grace):
            if not await self.is_alive():
                raise RuntimeError("Kernel died before replying to kernel_info")
            if time.monotonic() > deadline:
                raise RuntimeError(f"Kernel didn't respond in {timeout} seconds")
            grace = min(2 * grace, 1.0)

    async def _answered(self, request: str, grace: float) -> bool:
        """Whether the reply to kernel_info request `request` came on shell within a second, and its idle on IOPub
        with no gap of `grace` s (each message before, of the kernel's start or of an earlier request, dropped)."""
        async def after(channel: Any, wait: float, matches: Any) -> bool:
            while True:
                try:
                    message = await channel.get_msg(timeout=wait)
                except Empty:
                    return False
                if message["parent_header"].get("msg_id") == request and matches(message):
                    return True

        return (await after(self.shell_channel, 1.0, lambda m: m["msg_type"] == "kernel_info_reply")
                and await after(self.iopub_channel, grace,
                                lambda m: m["msg_type"] == "status" and m["content"]["execution_state"] == "idle"))


def zygote_kernel_manager(manager_class: type[AsyncKernelManager], client: ZygoteClient,
                          ipc_dir: str | None = None, owner: tuple[int, int] | None = None) -> type[AsyncKernelManager]:
    """`manager_class` whose kernels are forked by the zygote behind `client`; with `ipc_dir`, connected over
    Jupyter's ipc transport (Unix sockets in that folder, shared with the box), the connection file given to
    `owner` (the kernel user's uid and gid), who alone may read it."""

    class ZygoteKernelManager(manager_class):  # type: ignore[misc,valid-type]
        @default("client_factory")
        def _ready_client(self) -> type:
            return ReadyKernelClient

        def write_connection_file(self, **kw: Any) -> None:
            super().write_connection_file(**kw)
            if owner is not None:
                os.chown(self.connection_file, *owner)

        async def _async_pre_start_kernel(self, **kw: Any) -> Any:
            if self.provisioner is None:
                self.kernel_id = self.kernel_id or kw.pop("kernel_id", str(uuid.uuid4()))
                if ipc_dir is not None:
                    self.transport = "ipc"
                    self.ip = os.path.join(ipc_dir, f"k{self.kernel_id[:8]}")
                    self.connection_file = os.path.join(ipc_dir, f"kernel-{self.kernel_id}.json")
                self.provisioner = ZygoteProvisioner(client=client, kernel_id=self.kernel_id,
                                                     kernel_spec=self.kernel_spec, parent=self)
            return await super()._async_pre_start_kernel(**kw)

        async def _async_wait(self, pollinterval: float = 0.1) -> None:
            await super()._async_wait(pollinterval=min(pollinterval, 0.01))  # a forked kernel exits in ms

    ZygoteKernelManager.__name__ = ZygoteKernelManager.__qualname__ = f"Zygote{manager_class.__name__}"
    return ZygoteKernelManager


def with_zygote(execute_class: type, client: ZygoteClient) -> type:
    """A subclass of nbgrader's Execute preprocessor (or of the configured subclass of it), configured exactly
    like it (traitlets applies a parent class's config to subclasses), whose kernels come from the zygote."""

    class ZygoteExecute(execute_class):  # type: ignore[misc,valid-type]
        def create_kernel_manager(self) -> Any:
            # Once every cell has run, its outputs are in: kill the kernel rather than wait for a graceful exit.
            self.shutdown_kernel = "immediate"
            if not getattr(self.kernel_manager_class, "_gptcourse_zygote", False):
                self.kernel_manager_class = zygote_kernel_manager(self.kernel_manager_class, client)
                self.kernel_manager_class._gptcourse_zygote = True
            return super().create_kernel_manager()

    ZygoteExecute.__name__ = ZygoteExecute.__qualname__ = f"Zygote{execute_class.__name__}"
    return ZygoteExecute


if __name__ == "__main__":
    if sys.path and (sys.path[0] in ("", os.getcwd())):
        del sys.path[0]  # like ipykernel_launcher: the course folder is not an import root (kernels add '')
    if sys.argv[1] == "--box":
        serve(box=json.loads(sys.argv[2]))
        sys.stdout.flush()
        os._exit(0)  # its kernels are killed; the box ends now, without tearing down torch
    else:
        serve(sys.argv[1])
