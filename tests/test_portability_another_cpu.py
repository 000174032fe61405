"""The lessons reproduce on another machine: every lesson in lessons/ passes nbval, against the outputs saved on
the machine that recorded it, when torch computes as a CPU without AVX does and with two threads.

A student's laptop rounds floating-point sums differently from the recording machine: other vector units
(`ATEN_CPU_CAPABILITY=default` makes torch use its plain C++ kernels, `MKL_ENABLE_INSTRUCTIONS=SSE4_2` keeps MKL's
matrix products off AVX), or another number of threads (each sums its own share; the main run has one thread per
pytest worker). Either one changes the last bits of a matmul, and 200 training steps turn that into a different
model, different entropies and different samples. So a lesson prints such values for reading (its cell's output
is not compared) and asserts what its prose claims with a tolerance; this test proves it on the one machine CI
has. Both changes are made in one run, so that the lessons execute once more, not twice: a failure names both,
and rerunning with one of them (`ANOTHER_CPU` below) tells which. nbval runs in a fresh pytest process, because
torch reads these settings once, when it is imported. Two threads on one worker's share of the cores is the one
place the suite oversubscribes on purpose (it is what is tested); they wait passively, as every test's do.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
LESSONS = sorted((ROOT / "lessons").glob("*.ipynb"))
ANOTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "GPTCOURSE_TORCH_THREADS": "2"}


def test_lessons_reproduce_on_another_cpu() -> None:
    """Fail, saying what to do, unless every lesson passes nbval under ANOTHER_CPU."""
    assert LESSONS, "no notebooks found in lessons/"  # (and a child pytest without paths would run everything)
    command = [sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-q", "--no-header",
               "--nbval-cell-timeout=1200",  # what this test checks is the numbers, not the speed
               *(str(p.relative_to(ROOT)) for p in LESSONS)]
    proc = subprocess.run(command, cwd=ROOT, env={**os.environ, **ANOTHER_CPU}, capture_output=True, text=True,
                          timeout=3600)
    settings = " ".join(f"{k}={v}" for k, v in ANOTHER_CPU.items())
    assert proc.returncode == 0, (
        f"with {settings} a lesson's saved outputs do not reproduce. A value that depends on floating-point "
        "rounding must be asserted with a tolerance in its cell, and the cell tagged nbval-ignore-output (or "
        f"printed rounded so that it cannot change); then re-run the notebook.\n{proc.stdout[-6000:]}")


def test_torch_takes_the_plain_cpu_path_with_two_threads() -> None:
    """Without this the variant could pass by computing exactly as the recording machine did."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
    env = {**os.environ, **ANOTHER_CPU, "OMP_NUM_THREADS": ANOTHER_CPU["GPTCOURSE_TORCH_THREADS"]}
    proc = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split() == ["DEFAULT", "2"], proc.stdout + proc.stderr
