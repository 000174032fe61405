"""The lessons reproduce on another machine: every lesson in lessons/ passes nbval, against the outputs saved on
the machine that recorded it, when torch computes as a CPU without AVX does, and when it uses two threads.

A student's laptop rounds floating-point sums differently from the recording machine: other vector units
(`ATEN_CPU_CAPABILITY=default` makes torch use its plain C++ kernels, `MKL_ENABLE_INSTRUCTIONS=SSE4_2` keeps MKL's
matrix products off AVX), or another number of threads (each sums its own share). Either one changes the last bits
of a matmul, and 200 training steps turn that into a different model, different entropies and different samples.
So a lesson prints such values for reading (its cell's output is not compared) and asserts what its prose claims
with a tolerance; this test proves it on the one machine CI has. Each variant runs nbval in a fresh pytest
process, because torch reads these settings once, when it is imported. The variants' tests are in two files,
tests/test_portability_*.py, so that pytest-xdist (which keeps a file on one worker) runs them side by side.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))
VARIANTS = {
    "cpu_without_avx": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
                        "GPTCOURSE_TORCH_THREADS": "1"},
    # Passive waiting: on a busy machine (CI's other workers) two spinning threads would crawl, not compute otherwise.
    "two_threads": {"GPTCOURSE_TORCH_THREADS": "2", "OMP_WAIT_POLICY": "PASSIVE"},
}


def run_lessons(environment: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """nbval on every lesson, in a child pytest (one notebook after another) with `environment` added."""
    command = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", "--no-header",
               "--nbval-cell-timeout=1200",  # what this test checks is the numbers, not the speed
               *(str(p.relative_to(ROOT)) for p in LESSONS)]
    return subprocess.run(command, cwd=ROOT, env={**os.environ, **environment}, capture_output=True, text=True,
                          timeout=3600)


def check_lessons_reproduce(variant: str) -> None:
    """Fail, saying what to do, unless every lesson passes nbval under VARIANTS[variant]."""
    assert LESSONS, "no notebooks found in lessons/"  # (and a child pytest without paths would run everything)
    proc = run_lessons(VARIANTS[variant])
    settings = " ".join(f"{k}={v}" for k, v in VARIANTS[variant].items())
    assert proc.returncode == 0, (
        f"with {settings} a lesson's saved outputs do not reproduce. A value that depends on floating-point "
        "rounding must be asserted with a tolerance in its cell, and the cell tagged nbval-ignore-output (or "
        f"printed rounded so that it cannot change); then re-run the notebook.\n{proc.stdout[-6000:]}")
