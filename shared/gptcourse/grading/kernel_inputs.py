"""The inputs of a lab's cases, computed by the grader and handed to the graded kernel as data.

A graded kernel sees a view of the package without the lab's references (`package_view.py`), and some cases
build reference modules just to draw their weights (lab 02's `AttentionHead` inputs), so the kernel cannot make
its inputs itself. The grader, where the real package is, computes every case of the lab with the seeds the
kernel uses (`case_seed(case, kernel_environment)`) and writes them, with `torch.save`, into the box's /scratch;
the kernel finds the file in the environment variable `INPUTS_ENV` (a hidden case's inputs under its handle only:
`handles.py`) and `check` only runs the student's code on
them and records the payload, which the grader judges on its own copy of the inputs (`cases.case_inputs`: a
kernel that rewrites this file changes nothing but its own outputs).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from .cases import CaseId, case_inputs, case_seed, lab_cases
from .handles import handle_entries

INPUTS_ENV = "GPTCOURSE_CASE_INPUTS"
FILE_NAME = ".gptcourse-case-inputs.pt"  # in the box's /scratch


def lab_inputs(lab: str, environ: Mapping[str, str]) -> dict[str, Any]:
    """case id -> inputs, for every case of `lab` ("02_causal_attention" or "02"), with the seeds a kernel of
    environment `environ` computes."""
    return {case.id: case_inputs(case, case_seed(case, environ)) for case in lab_cases(lab)}


def write_inputs(path: str | Path, lab: str, environ: Mapping[str, str], handles: Mapping[str, str]) -> None:
    """The inputs of `lab`'s visible cases by id, and of its hidden ones only under their handles (`handles.py`:
    handle -> case id)."""
    inputs = lab_inputs(lab, environ)
    shown = {case_id: value for case_id, value in inputs.items() if not CaseId.parse(case_id).hidden}
    torch.save(shown | handle_entries(handles, inputs), path)


def graded_inputs(test_id: str) -> Any | None:
    """In a graded kernel, the grader's inputs of case `test_id` (KeyError if it handed none); None elsewhere."""
    path = os.environ.get(INPUTS_ENV)
    return None if path is None else _load(path)[test_id]


@functools.cache
def _load(path: str) -> dict[str, Any]:
    from ..model.config import GPTConfig

    with torch.serialization.safe_globals([GPTConfig]):  # the one class a case's inputs hold
        return torch.load(path, weights_only=True)
