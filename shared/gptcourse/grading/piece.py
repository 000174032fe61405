"""A lab's graded pieces, declared once each: the function or class a student writes, its reference, its cases.

A `Piece` is one row of a lab's table (`grading/labs/labNN.py`). Its `name` is the name the student writes, and
the same string is the solution cell's `grade_id`, the key of the piece's forbidden references and the middle of
its case ids (`cases.CaseId`): "10.padding_mask.visible". Each row of `visible` and `hidden` is a `(variant, what,
inputs)` triple (a `Probe` may come fourth) and becomes one `Case`: `inputs(seed)` draws the inputs, `call(obj,
inputs)` runs an object on them (in the student's kernel: the student's), and the expected outputs are
`call(reference, inputs)`.

The reference policy: the reference is gptcourse's own function or class, the one the lab teaches and forbids,
run through the same `call` as the student's code; the package's own helpers and constants are imported, never
retyped. A lab declares `expected` instead only where the student's interface differs from the package's (and
says why in a comment there). torch's implementations are peers a judge may compare with, not references.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial, partialmethod
from typing import Any

import torch

from ..checks import Mistakes, check_close, check_dtype, check_shape, fail, mistake_key
from .cases import Case, CaseId, Inputs, Outputs, register, registry

Judge = Callable[[Outputs, Outputs, Inputs], None]
Rows = Mapping[str, Mapping[str, Any]]  # a piece's known mistakes as rows: why -> the switches of its `by_hand`


@dataclass(frozen=True)
class Probe:
    """A test of a piece with a call and a judge of its own, e.g. causality (later inputs never change earlier
    outputs); its expected outputs are still its call on the reference."""

    call: Callable[[Any, Inputs], Outputs]
    judge: Judge


# (variant, what the case tests, inputs(seed)), or with a Probe as a fourth element
Row = tuple[str, str, Callable[[int], Inputs]] | tuple[str, str, Callable[[int], Inputs], Probe]


@dataclass(frozen=True)
class Piece:
    """One graded piece of a lab and its cases.

    call(obj, inputs) -> outputs: runs `obj` (the student's or the reference) on a case's inputs and returns plain
        values; it alone runs in a graded kernel, so it may use the student's object and helpers, never a reference.
    judge(got, expected, inputs): raises CheckFailed with a teaching message. The default compares the single
        output with `check_close` (after `shape` and `dtype`, when declared, and `finite(inputs)`: the message when
        it holds NaN or inf), recognising the known mistakes, computed only for a wrong answer (`known_mistakes`):
        rows {why: switches}, each the output of `by_hand` (the reference written by hand, whose switches give each
        mistake; a class gets them in its constructor) run through `call`, or `mistakes(inputs)` giving those rows
        where a row or its words depend on the case; without `by_hand`, `mistakes(inputs)`: {why: the wrong output
        that mistake gives}.
    forbidden: the dotted names of the references a student must not use for this piece (`forbidden.py`).
    """

    lab: str
    name: str
    reference: Any
    call: Callable[[Any, Inputs], Outputs]
    visible: Sequence[Row]
    hidden: Sequence[Row] = ()
    forbidden: tuple[str, ...] = ()
    judge: Judge | None = None
    mistakes: Rows | Callable[[Inputs], Rows | Mistakes] | None = None
    by_hand: Callable[..., Any] | None = None  # with rows of `mistakes`: the reference by hand, with switches
    label: str = ""  # the output's name in messages ("the pooled states"); default: its key
    shape: str | None = None  # e.g. "B C", with the sizes in inputs["sizes"]
    causes: Mapping[tuple[str, str], str] | None = None  # a wrong size's likely cause (`check_shape`)
    dtype: tuple[torch.dtype, str] | None = None  # (dtype, why that one)
    finite: Callable[[Inputs], str] | None = None  # what a NaN or inf in the output means (e.g. an overflow)
    atol: float = 1e-5
    rtol: float = 1e-4
    expected: Callable[[Inputs], Outputs] | None = None  # only where `call(reference, inputs)` cannot be used
    cases: tuple[Case, ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.mistakes, Mapping) and self.by_hand is None:
            raise ValueError(f"piece {self.lab}.{self.name}: mistakes as rows {{why: switches}} need by_hand=")
        rows = [(row, False) for row in self.visible] + [(row, True) for row in self.hidden]
        cases = []
        for (variant, what, inputs, *probe), hidden in rows:
            call, judge = (probe[0].call, probe[0].judge) if probe else (self.call, self.judge or self.compare)
            expected = self.expected if self.expected and not probe else partial(call, self.reference)
            cases.append(Case(str(CaseId(self.lab, self.name, variant)), what, inputs, call, expected, judge, hidden))
        object.__setattr__(self, "cases", tuple(cases))  # checked by `register` (one parser of ids)

    def calls(self) -> list[Callable[[Any, Inputs], Outputs]]:
        """The distinct calls of its cases, in order: a graded kernel runs a hidden case by its place here
        (`handles.py`), never by its name."""
        return list(dict.fromkeys(case.call for case in self.cases))

    def compare(self, got: Outputs, expected: Outputs, inputs: Inputs) -> None:
        """The default judge: the one output equals the reference's, within the declared tolerance."""
        if len(expected) != 1:
            raise TypeError(f"piece {self.lab}.{self.name} has outputs {sorted(expected)}: declare its judge")
        [(key, want)] = expected.items()
        label = self.label or key
        if self.shape is not None:
            check_shape(got[key], self.shape, inputs["sizes"], label, causes=self.causes)
        if self.dtype is not None:
            check_dtype(got[key], self.dtype[0], label, self.dtype[1])
        if self.finite is not None and not bool(torch.isfinite(got[key]).all()):
            message = self.finite(inputs)
            raise fail(message, mistake_key(message))
        check_close(got[key], want, label, atol=self.atol, rtol=self.rtol,
                    mistakes=partial(self.known_mistakes, key, inputs))

    def known_mistakes(self, key: str, inputs: Inputs) -> Mistakes:
        """{why: output `key` of that mistake}; a row's output is computed only when asked (`check_known_mistakes`
        asks in order, for a wrong answer, until one matches)."""
        if self.mistakes is None:
            return {}
        table = self.mistakes if isinstance(self.mistakes, Mapping) else self.mistakes(inputs)
        if self.by_hand is None:
            return table
        return {why: partial(self._mistaken, key, inputs, switches) for why, switches in table.items()}

    def _mistaken(self, key: str, inputs: Inputs, switches: Mapping[str, Any]) -> torch.Tensor:
        return self.call(with_switches(self.by_hand, switches), inputs)[key]


def with_switches(by_hand: Callable[..., Any], switches: Mapping[str, Any]) -> Callable[..., Any]:
    """`by_hand` with `switches` set: a function's by `partial`; a class's in a subclass's constructor, so that a
    `call` builds it as it builds the student's class."""
    if isinstance(by_hand, type):
        return type(by_hand.__name__, (by_hand,), {"__init__": partialmethod(by_hand.__init__, **switches)})
    return partial(by_hand, **switches)


PIECES: dict[str, Piece] = {}  # "NN.name" -> piece


def declare(*pieces: Piece) -> tuple[Piece, ...]:
    """Register the pieces of a lab and their cases (called once, at the end of its module)."""
    for piece in pieces:
        key = f"{piece.lab}.{piece.name}"
        if key in PIECES:
            raise ValueError(f"piece {key} is declared twice")
        PIECES[key] = piece
        register(*piece.cases)
    return pieces


def lab_pieces(lab: str) -> list[Piece]:
    """The declared pieces of lab `lab` ("10"), in declaration order (the registry must be loaded)."""
    return [piece for piece in PIECES.values() if piece.lab == lab]


def forbidden_names(lab: str) -> dict[str, tuple[str, ...]]:
    """Piece -> dotted names of the references a student must not import or call for it, in lab `lab` ("10"):
    its pieces' `forbidden`."""
    registry()
    return {piece.name: piece.forbidden for piece in lab_pieces(lab) if piece.forbidden}
