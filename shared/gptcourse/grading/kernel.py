"""`check(test_id, obj)`: what a lab's test cell calls, inside the student's kernel."""

from __future__ import annotations

import warnings
from typing import Any

from ..checks import CheckFailed
from .cases import Case, case_seed, forbidden_names, get_case
from .forbidden import reference_behind
from .payload import MIME, judge_payload, make_payload
from .student import describe_error


def _emit(payload: dict[str, Any]) -> None:
    """Put the payload in the cell's outputs (nothing visible: its text/plain is empty)."""
    from IPython.core.interactiveshell import InteractiveShell

    if InteractiveShell.initialized():
        from IPython.display import display

        display({MIME: payload, "text/plain": ""}, raw=True)


def check(test_id: str, student_obj: Any) -> None:
    """Run case `test_id` on the student's function or class, record the result, and judge it.

    Prints a one-line pass message, or raises CheckFailed whose notebook display is only the diagnostic. An
    object that is, subclasses or wraps a reference the lab forbids for this piece is not run: the payload says
    what it is, and the grader zeroes the piece.
    """
    case = get_case(test_id)
    seed = case_seed(case)
    lab, piece = case.id.split(".")[:2]
    reference = reference_behind(student_obj, forbidden_names(lab).get(piece, ()))
    payload = make_payload(case.id, seed, None, None, reference) if reference else run_case(case, seed, student_obj)
    _emit(payload)
    passed, message = judge_payload(payload)
    if not passed:
        raise CheckFailed(message) from None
    print(message)


def run_case(case: Case, seed: int, student_obj: Any) -> dict[str, Any]:
    """The payload of the case run on the student's object: its outputs, or the error it raised."""
    try:
        with warnings.catch_warnings():  # a warning on stderr would fail the cell under nbgrader
            warnings.simplefilter("ignore")
            outputs = case.run(student_obj, case.make_inputs(seed))
        return make_payload(case.id, seed, outputs, None)
    except CheckFailed as failure:
        error = str(failure)
    except Exception as err:  # the student's code may raise anything; it becomes the diagnostic
        error = describe_error(err)
    return make_payload(case.id, seed, None, error)
