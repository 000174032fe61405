"""What a graded kernel runs of the grading modules is stated (tests/kernel_views.json), and runs in each lab's view.

Without a box or nbgrader (`kernel_views.py` says how): a call that reaches a grading helper the view's closure
misses (through `globals()[...]`, say) is otherwise found only by a lab's round trip, minutes later.
"""

from __future__ import annotations

import json

from kernel_views import STATEMENT, WRITE, differences, kept, labs, run


def test_the_statement_is_what_the_views_keep():
    found = differences(json.loads(STATEMENT.read_text()), kept())
    assert not found, (
        f"what the graded kernels keep of the grading modules differs from {STATEMENT.name} (+ kept, not stated; "
        "- stated, no longer kept):\n" + "\n".join(found) + "\nEvery lab's view keeps all the names stated. If the "
        f"change is meant (a lab's calls now reach these names in every graded kernel), restate it: {WRITE}")


def test_every_case_call_runs_in_its_labs_view(tmp_path):
    found = run(labs(), tmp_path)
    failed = [f"lab {lab}, {test}: {error}" for lab, (errors, _) in found.items() for test, error in errors.items()]
    assert not failed, (
        "these cases fail in their lab's view of the package, run on the solution's objects (\"solution\") or on "
        "the untouched release's (\"release\": only where they reach a stub). A grading module's name that is "
        "not available there is a stub the view's closure missed: reach it by name from the case's call (see "
        "docs/grading.md); `python tests/kernel_views.py run NN` reruns lab NN.\n" + "\n".join(failed))
