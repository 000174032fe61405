"""Root pytest configuration, loaded before anything imports torch.

Under pytest-xdist every core already runs a worker, so each worker (and each Jupyter kernel it starts for nbval
or nbgrader, which inherit the environment) gets one torch thread: two threads per worker on a loaded 2-core
machine made the suite up to 15x slower (measured by `tests/test_train.py`: 317 s against 22 s).
"""

import os

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """With GPTCOURSE_REQUIRE_ALL=1 (set by .ci/run) a skip is a failure: CI has Chromium, PostgreSQL and every
    optional package, so a test that skips there has lost what it needs, and must not pass silently."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("GPTCOURSE_REQUIRE_ALL") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, but GPTCOURSE_REQUIRE_ALL=1 requires every test to run: {report.longrepr}"
