"""Root pytest configuration, loaded before anything imports torch.

Every test process, and every Jupyter kernel and subprocess it starts for nbval or nbgrader (they inherit the
environment), gets a thread budget, `OMP_NUM_THREADS` = cores // pytest-xdist workers (at least 1; `-n auto`
starts cores + 1 workers, so 1 thread each), and torch's waiting threads spin only briefly, then sleep: threads
that outnumber the cores, or spin while a neighbour runs, made a loaded machine up to 20x slower
(`gptcourse/threads.py`). `GPTCOURSE_TORCH_THREADS=N pytest ...` gives N threads instead.

Lessons run under nbval, and their saved outputs must reproduce on every student's machine, not only on the one
that recorded them: so their kernels compute as ANOTHER CPU does, without AVX, on one thread (`LESSON_KERNELS`;
`tests/test_portability.py` says why and checks that torch obeys). One run proves both that the committed
outputs are what the code computes and that they do not depend on the recording machine's vector units.
`GPTCOURSE_LESSON_CPU=native pytest lessons/...` runs them as this machine computes (e.g. right after recording
a lesson).

nbval compares each output mimetype for equality. The grading payload
(`application/vnd.gptcourse.result+json`, what a lab's `check(...)` emits) holds tensors as raw float bytes whose
last bits depend on the CPU; the verdict line that `check` prints beside it is compared instead.
"""

import os

import pytest
from nbval.plugin import IPyNbFile

from gptcourse.bench_lessons import SIMD
from gptcourse.threads import cores, spin_briefly_then_sleep

WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))  # set by pytest-xdist in each worker
THREADS = os.environ.get("GPTCOURSE_TORCH_THREADS", str(max(1, cores() // WORKERS)))
if not THREADS.isdigit() or int(THREADS) < 1:
    raise pytest.UsageError(f"GPTCOURSE_TORCH_THREADS={THREADS!r}: expected a whole number of threads >= 1")
os.environ["OMP_NUM_THREADS"] = THREADS
os.environ["MKL_NUM_THREADS"] = THREADS
spin_briefly_then_sleep()
LESSON_KERNELS = {**SIMD["baseline"], "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
if os.environ.get("GPTCOURSE_LESSON_CPU", "another") not in ("another", "native"):
    raise pytest.UsageError(f"GPTCOURSE_LESSON_CPU={os.environ['GPTCOURSE_LESSON_CPU']!r}: expected 'another' "
                            "(the default: lessons run as a CPU without AVX) or 'native'")


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto` (the default addopts): one worker more than the cores. A worker spends about a third of its
    time waiting (on a kernel starting, on nbgrader's subprocesses), so with one per core the machine idles; each
    worker, its kernels and its subprocesses use one thread (`THREADS`), so no thread pool outnumbers the cores.
    PYTEST_XDIST_AUTO_NUM_WORKERS=N gives N workers instead (as pytest-xdist itself reads it)."""
    given = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS", "")
    return int(given) if given.isdigit() and int(given) > 0 else cores() + 1


def pytest_collectstart(collector: pytest.Collector) -> None:
    """Leave the grading payload out of nbval's comparison of every notebook it collects."""
    if isinstance(collector, IPyNbFile):
        from gptcourse.grading.payload import MIME

        collector.skip_compare = (*collector.skip_compare, MIME)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> object:
    """A lesson's kernel starts (in the setup of its first cell) with `LESSON_KERNELS` in its environment; the test
    process itself keeps its own settings."""
    if not isinstance(item.parent, IPyNbFile) or os.environ.get("GPTCOURSE_LESSON_CPU") == "native":
        return (yield)
    saved = {name: os.environ.get(name) for name in LESSON_KERNELS}
    os.environ.update(LESSON_KERNELS)
    try:
        return (yield)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    """With GPTCOURSE_REQUIRE_ALL=1 (set by .ci/run) a skip is a failure: CI has Chromium, PostgreSQL and every
    optional package, so a test that skips there has lost what it needs, and must not pass silently."""
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("GPTCOURSE_REQUIRE_ALL") == "1" and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped, but GPTCOURSE_REQUIRE_ALL=1 requires every test to run: {report.longrepr}"


LONGEST_FIRST = (
    "tests/test_grading_cluster.py",
    "tests/test_grading_batch.py",
    "tests/test_labs_09.py",
    "tests/test_labs_16.py",
    "tests/test_labs_15.py",
    "tests/test_grading_sandbox.py",
    "tests/test_labs_14.py",
    "tests/test_labs_11.py",
    "tests/test_labs_07.py",
    "tests/test_labs_12.py",
    "tests/test_grading_attacks.py",
    "tests/browser/test_hub.py",
    "tests/test_labs_13.py",
    "tests/test_labs_06.py",
    "tests/test_labs_08.py",
    "tests/test_labs_10.py",
    "tests/test_grading_memory.py",
    "tests/test_labs_04.py",
    "tests/browser/test_site.py",
    "tests/test_labs_02.py",
    "tests/test_grading_mistake_keys.py",
    "tests/test_labs_03.py",
    "tests/test_kernel_views.py",
    "tests/test_labs_05.py",
    "tests/test_labs_01.py",
    "tests/browser/test_course_in_browser.py",
    "tests/test_grading_package_view.py",
    "tests/test_grading_forbidden.py",
    "tests/test_lazy_mistakes.py",
    "lessons/10_finetuning_and_rewards.ipynb",
    "tests/test_distributed.py",
    "lessons/16_mixture_of_experts.ipynb",
    "tests/test_grading_intake.py",
    "lessons/08_bpe_tokenizer.ipynb",
    "tests/test_grading_postgres.py",
    "lessons/07_training_and_generation.ipynb",
    "lessons/13_preference_optimization.ipynb",
    "lessons/09_training_by_hand.ipynb",
    "lessons/14_evaluating_language_models.ipynb",
    "lessons/15_reinforcement_learning_with_verifiable_rewards.ipynb",
)
# by the summed --durations of CI's run of 61a320d (files over 24 s), longest first; lesson 16 placed by its run
# time since (35 s alone), lab 13 by its in-process blind students since; the mistake keys', kernel views' and
# lazy mistakes' tests by their sums in a 2-worker run (78 s, 52 s, 25 s)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files that take minutes start first, so that under xdist (`--dist loadfile`: a file runs on one worker;
    `--no-loadscope-reorder`: in this order) the other worker works through the short ones meanwhile, instead of
    one worker finishing them alone at the end. The order within a file, and of every other file, is kept."""
    def rank(item: pytest.Item) -> int:
        path = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(path) if path in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)
