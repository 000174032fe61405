"""How long each lesson takes to run top to bottom, as a student runs it, alone and beside a busy neighbour.

    python -m gptcourse.bench_lessons                   # every lesson in ./lessons, alone and beside lesson 07
    python -m gptcourse.bench_lessons 07 10 --simd all  # some lessons, also as a CPU without AVX computes
    python -m gptcourse.bench_lessons 10 --beside busy-loop --wait all   # what each way of waiting costs

Each lesson is executed top to bottom in a fresh kernel (as Run All in JupyterLab; `gptcourse.notebook_run`, which
is nbclient as `jupyter nbconvert --execute` runs it, minus a widget capture that can hang it; the output is thrown
away); its wall time and CPU time (the converter, its kernel and what they start, from the operating
system's accounting of the finished process tree) are printed per condition:
- alone: nothing else of ours runs (the machine's load average is printed: a shared machine is never idle);
- beside: while a neighbour keeps running, either another lesson executed in a loop (`--neighbour`, default
  lesson 07, the training lesson) or a single-threaded busy loop (`--beside busy-loop`);
- `--simd native` (this CPU's vector units) and/or `baseline` (`ATEN_CPU_CAPABILITY=default`,
  `MKL_ENABLE_INSTRUCTIONS=SSE4_2`: torch's plain C++ kernels, as a CPU without AVX runs them).
The lessons import gptcourse before torch, so their waiting threads spin briefly, then sleep (`gptcourse.threads`);
`--wait passive` (sleep at once) and `--wait active` (spin forever) show what either extreme costs, alone and beside.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from .threads import WAITS

SIMD = {"native": {}, "baseline": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"}}
BUSY_LOOP = "while True: pass"


@dataclass(frozen=True)
class Timing:
    lesson: str
    simd: str
    wait: str  # how torch's threads wait (`threads.WAITS`)
    beside: str  # "alone", or what ran beside it
    wall_s: float
    cpu_s: float
    ok: bool


def execute_command(notebook: Path) -> list[str]:
    """Run `notebook` top to bottom in a fresh kernel (exit status 1 if a cell fails)."""
    return [sys.executable, "-m", "gptcourse.notebook_run", str(notebook)]


def timed_run(command: list[str], env: dict[str, str]) -> tuple[float, float, bool]:
    """(wall seconds, CPU seconds of the process and every descendant it waited for, exit status 0)."""
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime, proc.returncode == 0


@contextlib.contextmanager
def neighbour(kind: str, notebook: Path | None, env: dict[str, str]) -> Iterator[None]:
    """While the block runs: `notebook` executed over and over ("lesson"), or a busy loop ("busy-loop")."""
    if kind == "busy-loop" or notebook is None:
        command = [sys.executable, "-c", BUSY_LOOP]
    else:
        run = execute_command(notebook)
        loop = f"import subprocess\nwhile True:\n    subprocess.run({run!r}, stdout=subprocess.DEVNULL)"
        command = [sys.executable, "-c", loop]
    proc = subprocess.Popen(command, env=env, start_new_session=True)
    try:
        time.sleep(2)  # the neighbour's kernel is up and computing before the measured lesson starts
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        proc.wait()


def measure(lessons: list[Path], simd: list[str], beside: str, neighbour_lesson: Path | None,
            waits: list[str]) -> Iterator[Timing]:
    """Each lesson alone, then beside the neighbour, for each SIMD setting and way of waiting."""
    for level, wait in itertools.product(simd, waits):
        env = {**os.environ, **SIMD[level], **WAITS[wait]}
        for lesson in lessons:
            yield Timing(lesson.stem, level, wait, "alone", *timed_run(execute_command(lesson), env))
            with neighbour(beside, neighbour_lesson, env):
                what = neighbour_lesson.stem if neighbour_lesson is not None else beside
                yield Timing(lesson.stem, level, wait, what, *timed_run(execute_command(lesson), env))


def find_lessons(folder: Path, numbers: list[str]) -> list[Path]:
    """The lessons in `folder` whose number is in `numbers` (all of them if empty)."""
    found = sorted(folder.glob("[0-9][0-9]_*.ipynb"))
    if not found:
        raise SystemExit(f"no lessons (NN_topic.ipynb) in {folder}: run from the course root or pass --lessons-dir")
    chosen = [p for p in found if not numbers or p.name[:2] in numbers]
    missing = sorted(set(numbers) - {p.name[:2] for p in found})
    if missing:
        raise SystemExit(f"no lesson numbered {', '.join(missing)} in {folder}; there are "
                         f"{', '.join(p.name[:2] for p in found)}")
    return chosen


def table(timings: list[Timing]) -> str:
    lines = [f"{'lesson':32s} {'simd':8s} {'wait':10s} {'beside':28s} {'wall s':>7s} {'cpu s':>7s} {'x alone':>7s}"]
    alone = {(t.lesson, t.simd, t.wait): t.wall_s for t in timings if t.beside == "alone"}
    for t in timings:
        first = alone.get((t.lesson, t.simd, t.wait))
        ratio = t.wall_s / first if first else float("nan")
        flag = "" if t.ok else "  FAILED"
        lines.append(f"{t.lesson:32s} {t.simd:8s} {t.wait:10s} {t.beside:28s} {t.wall_s:7.1f} {t.cpu_s:7.1f} "
                     f"{ratio:7.2f}{flag}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Time each lesson alone and beside a busy neighbour.")
    parser.add_argument("lessons", nargs="*", metavar="NN", help="lesson numbers (default: all)")
    parser.add_argument("--lessons-dir", type=Path, default=Path("lessons"))
    parser.add_argument("--simd", choices=["native", "baseline", "all"], default="native")
    parser.add_argument("--beside", choices=["lesson", "busy-loop"], default="lesson")
    parser.add_argument("--neighbour", default="07", metavar="NN", help="the lesson run beside (default 07)")
    parser.add_argument("--wait", choices=[*WAITS, "all"], default="brief-spin",
                        help="how torch's threads wait (default: as the lessons do, a brief spin, then sleep)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line instead of the table")
    args = parser.parse_args(argv)
    lessons = find_lessons(args.lessons_dir, args.lessons)
    neighbour_lesson = find_lessons(args.lessons_dir, [args.neighbour])[0] if args.beside == "lesson" else None
    simd = list(SIMD) if args.simd == "all" else [args.simd]
    waits = list(WAITS) if args.wait == "all" else [args.wait]
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the start", file=sys.stderr)
    timings = []
    for timing in measure(lessons, simd, args.beside, neighbour_lesson, waits):
        timings.append(timing)
        print(f"{timing.lesson} {timing.simd} {timing.wait} {timing.beside}: {timing.wall_s:.1f} s", file=sys.stderr)
    if args.json:
        print("\n".join(json.dumps(asdict(t)) for t in timings))
    else:
        print(table(timings))
    if not all(t.ok for t in timings):
        raise SystemExit("a lesson failed to run (rerun it in JupyterLab to see why)")


if __name__ == "__main__":
    main()
