"""How many threads torch may use in this process, and how they wait: a busy neighbour must not make a lesson crawl.

torch runs each large operation on a pool of OpenMP threads, one per core by default, which meet at a barrier
after every operation. By default a waiting thread spins (burns its core, polling) before it sleeps, so when
another process keeps a core busy, the thread that the OS has set aside stalls every barrier and the spinning
ones take the CPU it needs: a training lesson then runs many times slower, not the 2x that sharing a core
explains. Two remedies, both used here:
- waiting threads spin briefly, then sleep (`spin_briefly_then_sleep`). Sleeping at once (`OMP_WAIT_POLICY=PASSIVE`)
  frees the core, but then every small operation of the course's small models pays for waking its threads up: on
  2 cores that made the training lessons slower alone than on one thread. A spin of `BRIEF_SPIN` turns of GNU
  OpenMP's wait loop (well under a millisecond; `GOMP_SPINCOUNT`, read by the libgomp that torch's Linux wheels
  ship) catches the next operation and still gives the core away soon; other OpenMP runtimes sleep at once.
  OpenMP reads both variables when torch is imported, so `import gptcourse` sets them (unless you set either)
  and the lessons import gptcourse before torch. `python -m gptcourse.bench_lessons --wait` compares the three.
- a thread budget: processes that run side by side (pytest's workers, `gptcourse autograde`'s kernels) split
  the cores between them (`thread_share`) instead of each starting one thread per core. A process that was
  given OMP_NUM_THREADS keeps that budget and passes it on.
`python -m gptcourse.bench_lessons` measures each lesson alone and beside another one.
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

WAIT_POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
BRIEF_SPIN = "1000"  # on 2 cores, 3000 and 10000 gained nothing alone and cost more beside a busy neighbour
THREADS = "OMP_NUM_THREADS"
WAITS = {  # how OpenMP's threads wait, by name: the course's way, and the two it sits between
    "brief-spin": {WAIT_POLICY: "PASSIVE", SPIN_COUNT: BRIEF_SPIN},
    "passive": {WAIT_POLICY: "PASSIVE", SPIN_COUNT: "0"},
    "active": {WAIT_POLICY: "ACTIVE", SPIN_COUNT: "infinite"},
}


def spin_briefly_then_sleep(environ: MutableMapping[str, str] = os.environ) -> None:
    """OpenMP threads spin briefly, then sleep, while they wait, unless `environ` already says how they wait
    (effective before torch's import)."""
    if WAIT_POLICY not in environ and SPIN_COUNT not in environ:
        environ.update(WAITS["brief-spin"])


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS has one, e.g. a container's share)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def thread_budget(environ: MutableMapping[str, str] = os.environ) -> int:
    """The threads this process may use: OMP_NUM_THREADS if its parent set it to a whole number, else its cores."""
    given = environ.get(THREADS, "")
    return int(given) if given.isdigit() and int(given) > 0 else cores()


def thread_share(workers: int, environ: MutableMapping[str, str] = os.environ) -> int:
    """Threads for each of `workers` processes that run at once on this process's budget (at least one)."""
    if workers < 1:
        raise ValueError(f"workers={workers}: expected at least one process to share the threads between")
    return max(1, thread_budget(environ) // workers)
