"""Every lesson reproduces when torch computes as a CPU without AVX does, on one thread (see tests/portability.py)."""

import os
import subprocess
import sys

import pytest
from portability import VARIANTS, check_lessons_reproduce

pytestmark = pytest.mark.slow


def test_lessons_reproduce_without_avx() -> None:
    check_lessons_reproduce("cpu_without_avx")


def test_torch_takes_the_plain_cpu_path() -> None:
    """Without this the variant could pass by computing exactly as the recording machine did."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    proc = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **VARIANTS["cpu_without_avx"]},
                          capture_output=True, text=True, timeout=120)
    assert proc.stdout.strip() == "DEFAULT", proc.stdout + proc.stderr
