"""Root pytest configuration, loaded before anything imports torch.

Every test process, and every Jupyter kernel it starts for nbval or nbgrader (they inherit the environment), gets
one torch thread:
- under pytest-xdist each core already runs a worker, and two threads per worker on a loaded 2-core machine made
  the suite up to 15x slower (measured by `tests/test_train.py`: 317 s against 22 s);
- floating-point sums depend on the thread count, and 200 training steps amplify that: lesson 07's outputs are
  recorded with one thread, so they reproduce under nbval whether or not xdist is used.
"""

import os

import pytest

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
