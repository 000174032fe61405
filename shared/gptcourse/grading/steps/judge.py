"""Judging a lab's test cells in the grader's process, where no student code ever ran.

`JudgeTestCells` runs in `nbgrader autograde` after the notebook executed and before SaveAutoGrades scores it.
For every autograded test cell (a grade cell whose source, restored from the gradebook, calls
`check("NN.piece.variant", obj)`):
1. the test ids it must record are read from the cell's source with `ast`;
2. the cell's outputs must hold exactly one result payload (`payload.MIME`) per id, with the seed the grader
   computes from the course secret (a hidden case's payload, recorded under the handle the kernel ran it by, is
   named back first: `handles.py`); a missing, repeated or stale payload fails that test with a line saying so;
3. each payload is judged again here (`judge_payload`): its tensors are rebuilt from raw bytes, the inputs and
   expected values recomputed with the reference code. Whatever the student's kernel printed, patched or raised
   (torch.allclose, builtins, IPython's traceback display, NBGRADER_EXECUTION) is ignored;
4. a cell whose kernel sent messages the grader cannot read (`execute.message_problem`: they were dropped and the
   cell got a `FORGED` error output) fails every test, with that reason;
5. the cell's outputs are replaced: one line per passing test, or a single error output holding only the
   diagnostics (nbgrader scores a cell with an error output 0), never a traceback or the test's source;
6. beside them, in the cell's metadata under the course's key, a record per test of the grader's own verdict (lab,
   piece, case, passed, outcome, points, the key of the mistake recognised: `verdict_records`), which
   `gptcourse report` reads (`classroom/class_report.py`); the key is first dropped from every cell, so nothing
   the submission held there survives (`sanitize.trusted_metadata` already drops it); the same records go in
   nbconvert's resources (`VERDICTS`), from which `verdict_comments` writes each piece's summary in the gradebook.
A piece whose reference implementation the student uses (its `Piece.forbidden`, see `forbidden.py`) scores 0 in
every test of it, with a report line that says why. Two independent findings lead there:
- the static scan of the cells' source (`find_forbidden`), here: imports, aliases, subclasses, attribute chains;
- the run-time check in the kernel (`reference_behind`, called by `check`): a payload whose `reference` says the
  object under test is, subclasses or wraps a reference. The kernel is the student's, so it can only hide its
  own use from this second line (the scan still runs), never earn points; its report is read as untrusted data
  (`payload.reference_text`): a malformed one fails its piece with a line saying so, and never stops the grader.
"""

from __future__ import annotations

import ast

from nbconvert.exporters.exporter import ResourcesDict
from nbformat.notebooknode import NotebookNode
from nbformat.v4 import new_output
from nbgrader import utils
from nbgrader.preprocessors import NbGraderPreprocessor

from ..cases import CaseId
from ..forbidden import allowed_text, find_forbidden, pieces_lost
from ..handles import HANDLES, named_payload
from ..payload import MIME, Judged, judged, reference_text
from ..piece import forbidden_names
from .report import KEY, add_line, cell_label

STOP_REASON_CHARS = 300
AFTER_FAILURE = "an earlier test of this cell failing"  # why a test after a failing one has no result
RECORDED_MESSAGE_CHARS = 1200  # of a verdict's message, kept in the cell's record for the class report
FORGED = "ForgedOutput"  # the ename of the error output RobustExecute gives a cell whose kernel sent forged messages
VERDICTS = "gptcourse_verdicts"  # in nbconvert's resources: this run's records, for `verdict_comments`


def expected_test_ids(source: str) -> list[str]:
    """The ids of the `check("id", obj)` calls in a test cell's source, in order; [] if it has none."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [node.args[0].value for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"
            and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)]


def _parsed(test_id: str) -> CaseId:
    """The id's parts; all empty for a malformed id (a payload's id is the kernel's word)."""
    try:
        return CaseId.parse(test_id)
    except ValueError:
        return CaseId("", "", "")


def _piece(test_id: str) -> str:
    return _parsed(test_id).piece


def _stop_reason(cell: NotebookNode) -> str:
    """Why a test cell stopped early, from its first error output ("" if none)."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            if output.get("ename") == "CheckFailed":
                return AFTER_FAILURE
            text = f"{output.get('ename', '')}: {output.get('evalue', '')}".strip(": ")
            return text[:STOP_REASON_CHARS]
    return ""


def _payloads(cell: NotebookNode) -> list[object]:
    return [out["data"][MIME] for out in cell.get("outputs", [])
            if out.get("output_type") in ("display_data", "execute_result") and MIME in out.get("data", {})]


def reported_references(cell: NotebookNode, test_ids: list[str]) -> dict[str, tuple[str, str]]:
    """piece -> (test id, what the kernel reported) for each of the cell's tests whose payload says the object
    under test is, subclasses or wraps a reference (`reference_text`)."""
    found: dict[str, tuple[str, str]] = {}
    for payload in _payloads(cell):
        if isinstance(payload, dict) and payload.get("test_id") in test_ids and payload.get("reference") is not None:
            found.setdefault(_piece(payload["test_id"]), (payload["test_id"], reference_text(payload["reference"])))
    return found


def _until_first_failure(payloads: list[object], test_ids: list[str],
                         student: str | None) -> tuple[list[object], dict[int, Judged]]:
    """The cell's payloads of `test_ids` up to and including the first that fails, and the verdicts on them (by
    position).

    Where the student validates, a failing check raises and the rest of its cell never runs; a graded kernel
    cannot judge (its package has no references), so its cell runs on and records later results. Cutting them
    here judges both cells alike: a test after a failing one is "not run", exactly as before.
    """
    kept: list[object] = []
    verdicts: dict[int, Judged] = {}
    for payload in payloads:
        kept.append(payload)
        if isinstance(payload, dict) and payload.get("test_id") in test_ids:
            verdicts[len(kept) - 1] = verdict = judged(payload, student)
            if not verdict.passed:
                break
    return kept, verdicts


def judge_cell(cell: NotebookNode, test_ids: list[str], banned: dict[str, str],
               student: str | None = None) -> tuple[bool, list[str]]:
    """(all passed, one message per test id) from the cell's recorded payloads, hidden cases with `student`'s
    seeds; `banned`: piece -> reason."""
    passed, verdicts = cell_verdicts(cell, test_ids, banned, student)
    return passed, [verdict.message for verdict in verdicts]


def cell_verdicts(cell: NotebookNode, test_ids: list[str], banned: dict[str, str],
                  student: str | None = None) -> tuple[bool, list[Judged]]:
    """`judge_cell`'s verdicts whole: with each test's outcome and the key of the mistake recognised."""
    forged = [out.get("evalue", "") for out in cell.get("outputs", [])
              if out.get("output_type") == "error" and out.get("ename") == FORGED]
    if forged:
        return False, [Judged(False, f"{test_id}: 0 points: while this cell ran, {forged[0]}", "forged")
                       for test_id in test_ids]
    recorded = _payloads(cell)
    payloads, judged_at = _until_first_failure(recorded, test_ids, student)
    reason = AFTER_FAILURE if len(payloads) < len(recorded) else _stop_reason(cell)
    verdicts = []
    for test_id in test_ids:
        mine = [i for i, p in enumerate(payloads) if isinstance(p, dict) and p.get("test_id") == test_id]
        if _piece(test_id) in banned:
            verdicts.append(Judged(False, f"{test_id}: 0 points: {banned[_piece(test_id)]}", "reference"))
        elif not mine:
            stopped = f" (it stopped with {reason})" if reason else ""
            verdicts.append(Judged(False, f"no result recorded for {test_id}: the test cell did not run to the "
                                          f"end{stopped}", "skipped" if reason == AFTER_FAILURE else "not_run"))
        elif len(mine) > 1:
            verdicts.append(Judged(False, f"{len(mine)} results recorded for {test_id}, expected one: a test "
                                          "records its result once", "unreadable"))
        else:
            verdicts.append(judged_at[mine[0]])
    return all(verdict.passed for verdict in verdicts), verdicts


def verdict_records(cell: NotebookNode, test_ids: list[str], passed: bool, verdicts: list[Judged]) -> list[dict]:
    """What the class report reads of a test cell (`classroom/class_report.py`), one record per test id: the
    grader's own verdict, never anything the kernel wrote. nbgrader scores a cell all or nothing: each case holds
    an equal share of the cell's points, earned when the whole cell passes."""
    share = float(cell.metadata.get("nbgrader", {}).get("points") or 0) / max(len(test_ids), 1)
    records = []
    for test_id, verdict in zip(test_ids, verdicts, strict=True):
        case = _parsed(test_id)
        records.append({"lab": case.lab, "piece": case.piece, "case": test_id, "hidden": case.hidden,
                        "passed": verdict.passed, "outcome": verdict.outcome, "mistake": verdict.mistake,
                        "points": share if passed else 0.0, "max_points": share,
                        "message": verdict.message[:RECORDED_MESSAGE_CHARS]})
    return records


def _rewrite(cell: NotebookNode, passed: bool, messages: list[str]) -> None:
    if passed:
        cell.outputs = [new_output("stream", name="stdout", text="\n".join(messages) + "\n")]
    else:
        failures = "\n".join(m for m in messages if not m.startswith("✓"))
        cell.outputs = [new_output("error", ename="CheckFailed", evalue=failures,
                                   traceback=[f"\x1b[0;31mCheckFailed\x1b[0m: {failures}"])]


class JudgeTestCells(NbGraderPreprocessor):
    """Re-judge every check-calling test cell from its recorded payloads and rewrite its outputs."""

    def preprocess(self, nb: NotebookNode, resources: ResourcesDict) -> tuple[NotebookNode, ResourcesDict]:
        tests = [(i, cell, ids) for i, cell in enumerate(nb.cells)
                 if cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell)
                 and (ids := expected_test_ids(cell.source))]
        labs = sorted({_parsed(test_id).lab for _, _, ids in tests for test_id in ids} - {""})
        forbidden = {piece: names for lab in labs for piece, names in forbidden_names(lab).items()}
        prefix = labs[0] if len(labs) == 1 else "NN"
        student = (resources or {}).get("nbgrader", {}).get("student")  # None: not a graded submission
        handles = (resources or {}).get(HANDLES, {})
        for _, cell, _ in tests:  # payloads recorded under a hidden case's handle, as that case's
            for out in cell.get("outputs", []):
                if isinstance(out.get("data"), dict) and MIME in out.data:
                    out.data[MIME] = named_payload(out.data[MIME], handles, student)
        banned = self._banned_pieces(nb, forbidden, prefix)
        for i, cell, ids in tests:  # the second line of defence: what the kernel's own check found
            for piece, (test_id, text) in reported_references(cell, ids).items():
                if piece not in banned:
                    banned[piece] = f"the object that {test_id} checks {text}"
                    add_line(nb, f"{cell_label(cell, i)}: the object that {test_id} checks {text}, the reference for "
                                 f"a piece you must write: 0 points for {prefix}.{piece}.*")
        for cell in nb.cells:  # the course's namespace in a cell's metadata is the grader's alone
            cell.get("metadata", {}).pop(KEY, None)
        records = []
        for _, cell, ids in tests:
            passed, verdicts = cell_verdicts(cell, ids, banned, student)
            _rewrite(cell, passed, [verdict.message for verdict in verdicts])
            cell.metadata[KEY] = {"verdicts": verdict_records(cell, ids, passed, verdicts)}
            records += cell.metadata[KEY]["verdicts"]
        if resources is not None:
            resources[VERDICTS] = records
        return nb, resources

    def _banned_pieces(self, nb: NotebookNode, forbidden: dict[str, tuple[str, ...]],
                       prefix: str) -> dict[str, str]:
        """piece -> reason for the pieces whose reference the cells' source imports or uses (a line for each)."""
        if not forbidden:
            return {}
        cells = [(cell_label(cell, i), cell.source, not utils.is_locked(cell))
                 for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
        owner = {cell_label(cell, i): cell.metadata.get("nbgrader", {}).get("grade_id")
                 for i, cell in enumerate(nb.cells)}
        banned: dict[str, str] = {}
        reported: set[object] = set()
        for finding in find_forbidden(cells, forbidden):
            # one line per forbidden name; one per cell for constructs the scan cannot follow, and per package and
            # cell for imports outside the allowlist (each costs its own cell's piece)
            key = ((finding.cell, "dynamic") if finding.how == "dynamic"
                   else (finding.cell, finding.name) if finding.how == "not allowed" else finding.name)
            if key in reported:
                continue
            reported.add(key)
            pieces = pieces_lost(finding, owner.get(finding.cell), forbidden)
            lost = ", ".join(f"{prefix}.{p}.*" for p in pieces)
            how = "imports" if finding.how == "not allowed" else finding.how
            if finding.how == "dynamic":
                line = (f"{finding.cell} uses {finding.name}, which the grader cannot follow (the lab's intro says "
                        f"which imports to use): 0 points for {lost}")
            elif finding.how == "not allowed":
                line = (f"{finding.cell} imports {finding.name}, a package the labs do not allow (a submission may "
                        f"import only {allowed_text()}; the lab's intro says which to use): 0 points for {lost}")
            else:
                line = (f"{finding.cell} {how} {finding.name}, the reference for a piece you must write: "
                        f"0 points for {lost}")
            add_line(nb, line)
            for piece in pieces:
                banned.setdefault(piece, f"{finding.cell} {how} {finding.name}")
        return banned
