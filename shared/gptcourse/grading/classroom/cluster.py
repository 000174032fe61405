"""`gptcourse autograde LAB --cluster ADDRESS | local:N`: the class graded on a Dask cluster, into one PostgreSQL
gradebook.

Each submission is one Dask task. A Dask worker grades it exactly as a `gptcourse autograde` worker does
(`grade_one.grade_submission`: nbgrader's Autograde with the course's config, each kernel forked in the worker's own
bubblewrap box, reset between submissions), writes the grades to the shared gradebook and the autograded notebook,
report and resume record to the course folder, and sends back the outcome for the progress bar and the summary.
A worker grades one submission at a time (a lock, whatever its thread count), in one box it keeps between tasks.

What every worker needs, checked before anyone is graded (`require_workers`; a mismatch stops the batch with the
list of what is wrong where):
- the same gptcourse version as the scheduler (and as this process): the task's code is the package's;
- the course folder at the same path, the same folder (a shared filesystem: the submissions are read and the
  autograded notebooks written there; nothing is shipped to the workers): the same nbgrader_config.py, and a file
  this process has just written there is seen (a copy of the course fails that);
- bubblewrap and user namespaces (the sandbox, `sandbox.require_sandbox`; the course's `allow_unsandboxed`
  opt-out holds here too);
- the gradebook reachable: PostgreSQL (nbgrader's `db_url` or `--db`), since workers on several machines write at
  once.

A worker that dies (killed, its machine lost) loses only the submission it was grading: the scheduler gives that
task to another worker, which grades it again from the start (nbgrader replaces the autograded folder and updates
the gradebook rows in place). A submission whose task has killed its worker `distributed.scheduler.allowed-failures`
times (Dask's default: 3) is reported as failed, never retried again. (The scheduler may also hand a worker its
next task before the current one ends; a worker's death counts against that one too.) A kernel that dies is not a
worker that dies: it is handled inside the worker as in one-machine grading (restarted, the submission graded as it
stands).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import logging
import os
import secrets
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...threads import cores
from .grade_one import Outcome, grade_submission, nbgrader_app, wait_for_sqlite_locks

LOCAL = "local:"
PACKAGE = "gptcourse"
SHARED_COURSE = ("expected the grading machine's course folder at the same path on every worker, from a shared "
                 "filesystem (the workers read the submissions and write the autograded notebooks there)")


def connect(address: str) -> Any:
    """A Dask client: `local:N` starts a LocalCluster of N single-threaded worker processes on loopback; any
    other address is an existing scheduler's (tcp://host:8786)."""
    from distributed import Client, LocalCluster

    if address.startswith(LOCAL):
        count = address[len(LOCAL):]
        if not count.isdigit() or int(count) < 1:
            raise SystemExit(f"--cluster {address}: expected local:N with N a number of workers >= 1, e.g. local:2")
        cluster = LocalCluster(n_workers=int(count), threads_per_worker=1, processes=True, host="127.0.0.1",
                               dashboard_address=None, silence_logs=logging.ERROR)
        return Client(cluster)
    try:
        return Client(address, timeout="30s")
    except OSError as err:
        raise SystemExit(f"--cluster {address}: no Dask scheduler answered ({err}); expected a scheduler's address "
                         "(tcp://host:8786) or local:N") from None


def file_digest(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def installed_version(where: Any = None) -> str:
    """The gptcourse version installed here, or on `where` (a Dask client's scheduler)."""
    try:
        if where is not None:
            return where.run_on_scheduler(importlib.metadata.version, PACKAGE)
        return importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def worker_problems(root: str, config_digest: str | None, db_url: str, probe: str) -> dict[str, Any]:
    """Run on each worker before grading: {"problems": what this worker lacks, "cores": its machine's cores}.
    `probe`: the name of a file the grading machine has just written in the course folder (a shared folder
    shows it; a copy does not)."""
    from traitlets.config import Config, PyFileConfigLoader

    from ..box.sandbox import SandboxUnavailable, course_folders, require_sandbox

    problems = []
    config_file = Path(root, "nbgrader_config.py")
    seen = ("does not exist here" if not Path(root).is_dir()
            else "has no nbgrader_config.py here" if not config_file.exists()
            else "has another nbgrader_config.py here" if file_digest(config_file) != config_digest
            else f"is a copy here, not the shared folder: {probe}, just written there, is missing"
            if not Path(root, probe).exists() else None)
    if seen:
        problems.append(f"the course folder: {root} {seen}; {SHARED_COURSE}")
    else:
        config = Config(PyFileConfigLoader(config_file.name, root).load_config())
        config.CourseDirectory.root = root
        try:
            require_sandbox(config, course_folders(config))
        except SandboxUnavailable as unavailable:
            problems.append(f"the sandbox: {str(unavailable).splitlines()[0]}")
    problem = _database_problem(db_url)
    if problem:
        problems.append(f"the gradebook: {problem}")
    return {"problems": problems, "cores": cores()}


def _database_problem(db_url: str) -> str | None:
    """Why `db_url` cannot be reached from here, or None."""
    from sqlalchemy import create_engine, text

    try:
        engine = create_engine(db_url, connect_args={"connect_timeout": 10})
        with engine.connect() as connection:
            connection.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as err:  # the driver's own error says what failed (refused, unknown host, password)
        return f"{db_url} is not reachable ({type(err).__name__}: {str(err).strip().splitlines()[0]})"
    return None


def require_postgres(db_url: str) -> None:
    if not db_url.startswith("postgresql"):
        raise SystemExit(f"--cluster needs a gradebook every worker can write to at once: PostgreSQL (--db "
                         f"postgresql://user@host/db or c.CourseDirectory.db_url), not {db_url}")


@contextlib.contextmanager
def shared_folder_probe(root: str) -> Iterator[str]:
    """The name of a new empty file in `root`, deleted afterwards: a worker that sees it sees this folder."""
    probe = Path(root, f".gptcourse-cluster-check-{secrets.token_hex(8)}")
    probe.touch(exist_ok=False)
    try:
        yield probe.name
    finally:
        probe.unlink(missing_ok=True)


def require_workers(client: Any, root: str, db_url: str) -> int:
    """Check every worker (see the module's docstring); raise SystemExit listing each problem per worker, else
    return the intra-op threads each may use: its machine's cores shared among the workers there (the fewest)."""
    here, scheduler = installed_version(), installed_version(client)
    workers = client.scheduler_info()["workers"]
    problems = []
    if scheduler != here:
        problems.append(f"the scheduler has {PACKAGE} {scheduler}, this machine {here}: install the same version")
    if not workers:
        problems.append("the Dask cluster has no workers: start some (`dask worker ADDRESS --nthreads 1`)")
    versions = {w: "not installed" if isinstance(v, BaseException) else v
                for w, v in client.run(importlib.metadata.version, PACKAGE, on_error="return").items()}
    same = [w for w, version in versions.items() if version == scheduler]
    problems += [f"{w}: {PACKAGE} {versions[w]}, the scheduler's is {scheduler}" for w in versions if w not in same]
    with shared_folder_probe(root) as probe:
        facts = client.run(worker_problems, root, file_digest(Path(root, "nbgrader_config.py")), db_url, probe,
                           workers=same, on_error="return") if same else {}
    for worker, found in facts.items():
        if isinstance(found, BaseException):
            problems.append(f"{worker}: the checks failed ({type(found).__name__}: {found})")
        else:
            problems += [f"{worker}: {problem}" for problem in found["problems"]]
    if problems:
        raise SystemExit("autograde stopped before grading anyone: the cluster's workers are not ready:\n- "
                         + "\n- ".join(problems))
    per_host = Counter(info["host"] for info in workers.values())
    return min(max(1, facts[w]["cores"] // per_host[workers[w]["host"]]) for w in facts)


# ---------------------------------------------------------------------------------------------------------------
# On a worker: one grader per worker process, kept between tasks.


class _Grader:
    """nbgrader's app for the lab and this worker's box (None when the course allows unsandboxed grading where
    the box cannot start)."""

    def __init__(self, root: str, lab: str, nbgrader_args: list[str], threads: int, log_path: str) -> None:
        import torch

        from ..box.sandbox import Sandbox, course_folders, require_sandbox

        os.chdir(root)  # nbgrader's paths are relative to the course root, the working folder
        torch.set_num_threads(threads)
        self.lab, self.threads = lab, threads
        self.log = open(log_path, "ab")  # the box writes its kernels' output here while it lives
        wait_for_sqlite_locks()
        self.app = nbgrader_app(lab, nbgrader_args)
        for handler in list(self.app.log.handlers):  # nbgrader's log goes to the batch's log, not the worker's
            self.app.log.removeHandler(handler)
        self.app.log.addHandler(logging.FileHandler(log_path))
        self.app.log.propagate = False
        self.config = self.app.config if require_sandbox(self.app.config, course_folders(self.app.config)) else None
        self.sandbox, self.course_folders = Sandbox, course_folders
        self.box = self._start_box()

    def _start_box(self) -> Any:
        if self.config is None:
            return None
        return self.sandbox(config=self.config).start_box(self.course_folders(self.config), log=self.log,
                                                          threads=self.threads, lab=self.lab)

    def grade(self, student: str) -> dict[str, Any]:
        try:
            if self.box is not None and not self.box.alive():  # a kernel killed its zygote: a fresh box
                self.box.close()
                self.box = self._start_box()
            return grade_submission(self.app, student, None, self.box)
        except Exception as err:  # one broken submission must not stop the class
            self.app.log.exception("grading %s failed", student)
            return {"student": student, "ok": False, "seconds": 0.0, "messages": [f"{type(err).__name__}: {err}"]}


_GRADERS: dict[tuple, _Grader] = {}
_ONE_AT_A_TIME = threading.Lock()


def grade_on_worker(root: str, lab: str, student: str, nbgrader_args: list[str], threads: int,
                    log_path: str) -> dict[str, Any]:
    """The task: grade one submission in this worker's grader (made on its first task), return the outcome."""
    with _ONE_AT_A_TIME:
        key = (root, lab, tuple(nbgrader_args), threads, log_path)
        if key not in _GRADERS:
            _GRADERS[key] = _Grader(root, lab, nbgrader_args, threads, log_path)
        return _GRADERS[key].grade(student)


# ---------------------------------------------------------------------------------------------------------------
# On the machine that runs `gptcourse autograde`: the checks, then one task per submission.


class ClusterRunner:
    """The batch's workers on a Dask cluster: connected and checked when made, closed (a local cluster stopped)
    by `close`."""

    def __init__(self, address: str, root: str, lab: str, db_url: str, nbgrader_args: list[str]) -> None:
        require_postgres(db_url)
        self.client = connect(address)
        try:
            self.threads = require_workers(self.client, root, db_url)
        except BaseException:
            self.close()
            raise
        self.address, self.root, self.lab, self.nbgrader_args = address, root, lab, nbgrader_args

    def describe(self) -> str:
        return f"{len(self.client.scheduler_info()['workers'])} Dask workers at {self.client.scheduler.address}"

    def run(self, students: list[str], log_path: str) -> Iterator[Outcome]:
        """Grade `students`, one task each; yields each outcome as it arrives."""
        from distributed import as_completed

        futures = {self.client.submit(grade_on_worker, self.root, self.lab, student, self.nbgrader_args, self.threads,
                                      log_path, key=f"grade-{self.lab}-{student}", pure=False): student
                   for student in students}
        try:
            for future in as_completed(futures):
                student = futures[future]
                try:
                    result = future.result()
                except Exception as err:  # KilledWorker: its task killed allowed-failures workers
                    yield Outcome(student, "failed", messages=[f"not graded: {type(err).__name__}: {err}"])
                    continue
                yield Outcome(student, "graded" if result["ok"] else "failed", result["seconds"],
                              result["messages"])
        finally:
            self.client.cancel(list(futures))

    def close(self) -> None:
        """Disconnect; stop the cluster if this runner started it (local:N). Safe to call twice."""
        cluster = self.client.cluster
        with contextlib.suppress(Exception):
            self.client.close()
        if cluster is not None:
            with contextlib.suppress(Exception):
                cluster.close()
