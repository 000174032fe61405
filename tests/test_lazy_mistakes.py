"""A known mistake is computed only for a wrong answer. Every case of labs 01-16 is judged (the grader's judge,
in-process) on the solution notebook's outputs while the mistake producers are watched (`sys.setprofile`, during the
judge: the call runs the student's code, never a mistake), and none may compute anything; judged on wrong outputs
(every number moved), they do, for every piece that declares mistakes (so that this test can fail).

The producers are found, not listed, in the lab modules, `fixtures` and `attention_mistakes`:
- a piece's `mistakes(inputs)` without a `by_hand` (it returns the wrong outputs), whenever called;
- a by-hand function or class (a piece's `by_hand`, or any function with keyword-only switches), when called
  with a switch set (off its default): that is computing a mistake;
- a function named for its mistakes (`*_mistakes`, `*_mistake`, `mistaken`, `wrong_*`), when what it returns
  holds a computed value (anything but functions to call later);
- a comparison (`check_close`, `check_known_mistakes`) handed a `mistakes` table holding a computed value.
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import inspect
import io
import re
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from types import CodeType, FrameType
from typing import Any

import pytest
import torch
from lab_roundtrip import solved_namespace

from gptcourse import checks
from gptcourse.checks import CheckFailed
from gptcourse.grading import attention_mistakes, fixtures
from gptcourse.grading.cases import Case, CaseId, Inputs, Outputs, case_expected, case_inputs, case_seed, lab_cases
from gptcourse.grading.piece import lab_pieces

ROOT = Path(__file__).resolve().parents[1]
LABS = [f"{n:02d}" for n in range(1, 17)]
WITHOUT_KNOWN_MISTAKES = {"06"}  # its judges name mistakes by their symptoms (a count, a dtype), computing none
NAMED = re.compile(r"_mistakes?$|^mistaken$|^_?wrong_")  # a producer's name, by the labs' convention


def _computed(value: Any) -> bool:
    """Whether a table of mistakes holds a computed value: a leaf that is neither a function to call later nor an
    iterator (a generator computes when read)."""
    if isinstance(value, Mapping):
        return any(_computed(v) for v in value.values())
    return not (callable(value) or isinstance(value, Iterator))


@dataclass(frozen=True)
class Producer:
    """A function that computes known mistakes: at its `event`, `when(frame, arg)` says whether this call (or what
    it returned, `arg`) computed one."""

    name: str
    event: str  # "call" or "return"
    when: Callable[[FrameType, Any], bool]


def _switched(function: Callable[..., Any]) -> Callable[[FrameType, Any], bool] | None:
    """For a by-hand function: whether a call sets one of its switches (a keyword-only argument off its default,
    or `**switches` given); None if it has none."""
    params = inspect.signature(function).parameters.values()
    keywords = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.default is not p.empty}
    extra = next((p.name for p in params if p.kind is p.VAR_KEYWORD and p.name in ("switches", "flags")), None)
    if not keywords and extra is None:
        return None

    def off(value: Any, default: Any) -> bool:
        try:
            return not (type(value) is type(default) and bool(value == default))
        except Exception:  # a tensor or the like: not a default
            return True

    return lambda frame, arg: (any(off(frame.f_locals[k], d) for k, d in keywords.items())
                               or bool(extra and frame.f_locals[extra]))


def _function(obj: Any) -> Any:
    while isinstance(obj, partial):
        obj = obj.func
    return obj.__init__ if isinstance(obj, type) else obj


def producers(lab: str) -> dict[CodeType, Producer]:
    """The code of every mistake producer the lab's grading may run (see the module's docstring)."""
    found: dict[CodeType, Producer] = {}
    modules = [importlib.import_module(f"gptcourse.grading.labs.lab{lab}"), fixtures, attention_mistakes]
    for module in modules:
        for name, f in vars(module).items():
            if not inspect.isfunction(f) or f.__module__ != module.__name__:
                continue
            switched = _switched(f)
            if switched is not None:
                found[f.__code__] = Producer(f"{module.__name__}.{name}(switches)", "call", switched)
            elif NAMED.search(name) and not name.startswith(("check", "_check")):
                found[f.__code__] = Producer(f"{module.__name__}.{name}", "return", lambda frame, arg: _computed(arg))
    for piece in lab_pieces(lab):
        if piece.by_hand is not None:
            by_hand = _function(piece.by_hand)
            found[by_hand.__code__] = Producer(f"{lab}.{piece.name} by_hand(switches)", "call",
                                               _switched(by_hand) or (lambda frame, arg: True))
        elif callable(piece.mistakes):
            found[_function(piece.mistakes).__code__] = Producer(f"{lab}.{piece.name} mistakes", "call",
                                                                 lambda frame, arg: True)
    for check in (checks.check_close, checks.check_known_mistakes):
        found[check.__code__] = Producer(f"{check.__name__}(mistakes=computed)", "call",
                                         lambda frame, arg: _computed(frame.f_locals["mistakes"] or {}))
    return found


@contextlib.contextmanager
def watching(found: dict[CodeType, Producer]) -> Iterator[list[str]]:
    """The producers that computed a mistake while in the block, each with the function that called it."""
    seen: list[str] = []

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        producer = found.get(frame.f_code)
        if producer is not None and event == producer.event and producer.when(frame, arg):
            seen.append(f"{producer.name} from {frame.f_back.f_code.co_name if frame.f_back else '?'}")

    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        yield seen
    finally:
        sys.setprofile(previous)


def _wrong(value: Any) -> Any:
    """A wrong answer of the same form: every number moved."""
    if isinstance(value, torch.Tensor) and value.dtype != torch.bool:
        return value * 1.5 + 0.25 if value.is_floating_point() else value + 1
    if isinstance(value, dict):
        return {k: _wrong(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_wrong(v) for v in value)
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value + 1
    return value


def judged(lab: str, answer: Callable[[Case, Inputs, Outputs], Outputs]) -> dict[str, list[str]]:
    """Case id -> the producers that computed a mistake while the case was judged on `answer(case, inputs,
    expected)`, or "failed: ..." where the judge failed it."""
    found, computed = producers(lab), {}
    for case in lab_cases(lab):
        seed = case_seed(case)
        inputs = case_inputs(case, seed)
        expected = case_expected(case, seed, inputs)
        got = answer(case, copy.deepcopy(inputs), copy.deepcopy(expected))
        with watching(found) as seen:
            try:
                case.judge(got, expected, copy.deepcopy(inputs))
            except CheckFailed as failed:
                seen.append(f"failed: {failed}")
        computed[case.id] = seen
    return computed


def solution(lab: str) -> Callable[[Case, Inputs, Outputs], Outputs]:
    """A right answer: the outputs of the solution notebook's own code, as its kernel runs a case."""
    [folder] = [path.name for path in (ROOT / "solutions").glob(f"{lab}_*")]
    with contextlib.redirect_stdout(io.StringIO()):
        namespace = solved_namespace(folder, {})
    return lambda case, inputs, expected: case.call(namespace[CaseId.parse(case.id).piece], inputs)


@pytest.mark.parametrize("lab", LABS)
def test_the_solution_passes_and_computes_no_mistake(lab):
    computed = {case: seen for case, seen in judged(lab, solution(lab)).items() if seen}
    assert computed == {}


@pytest.mark.parametrize("lab", LABS)
def test_a_wrong_answer_computes_the_mistakes_of_every_piece_that_has_them(lab):
    computed = judged(lab, lambda case, inputs, expected: _wrong(expected))
    pieces = {case.split(".")[1] for case, seen in computed.items() if any(not s.startswith("failed") for s in seen)}
    declared = {piece.name for piece in lab_pieces(lab) if piece.mistakes is not None}
    assert declared <= pieces
    assert bool(pieces) == (lab not in WITHOUT_KNOWN_MISTAKES), pieces
