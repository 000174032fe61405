"""A check's result as plain data, and the verdict on it.

The payload is what leaves the student's kernel (a display_data output of mimetype `MIME` in the notebook):

    {"format": 1, "test_id": "02.causal_mask.visible", "seed": 123,
     "outputs": {"mask": {"dtype": "bool", "shape": [4, 4], "data": "<base64 bytes>"}, "n": {"value": 3}},
     "error": null, "reference": null}

`outputs` is null and `error` a message when the student's code failed before producing outputs. `reference` is
what the kernel's run-time check found when the object under test is, subclasses or wraps a reference of that
piece (`forbidden.reference_behind`), e.g. {"how": "subclasses", "name": "gptcourse.AttentionHead"}; the case is
then not run, and the test fails.
`judge_payload` needs only this dict and the case registry: it recomputes the inputs from the seed and the
expected outputs from the reference implementation, so it can run in a process where no student code ran.
"""

from __future__ import annotations

import base64
import re
import textwrap
from typing import Any, NamedTuple

import numpy as np
import torch

from ..checks import CheckFailed
from .cases import case_expected, case_inputs, case_seed, get_case
from .forbidden import HOW

MIME = "application/vnd.gptcourse.result+json"
FORMAT = 1
MAX_ELEMENTS = 1_000_000  # per output tensor: a runaway shape must not bloat the notebook
MAX_MESSAGE = 2000  # characters of an error message recorded by the student's kernel
_DTYPES = {"float32", "float64", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"}


def encode_value(value: Any) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().as_subclass(torch.Tensor).contiguous()
        if type(t) is not torch.Tensor:
            raise CheckFailed(f"an output is a {type(value).__name__}, expected a plain torch.Tensor")
        if t.dtype == torch.bfloat16:
            t = t.float()
        if t.numel() > MAX_ELEMENTS:
            raise CheckFailed(f"an output has {t.numel():,} elements (shape {tuple(t.shape)}), far more than expected")
        array = t.numpy()
        if array.dtype.name not in _DTYPES:
            raise CheckFailed(f"an output has dtype {t.dtype}, which a check cannot compare")
        data = base64.b64encode(array.tobytes()).decode()
        return {"dtype": array.dtype.name, "shape": list(array.shape), "data": data}
    if value is None or type(value) in (bool, int, float, str):
        return {"value": value}
    raise TypeError(f"a case's run must return tensors, numbers or strings, got {type(value).__name__}")


def decode_value(encoded: Any) -> Any:
    """A value from its encoding: a new plain tensor built from the raw bytes, or a number/string/None.

    Whatever the encoding holds (it comes from the student's kernel), this returns plain data or raises
    ValueError saying what is wrong with it.
    """
    if not isinstance(encoded, dict):
        raise ValueError(f"an output is encoded as {type(encoded).__name__}, not an object")
    if "value" in encoded:
        value = encoded["value"]
        if value is not None and type(value) not in (bool, int, float, str):
            raise ValueError(f"an output value is a {type(value).__name__}")
        return value
    dtype, shape, data = encoded.get("dtype"), encoded.get("shape"), encoded.get("data")
    if dtype not in _DTYPES:
        raise ValueError(f"unsupported dtype {dtype!r}")
    if not (isinstance(shape, list) and len(shape) <= 8
            and all(type(n) is int and 0 <= n <= MAX_ELEMENTS for n in shape)):
        raise ValueError(f"bad shape {str(shape)[:80]}")
    if not isinstance(data, str):
        raise ValueError("the tensor's bytes are missing")
    elements = int(np.prod(shape, dtype=np.int64))
    if elements > MAX_ELEMENTS:
        raise ValueError(f"{elements:,} elements, more than {MAX_ELEMENTS:,}")
    try:
        raw = base64.b64decode(data, validate=True)
    except (ValueError, TypeError) as err:
        raise ValueError(f"the tensor's bytes are not base64 ({err})") from None
    if len(raw) != elements * np.dtype(dtype).itemsize:
        raise ValueError(f"{len(raw)} bytes for shape {shape} of {dtype}")
    array = np.frombuffer(raw, dtype=np.dtype(dtype)).reshape(shape)
    return torch.from_numpy(array.copy())


def make_payload(test_id: str, seed: int, outputs: dict[str, Any] | None, error: str | None,
                 reference: tuple[str, str] | None = None) -> dict[str, Any]:
    encoded = None if outputs is None else {name: encode_value(v) for name, v in outputs.items()}
    found = None if reference is None else {"how": reference[0], "name": reference[1]}
    return {"format": FORMAT, "test_id": test_id, "seed": seed, "outputs": encoded, "error": error,
            "reference": found}


_REFERENCE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,199}")


def reference_text(reported: Any) -> str:
    """What a payload's `reference` says, as the end of "the object under test ...": "is gptcourse.attention".

    Only a tampered kernel writes a malformed one; it still fails the test, with a line that says so.
    """
    if isinstance(reported, dict) and reported.get("how") in HOW and isinstance(reported.get("name"), str) \
            and _REFERENCE_NAME.fullmatch(reported["name"]):
        return f"{reported['how']} {reported['name']}"
    return "was reported by the kernel as a reference, in a form the grader cannot read"


WIDTH = 84  # `nbgrader validate` cuts lines at 90 characters, after a 4-space indent


def _wrap(message: str) -> str:
    return "\n".join(textwrap.fill(line, WIDTH, break_long_words=False, break_on_hyphens=False,
                                   subsequent_indent="  ") for line in message.splitlines())


class Judged(NamedTuple):
    """The verdict on one payload: passed, the message, how it ended (`OUTCOMES`) and, when the judge recognised
    a known mistake, its key (`checks.Mistake`)."""

    passed: bool
    message: str
    outcome: str
    mistake: str | None = None


# passed; wrong (the judge failed it); error (the student's code raised); reference (a forbidden reference
# under test); stale (another seed or format); unreadable (no such case, malformed outputs, a result twice); and,
# from the judge of a cell (`steps/judge.py`): skipped (after a failing test of its cell), not_run (its cell
# stopped), forged (its kernel sent forged messages)
OUTCOMES = ("passed", "wrong", "error", "reference", "stale", "unreadable", "skipped", "not_run", "forged")


def judge_payload(payload: dict[str, Any], student: str | None = None) -> tuple[bool, str]:
    """(passed, message) for one check's payload, judged with the case registry and the reference code; hidden
    cases with `student`'s seeds (the grader passes the submission's student; a kernel, none: its seeds).

    The message is wrapped to fit `nbgrader validate`'s report.
    """
    return judged(payload, student)[:2]


def judged(payload: dict[str, Any], student: str | None = None) -> Judged:
    """`judge_payload`'s verdict with its outcome and the key of the mistake recognised (for the grader's
    records: `steps/judge.py`)."""
    verdict = _judge(payload, student)
    return verdict._replace(message=_wrap(verdict.message))


def _judge(payload: Any, student: str | None) -> Judged:
    if not isinstance(payload, dict):
        return Judged(False, f"a recorded result is a {type(payload).__name__}, not an object", "unreadable")
    test_id = str(payload.get("test_id"))
    try:
        case = get_case(test_id)
    except KeyError as err:
        return Judged(False, str(err.args[0]), "unreadable")
    seed = case_seed(case, student=student)
    header = f"{case.id} failed: {case.what}" + (" (hidden test)" if case.hidden else "")
    if payload.get("format") != FORMAT or payload.get("seed") != seed:
        return Judged(False, f"{header}\nthe result was computed for other inputs (format {payload.get('format')}, "
                             f"seed {payload.get('seed')}); run the lab's cells again from the top", "stale")
    if payload.get("reference") is not None:
        return Judged(False, f"{header}\nthe object under test {reference_text(payload['reference'])}, the reference "
                             "for a piece you must write: this test earns no points (the lab's intro says which "
                             "imports to use)", "reference")
    if payload.get("error") is not None or payload.get("outputs") is None:
        return Judged(False, f"{header}\n{str(payload.get('error') or 'no result')[:MAX_MESSAGE]}", "error")
    try:
        if not isinstance(payload["outputs"], dict):
            raise ValueError("the outputs are not an object")
        got = {str(name): decode_value(v) for name, v in payload["outputs"].items()}
    except ValueError as err:
        return Judged(False, f"{header}\nthe result could not be read: {err}", "unreadable")
    inputs = case_inputs(case, seed)
    expected = case_expected(case, seed, inputs)
    if set(got) != set(expected):
        return Judged(False, f"{header}\nthe result holds {sorted(got)}, expected {sorted(expected)}", "wrong")
    try:
        case.judge(got, expected, inputs)
    except CheckFailed as failure:
        return Judged(False, f"{header}\n{failure}", "wrong", getattr(failure, "mistake", None))
    except Exception as err:  # odd data (e.g. NaN everywhere) must fail the test, never crash the grader
        return Judged(False, f"{header}\nthe result could not be judged ({type(err).__name__}: {str(err)[:200]})",
                      "wrong")
    return Judged(True, f"✓ {case.id} passed: {case.what}" + (" (hidden test)" if case.hidden else ""), "passed")
