"""The registry of test cases, and the seeds that make hidden cases secret.

A `Case` says how to test one piece of a lab on one set of inputs. `check(test_id, obj)` in a lab's test cell
looks the case up here by its id, "NN.piece.variant" (e.g. "02.causal_mask.visible"). Cases are registered
by the modules of `gptcourse.grading.labs`, one per lab, which are all imported on the first lookup.

Seeds: a visible case's inputs come from `case_seed(case)` = a hash of a fixed public string and the id, so a
student sees the same inputs the grader uses. A hidden case hashes the course secret instead, read from the
environment variable GPTCOURSE_SECRET (default: the public string), and, when a submission is graded, the
student's id: an instructor who sets a private secret when grading (`GPTCOURSE_SECRET=... nbgrader autograde
02_...`) gets hidden shapes and values that the public repository does not reveal, different for each student
(one student's feedback tells a classmate nothing), and the same each time that submission is graded again.

The secret never enters a student's kernel, where a cell could print it into the feedback (and with it every
hidden case of every lab, this year's and next). The grader starts kernels with `kernel_environment(lab,
student)`: without GPTCOURSE_SECRET, plus GPTCOURSE_HIDDEN_SEEDS, the seeds of that lab's hidden cases for that
student only (a seed is a hash: it does not give the secret back). `case_seed` in the kernel reads them from
there, so both sides of a check agree. A kernel that autograde runs gets no seeds at all: RobustExecute computes
its cases' inputs from them and hands those over, a hidden case's under an opaque handle (`handles.py`).
"""

from __future__ import annotations

import copy
import functools
import hashlib
import importlib
import os
import pkgutil
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .case_ids import CaseId

PUBLIC_SECRET = "gptcourse-public"
SECRET_ENV = "GPTCOURSE_SECRET"
HIDDEN_SEEDS_ENV = "GPTCOURSE_HIDDEN_SEEDS"  # "id=seed id=seed ...", set only in a grading kernel

Inputs = dict[str, Any]
Outputs = dict[str, Any]
@dataclass(frozen=True)
class Case:
    """One test of one lab piece.

    inputs(seed) -> inputs: sizes, tensors, reference weights; deterministic in the seed.
    call(student_obj, inputs) -> outputs: calls the student's code (in the student's kernel) and returns plain
        values (tensors, numbers, strings) only; raises CheckFailed for a wrong interface.
    expected(inputs) -> the expected outputs, from the gptcourse reference implementation.
    judge(got, expected, inputs): raises CheckFailed with a teaching message; returns None on success.
    """

    id: str
    what: str  # shown in pass/fail messages, e.g. "causal_mask(4)"
    inputs: Callable[[int], Inputs]
    call: Callable[[Any, Inputs], Outputs]
    expected: Callable[[Inputs], Outputs]
    judge: Callable[[Outputs, Outputs, Inputs], None]
    hidden: bool = False



CASES: dict[str, Case] = {}


def register(*cases: Case) -> None:
    for case in cases:
        if CaseId.parse(case.id).hidden != case.hidden:
            raise ValueError(f"test case {case.id!r}: only a hidden case's variant starts with 'hidden'")
        if case.id in CASES:
            raise ValueError(f"test case {case.id!r} is registered twice")
        CASES[case.id] = case


def registry() -> dict[str, Case]:
    """Every lab's cases, by id: the lab modules (`gptcourse.grading.labs`) are imported on the first call."""
    _import_labs()
    return CASES


@functools.cache
def _import_labs() -> None:
    # The one circle in grading/, lazy on purpose: the lab modules declare their pieces (piece.py, which imports
    # this module) and so register their cases here; importing them on the first lookup, not when this module
    # loads, keeps a case's id, seed and registry usable before any lab (and torch's models) is imported.
    from . import labs

    for module in pkgutil.iter_modules(labs.__path__):
        importlib.import_module(f"{labs.__name__}.{module.name}")


def get_case(test_id: str) -> Case:
    try:
        return registry()[test_id]
    except KeyError:
        try:
            lab = CaseId.parse(test_id).lab
        except ValueError as not_an_id:  # a KeyError still: a payload's test id is the kernel's to write
            raise KeyError(str(not_an_id)) from None
        known = sorted(i for i in CASES if CaseId.parse(i).lab == lab)
        raise KeyError(f"no test case {test_id!r}; lab {lab} has {known}") from None


def lab_cases(lab: str) -> list[Case]:
    """The cases of `lab` ("02_causal_attention" or "02"), in registration order."""
    number = lab.split("_")[0]
    return [case for case in registry().values() if CaseId.parse(case.id).lab == number]


def course_secret(environ: Mapping[str, str] = os.environ) -> str:
    return environ.get(SECRET_ENV) or PUBLIC_SECRET


def _seed(secret: str, case_id: str, student: str | None = None) -> int:
    key = f"{secret}\0{case_id}" if student is None else f"{secret}\0{student}\0{case_id}"
    digest = hashlib.sha256(key.encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFF_FFFF


def case_seed(case: Case, environ: Mapping[str, str] = os.environ, student: str | None = None) -> int:
    """A 31-bit seed from the case id and, for hidden cases, the course secret and the student being graded (or,
    in a grading kernel, the seed the grader passed in GPTCOURSE_HIDDEN_SEEDS). Without a student (a learner's
    own Validate) a hidden case hashes the secret and the id alone."""
    if not case.hidden:
        return _seed(PUBLIC_SECRET, case.id)
    passed = dict(item.split("=", 1) for item in environ.get(HIDDEN_SEEDS_ENV, "").split())
    return int(passed[case.id]) if case.id in passed else _seed(course_secret(environ), case.id, student)


def hidden_seeds(lab: str, student: str | None, environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """The seeds of the hidden cases of `lab` ("02_causal_attention" or "02") for `student`, from the course
    secret: each student is tested on inputs of their own, which a classmate's feedback does not reveal."""
    return {case.id: _seed(course_secret(environ), case.id, student) for case in lab_cases(lab) if case.hidden}


def kernel_environment(lab: str, student: str | None, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The environment of a kernel that runs `student`'s submission of `lab`: the grader's, without the course
    secret, with the seeds of the lab's hidden cases for that student (the box keeps only the variables it
    allows: `confine.KERNEL_VARIABLES`)."""
    env = {name: value for name, value in environ.items() if name not in (SECRET_ENV, HIDDEN_SEEDS_ENV)}
    seeds = sorted(hidden_seeds(lab, student, environ).items())
    env[HIDDEN_SEEDS_ENV] = " ".join(f"{test_id}={seed}" for test_id, seed in seeds)
    return env


def case_inputs(case: Case, seed: int) -> Inputs:
    """`case.inputs(seed)`, made once per (case, seed) in this process and handed out as copies: the grader makes
    every case's inputs to hand them to a kernel (`kernel_inputs.py`) and again to judge what came back; a visible
    case's seed is the same for every student. What runs on a copy may change it; the kept one stays the case's."""
    return copy.deepcopy(_made_inputs(case, seed))


def case_expected(case: Case, seed: int, inputs: Inputs) -> Outputs:
    """`case.expected(inputs)`, `inputs` those of `case_inputs(case, seed)`; a visible case's computed once per
    process, on its own copy of the inputs, and handed out as copies."""
    return case.expected(inputs) if case.hidden else copy.deepcopy(_visible_expected(case, seed))


@functools.lru_cache(maxsize=512)  # the cases of the submission being graded, and every visible one
def _made_inputs(case: Case, seed: int) -> Inputs:
    return case.inputs(seed)


@functools.lru_cache(maxsize=256)
def _visible_expected(case: Case, seed: int) -> Outputs:
    return case.expected(case_inputs(case, seed))


def sizes_rng(seed: int) -> random.Random:
    """For drawing sizes (B, T, ...) of a hidden case from its seed."""
    return random.Random(seed)


def given(**inputs: Any) -> Callable[[int], Inputs]:
    """The inputs(seed) of a case whose inputs are these, whatever its seed."""
    return lambda seed: dict(inputs)


def sized(draw: Callable[[random.Random, int], Inputs]) -> Callable[[int], Inputs]:
    """A hidden case's inputs(seed): `draw(r, seed)`, r = sizes_rng(seed) drawing its sizes."""
    return lambda seed: draw(sizes_rng(seed), seed)


def tensor_rng(seed: int) -> torch.Generator:
    """For drawing a case's tensors from its seed, independent of torch's global random state."""
    return torch.Generator().manual_seed(seed)


def random_weights(module: nn.Module, gen: torch.Generator, scale: float = 0.5) -> dict[str, torch.Tensor]:
    """Reference weights for every parameter of `module` (names and shapes the lab fixes), drawn from `gen`.

    Larger than a fresh init (std 0.02 would make every attention pattern nearly uniform, hiding mistakes).
    """
    return {name: torch.randn(p.shape, generator=gen) * scale for name, p in module.named_parameters()}
