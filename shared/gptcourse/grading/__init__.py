"""Grading the labs: one registry of test cases, used by the notebooks' test cells and by the grader.

The test-cell pattern
---------------------
Every autograded test cell of a lab is one call, and nothing else:

    check("02.causal_mask.visible", causal_mask)        # a function the student wrote
    check("02.head.visible", AttentionHead)             # or a class: built with the case's sizes

A hidden test cell holds the same kind of calls between nbgrader's markers, so the released lab shows only
the comment above them:

    # Hidden tests: other sizes, T=1, batch 1 (they run when the lab is graded).
    ### BEGIN HIDDEN TESTS
    check("02.causal_mask.hidden_single", causal_mask)
    check("02.causal_mask.hidden_sizes", causal_mask)
    ### END HIDDEN TESTS

The inputs, the expected values and the verdict all live in the package (`gptcourse.grading.labs.labNN`), so
a test cell's source reveals nothing, and the test ids are what the gradebook, the feedback and
`gptcourse progress` report.

What `check(test_id, obj)` does, in the student's kernel (`kernel.py`):
1. looks up the `Case` (`cases.py`) and its seed: a fixed public hash for visible cases, a hash of the course
   secret (env GPTCOURSE_SECRET) for hidden ones;
2. if `obj` is, subclasses or wraps a reference the lab forbids for that piece (`forbidden.reference_behind`),
   the case is not run and the payload says what it found; else
   `case.make_inputs(seed)` -> inputs; `case.run(obj, inputs)` calls the student's code (a module is built with
   the case's sizes and *reference weights loaded into it*, so random init never decides a grade) and returns
   plain outputs; an exception in the student's code becomes a message naming it and the line of their code;
3. emits a display_data output of mimetype `application/vnd.gptcourse.result+json` holding the outputs as
   plain data (dtype, shape, base64 bytes) or the error text (`payload.py`);
4. judges it with `judge_payload(payload)`: recompute the inputs from the seed, the expected outputs with the
   reference implementation, and call `case.judge(got, expected, inputs)`, which raises `CheckFailed` with a
   teaching message (`gptcourse.checks`). A failure is raised as `CheckFailed` (an AssertionError, so nbgrader
   scores the cell 0) whose notebook display is the message only, never a traceback or test source; a pass
   prints one line.
`judge_payload` needs only the payload, so a grader process where no student code ran can re-judge the
notebook's recorded results with the same registry.

Grading a class: what `nbgrader autograde LAB` does with the committed nbgrader_config.py
-------------------------------------------------------------------------------------------
Student code runs only in the student's kernel; the verdict is reached in the grader's process, from plain data.
1. Read (`sanitize.TolerantNotebookExporter`): a file that is not a notebook becomes an empty one (0 points,
   report line); nbformat 3 is upgraded.
2. Restore (`sanitize.RestoreCells`, first sanitize step): the notebook is rebuilt from the gradebook's cells in
   the source notebook's order; deleted, retyped, edited or duplicated instructor cells are restored; the
   student's solution cells and added cells keep their code; each repair is a report line.
3. Execute (`execute.RobustExecute`): a dead or hung kernel is restarted, the earlier non-test cells re-run,
   grading goes on after the cell that broke it; output capped; every kernel runs in a bubblewrap sandbox
   (`sandbox.py`: only the interpreter and the package in view, a scratch folder with that submission alone, an
   unprivileged user, no network, limits; nothing outlives it), or grading does not start.
4. Judge (`judge.JudgeTestCells`, before SaveAutoGrades): each test cell's expected ids come from its restored
   source; exactly one payload per id with the grader's seed, re-judged here; outputs rewritten to the verdict.
   In-kernel monkeypatching, printed text, raised or hidden errors cannot earn points. Pieces whose reference
   the student's cells import or use, or whose tested object the kernel reports as a reference (`FORBIDDEN` in
   labNN.py, `forbidden.py`), score 0.
5. Sanitize (`active_content.SanitizeOutputs`, after the judge): outputs and the student's markdown become data
   (allowlisted mimetypes, HTML/SVG cleaned with nh3, no script, widgets or javascript: links), since the
   formgrader shows the notebook in the Jupyter server's origin; each removal is a report line.
6. Report (`report.WriteGradingReport`, last): grading/reports/<lab>/<student>.txt and a cell atop the notebook.
`nbgrader generate_feedback` cuts hidden-test regions (`feedback.HideHiddenTests`). The course secret comes from
env GPTCOURSE_SECRET or grading/secret.txt (nbgrader_config.py); it stays in the grader: a kernel gets only the
seeds of its lab's hidden cases for the student graded (`cases.kernel_environment`). A submission without the
lab's notebook (only a misnamed copy) is graded 0 with a report line naming the file to rename
(`sanitize.expect_lab_notebooks`); a folder with no notebook, which nbgrader skips, gets a report
(`report.report_folders_without_notebook`).
In the sandbox the kernel grading lab NN sees a view of the package without that lab's references nor the cases'
references and judges (`package_view.py`): the grader writes the lab's case inputs into the box
(`kernel_inputs.py`), `check` there only runs the case and records the payload, and step 4 judges it (a test after
a failing one in the same cell counts as not run, as where `check` raises).
Limits: the sandbox needs Linux, bubblewrap and (for a grader that is not root) user namespaces; where it cannot
start, `c.Sandbox.allow_unsandboxed = True` grades with kernels that run as the grader's user, with its powers.
The forbidden-reference scan resolves names as Python does and follows imports, aliases, scopes, subclasses and
`getattr` with a constant, and flags the import machinery; the run-time check in the kernel is a second line
that a tampered kernel can only blind to its own use. Neither sees source copied from the package;
in the sandbox there is none to copy (the view above).

Adding a case (a lab author)
----------------------------
In `gptcourse/grading/labs/labNN.py` (imported automatically), write `make_inputs(seed)`, `run(obj, inputs)`,
`reference(inputs)` and `judge(got, expected, inputs)` and `register(Case(id, what, make_inputs, run,
reference, judge, hidden=...))`; a hidden case draws its sizes with `sizes_rng(seed)` and tensors with
`tensor_rng(seed)`. Ids are "NN.piece.variant"; hidden ids start their variant with "hidden".
In a graded kernel only `run` is called, in the view of the package: it may call the student's object and
helpers, never a reference (a stub there); `make_inputs` runs in the grader and returns plain data (tensors,
numbers, strings, lists, dicts, `GPTConfig`), which the kernel loads with `torch.load(weights_only=True)`.
Declare `FORBIDDEN = {piece: ("gptcourse.Name", "gptcourse.some.module", ...)}`: the references a student must
not use for that piece (a module stands for every function and class it defines). tests/test_grading_forbidden.py
checks every name resolves, and that each form of importing, subclassing or wrapping it costs the piece.
"""

from __future__ import annotations

import importlib
from typing import Any

# name -> the module that defines it; imported on first use, so `gptcourse autograde --help` needs no torch
_MODULE_OF = {"CheckFailed": "..checks", "CASES": ".cases", "Case": ".cases", "case_seed": ".cases",
              "get_case": ".cases", "register": ".cases", "check": ".kernel", "MIME": ".payload",
              "judge_payload": ".payload"}
__all__ = sorted(_MODULE_OF)


def __getattr__(name: str) -> Any:
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_MODULE_OF[name], __name__), name)
    globals()[name] = value
    return value
