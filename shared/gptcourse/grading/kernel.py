"""`check(test_id, obj)`: what a lab's test cell calls, inside the student's kernel.

Where the student validates, `check` makes the inputs, runs the case and judges it on the spot. In a graded
kernel (the grader set `kernel_inputs.INPUTS_ENV`) the package is a view without the lab's references
(`package_view.py`): `check` runs the case on the grader's inputs and records the payload, which only the grader
judges. A payload that fails whatever the expected values (an error, a reference) still fails at once, as it
does when validating, and a cell's later checks after a failing one are judged as not run (`judge.judge_cell`).
A hidden case arrives under an opaque handle instead of its id (`handles.py`).
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from ..checks import CheckFailed
from .cases import Case, CaseId, case_inputs, case_seed, get_case
from .forbidden import calls_to, reference_behind
from .handles import is_handle, run_of
from .kernel_inputs import INPUTS_ENV, graded_inputs
from .payload import MIME, judge_payload, make_payload
from .piece import forbidden_names
from .student import describe_error


def _emit(payload: dict[str, Any]) -> None:
    """Put the payload in the cell's outputs (nothing visible: its text/plain is empty)."""
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        from IPython.display import display

        display({MIME: payload, "text/plain": ""}, raw=True)


def check(test_id: str, student_obj: Any) -> None:
    """Run case `test_id` on the student's function or class, record the result, and judge it (in a graded kernel,
    only a result that fails whatever the expected values: the grader judges the rest).

    Prints a one-line message, or raises CheckFailed whose notebook display is only the diagnostic. An
    object that is, subclasses or wraps a reference the lab forbids for this piece is not run, and one whose code
    calls such a reference while the case runs loses its outputs: the payload says what it is or calls, and the
    grader zeroes the piece.
    """
    if is_handle(test_id):
        return _check_handle(test_id, student_obj)
    case = get_case(test_id)
    seed = case_seed(case)
    case_id = CaseId.parse(case.id)
    names = forbidden_names(case_id.lab).get(case_id.piece, ())
    reference = reference_behind(student_obj, names)
    payload = make_payload(case.id, seed, None, None, reference) if reference else \
        run_case(case, seed, student_obj, names)
    _emit(payload)
    if INPUTS_ENV in os.environ and payload["error"] is None and payload["reference"] is None:
        print(f"{case.id} recorded: judged by the grader")
        return
    passed, message = judge_payload(payload)  # an error or a reference needs no expected values
    if not passed:
        raise CheckFailed(message) from None
    print(message)


def _check_handle(handle: str, student_obj: Any) -> None:
    """A hidden case under its handle (`handles.py`): run the call its entry names on its inputs and record the
    payload under the handle; this kernel never learns which case it was. The grader judges it."""
    try:
        entry = graded_inputs(handle)
        lab, piece = entry["piece"].split(".")
        run = run_of(entry)
    except Exception as err:  # the file is the grader's: only a notebook that rewrote it can break it
        payload = make_payload(handle, 0, None, f"the grader's inputs of this test are unreadable ({err!r:.200})")
    else:
        names = forbidden_names(lab).get(piece, ())
        reference = reference_behind(student_obj, names)
        payload = (make_payload(handle, 0, None, None, reference) if reference
                   else run_on(run, handle, 0, entry["inputs"], student_obj, names))
    _emit(payload)
    if payload["error"] is not None or payload["reference"] is not None:
        raise CheckFailed("a hidden test failed: the grader's report says why") from None
    print("hidden test recorded: judged by the grader")


def run_case(case: Case, seed: int, student_obj: Any, forbidden: tuple[str, ...] = ()) -> dict[str, Any]:
    """The payload of the case run on the student's object: its outputs, or the error it raised (`run_on`)."""
    try:
        inputs = graded_inputs(case.id)
    except Exception as err:  # the file is the grader's: only a notebook that rewrote it can break it
        return make_payload(case.id, seed, None, f"the grader's inputs of this test are unreadable ({err!r:.200})")
    return run_on(case.call, case.id, seed, case_inputs(case, seed) if inputs is None else inputs, student_obj,
                  forbidden)


def run_on(run: Any, test_id: str, seed: int, inputs: Any, student_obj: Any,
           forbidden: tuple[str, ...] = ()) -> dict[str, Any]:
    """The payload of `run(student_obj, inputs)` recorded as `test_id`: its outputs, or the error it raised; or,
    if the student's code called one of the `forbidden` references on the way, that call (whatever the run
    returned or raised: in a graded kernel the reference is a stub that raises)."""
    with calls_to(forbidden) as called:
        try:
            with warnings.catch_warnings():  # a warning on stderr would fail the cell under nbgrader
                warnings.simplefilter("ignore")
                outputs = run(student_obj, inputs)
            payload = make_payload(test_id, seed, outputs, None)
        except CheckFailed as failure:
            payload = make_payload(test_id, seed, None, str(failure))
        except Exception as err:  # the student's code may raise anything; it becomes the diagnostic
            payload = make_payload(test_id, seed, None, describe_error(err))
    return make_payload(test_id, seed, None, None, ("calls", called[0])) if called else payload
