"""Grading the labs: each lab is a table of pieces (`piece.Piece`), and every test cell is one `check` call.

This package holds the pieces: what is graded and how it is judged (piece, cases, student, fixtures, labs/, the
kernel's side: kernel, payload, kernel_inputs, handles; forbidden). Its wings sit above it, each importing only
what is below (pyproject.toml's import-linter contracts): box/ (the isolation), steps/ (nbgrader's steps),
classroom/ (the instructor's tools). Who changes the pieces: whoever adds or changes a lab, a case or a mistake.

How it runs, what leaves the student's kernel and what to edit for what: docs/grading.md. Adding a piece is a row
in its lab module (`labs/labNN.py`), a solution cell and a round-trip entry. The row, here for a piece "double"
of a lab 99 (a real lab ends its module with `declare(...)` of its pieces, which registers their cases):

>>> import torch
>>> from gptcourse.grading.cases import tensor_rng
>>> from gptcourse.grading.piece import Piece
>>> from gptcourse.grading.student import returns
>>> call = returns("y", lambda inputs: "double(x)", "x")  # runs the student's object, or the reference: {"y": fn(x)}
>>> double = Piece("99", "double", lambda x: 2 * x, call, label="the doubled x",
...                visible=[("visible", "double of 3 numbers",
...                          lambda seed: {"x": torch.randn(3, generator=tensor_rng(seed))})],
...                hidden=[("hidden_zeros", "double of zeros", lambda seed: {"x": torch.zeros(4)})],
...                mistakes=lambda inputs: {"x was returned unchanged: multiply it by 2": inputs["x"]})
>>> [case.id for case in double.cases]
['99.double.visible', '99.double.hidden_zeros']
>>> case = double.cases[0]
>>> inputs = case.inputs(0)
>>> case.judge(case.call(lambda x: x + x, inputs), case.expected(inputs), inputs)  # passes: no message
>>> case.judge(case.call(lambda x: x, inputs), case.expected(inputs), inputs)
Traceback (most recent call last):
    ...
gptcourse.checks.CheckFailed: the doubled x: x was returned unchanged: multiply it by 2.

The solution cell has grade_id "double" and defines `double`; its test cells call `check("99.double.visible",
double)`, and the hidden ones stand between nbgrader's hidden-test markers. tests/test_grading_pieces.py fails if
a name disagrees; tests/test_labs_99.py would list the mistakes a round trip grades (`WRONG`).
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
