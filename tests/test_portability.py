"""The lessons reproduce on another machine: conftest.py runs every lesson's kernel, under nbval, as a CPU without AVX
computes (`LESSON_KERNELS`); this file checks that torch obeys those settings.

A student's laptop rounds floating-point sums differently from the recording machine: other vector units
(`ATEN_CPU_CAPABILITY=default` makes torch use its plain C++ kernels, `MKL_ENABLE_INSTRUCTIONS=SSE4_2` keeps MKL's
matrix products off AVX), or another number of threads (each sums its own share). Either one changes the last bits
of a matmul, and 200 training steps turn that into a different model, different entropies and different samples. So
a lesson prints such values for reading (its cell's output is not compared) and asserts what its prose claims with a
tolerance. (Not on two threads: that way lesson 10's finetuning asserts passed in one run and failed in the next on
the same busy machine, so two-thread numbers did not even reproduce run to run.) Running the lessons once, this way,
proves both that the committed outputs are what the code computes and that they do not depend on the machine that
recorded them; a lesson that fails only here tells its author to assert with a tolerance
(`GPTCOURSE_LESSON_CPU=native pytest lessons/NN_....ipynb` runs it natively).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What conftest.py's LESSON_KERNELS must amount to, written out here rather than imported from it.
ANOTHER_CPU = {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1"}


def test_torch_takes_the_plain_cpu_path() -> None:
    """Without this the lessons could pass by computing exactly as the recording machine did."""
    probe = "import torch; print(torch.backends.cpu.get_cpu_capability(), torch.get_num_threads())"
    proc = subprocess.run([sys.executable, "-c", probe], env={**os.environ, **ANOTHER_CPU}, capture_output=True,
                          text=True, timeout=120)
    assert proc.stdout.split() == ["DEFAULT", "1"], proc.stdout + proc.stderr


def test_a_lessons_kernel_gets_those_settings(tmp_path: Path) -> None:
    """nbval on a one-cell notebook whose saved output is what the kernel must see, with conftest.py as a plugin."""
    import nbformat

    names = sorted(ANOTHER_CPU)
    cell = nbformat.v4.new_code_cell(f"import os\nprint([os.environ.get(n) for n in {names!r}])", execution_count=1)
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=f"{[ANOTHER_CPU[n] for n in names]}\n")]
    nb = nbformat.v4.new_notebook(cells=[cell])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, tmp_path / "probe.ipynb")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("GPTCOURSE_LESSON_CPU", None)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "--nbval",
                           "-q", str(tmp_path / "probe.ipynb")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:]
