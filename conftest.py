"""Root pytest configuration, loaded before anything imports torch.

Under pytest-xdist every core already runs a worker, so each worker (and each Jupyter kernel it starts for nbval
or nbgrader, which inherit the environment) gets one torch thread: two threads per worker on a loaded 2-core
machine made the suite up to 15x slower (measured by `tests/test_train.py`: 317 s against 22 s).
"""

import os

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
