"""Hidden cases under opaque handles: a graded kernel never holds a hidden test's source, nor its case's name.

A hidden test cell (`check("02.causal_mask.hidden_single", causal_mask)` between nbgrader's markers) says what each
hidden case tests. The kernel is the student's: a cell after the last test can print `In`, `_ih` or the history,
a `pre_run_cell` hook installed early sees every cell as it runs, the function under test can read its caller's
frame. So the grader does not send that source:

- `run_source` (RobustExecute, before a test cell runs): the source the kernel runs instead, each hidden case id
  replaced by a handle drawn for this submission ("hidden-3f9c0a..."), comments and markers gone; the grader keeps
  handle -> case id (`HANDLES`, in the conversion's resources; the notebook keeps the instructor's source);
- `handle_entries` (in the inputs file the grader hands the kernel, `kernel_inputs.py`): for each handle, its
  inputs and which of its piece's calls runs them (`Piece.runs`), never the case;
- `check(handle, obj)` in the kernel (`kernel.py`) runs that call and records the payload under the handle;
- `named_payload` (the judge): the payload under its case's id, with the seed the grader drew for it.
Visible cases keep their ids: the released lab shows them.
"""

from __future__ import annotations

import ast
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from .cases import CaseId, case_seed, get_case

PREFIX = "hidden-"
HANDLES = "gptcourse_hidden_handles"  # resources key: handle -> case id, for the judge


def is_handle(test_id: object) -> bool:
    return isinstance(test_id, str) and test_id.startswith(PREFIX)


def _hidden_id(node: ast.AST) -> str | None:
    """The case id of a `check("NN.piece.hidden...", obj)` call, else None."""
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check" and node.args
            and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return None
    try:
        return node.args[0].value if CaseId.parse(node.args[0].value).hidden else None
    except ValueError:
        return None


def run_source(source: str, handles: dict[str, str]) -> str | None:
    """What the kernel runs for a test cell of `source`: its statements (no comments) with each hidden case id
    replaced by a new handle, added to `handles` (handle -> case id); None for a cell without hidden checks."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = [node for node in ast.walk(tree) if _hidden_id(node) is not None]
    for call in calls:
        handle = PREFIX + secrets.token_hex(8)
        handles[handle] = call.args[0].value
        call.args[0] = ast.Constant(handle)
    return ast.unparse(tree) if calls else None


def handle_entries(handles: Mapping[str, str], inputs: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """handle -> {"piece": "NN.piece", "run": i, "inputs": ...}, for each handle whose case has inputs in `inputs`
    (case id -> inputs): all a kernel needs to run it, without the case's name."""
    from .piece import PIECES

    entries = {}
    for handle, case_id in handles.items():
        if case_id in inputs:
            parsed = CaseId.parse(case_id)
            piece = PIECES[f"{parsed.lab}.{parsed.piece}"]
            entries[handle] = {"piece": f"{parsed.lab}.{parsed.piece}",
                               "run": piece.calls().index(get_case(case_id).call), "inputs": inputs[case_id]}
    return entries


def run_of(entry: Mapping[str, Any]) -> Callable[[Any, Any], Any]:
    """The call a handle's entry names (in the kernel)."""
    from .cases import registry
    from .piece import PIECES

    registry()  # the lab modules declare their pieces
    return PIECES[entry["piece"]].calls()[entry["run"]]


def named_payload(payload: Any, handles: Mapping[str, str], student: str | None) -> Any:
    """A payload recorded under a handle, as its case's (the grader's seed for `student`: the handle, drawn for
    this run, is what shows that it is fresh); any other payload as it is."""
    if not isinstance(payload, dict) or not is_handle(payload.get("test_id")) or payload["test_id"] not in handles:
        return payload
    case_id = handles[payload["test_id"]]
    try:
        seed = case_seed(get_case(case_id), student=student)
    except KeyError:
        seed = None
    return {**payload, "test_id": case_id, "seed": seed}
