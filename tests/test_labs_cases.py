"""The case registry in-process (no kernel, no nbgrader): every lab's solution code passes every case its test
cells name, every registered case is used by a lab, payloads survive the trip out of the kernel, and tampered or
stale payloads are rejected."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
import torch

from gptcourse.checks import CheckFailed
from gptcourse.grading import CASES, case_seed, check, get_case, judge_payload
from gptcourse.grading.cases import CaseId
from gptcourse.grading.payload import MAX_ELEMENTS, decode_value, encode_value, make_payload

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*/*.ipynb"))
CHECK_CALL = re.compile(r'check\("([^"]+)", (\w+)\)')


def _code_cells(path: Path) -> list[nbformat.NotebookNode]:
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def _solution_namespace(path: Path) -> dict:
    """Run the solution notebook's setup and solution cells (not its tests) in a fresh namespace, as a notebook runs
    them (in `__main__`: so the kernel's checks of forbidden references look at them, and find none)."""
    namespace: dict = {"__name__": "__main__"}
    for cell in _code_cells(path):
        if not cell.metadata.nbgrader.get("grade"):
            exec(compile(cell.source, f"{path.stem}:{cell.metadata.nbgrader['grade_id']}", "exec"), namespace)
    return namespace


def _calls(path: Path) -> list[tuple[str, str]]:
    return [call for cell in _code_cells(path) for call in CHECK_CALL.findall(cell.source)]


def test_there_are_labs():
    assert [p.parent.name for p in SOLUTIONS][:2] == ["01_tokens_and_embeddings", "02_causal_attention"]


@pytest.mark.parametrize("path", SOLUTIONS, ids=lambda p: p.stem)
def test_solution_code_passes_every_case_of_its_lab(path, capsys):
    namespace = _solution_namespace(path)
    for test_id, name in _calls(path):
        check(test_id, namespace[name])
        assert capsys.readouterr().out.startswith(f"✓ {test_id} passed")


def test_every_registered_case_is_called_by_its_lab_and_ids_name_their_lab():
    get_case("01.one_hot_embed.visible")  # loads the registry
    called = {test_id for path in SOLUTIONS for test_id, _ in _calls(path)}
    assert called == set(CASES), f"unused: {set(CASES) - called}; unregistered: {called - set(CASES)}"
    labs = {p.parent.name[:2] for p in SOLUTIONS}
    for test_id, case in CASES.items():
        assert CaseId.parse(test_id).lab in labs
        assert case.hidden == CaseId.parse(test_id).hidden, test_id


def test_released_labs_hide_the_hidden_case_ids():
    for path in SOLUTIONS:
        released = (ROOT / "labs" / path.parent.name / path.name).read_text()
        hidden = [test_id for test_id, _ in _calls(path) if get_case(test_id).hidden]
        assert hidden and not any(test_id in released for test_id in hidden)


def test_hidden_seeds_come_from_the_course_secret(monkeypatch):
    visible, hidden = get_case("02.attention.visible"), get_case("02.attention.hidden_heads")
    public = case_seed(visible), case_seed(hidden)
    monkeypatch.setenv("GPTCOURSE_SECRET", "an instructor's private value")
    assert case_seed(visible) == public[0]
    assert case_seed(hidden) != public[1]
    shapes = {tuple(hidden.inputs(seed)["q"].shape) for seed in range(20)}
    assert len(shapes) > 1  # sizes, not only values, depend on the seed


def test_a_grading_kernel_gets_the_hidden_seeds_not_the_secret():
    from gptcourse.grading.cases import kernel_environment

    grader = {"GPTCOURSE_SECRET": "an instructor's private value", "PATH": "/usr/bin"}
    kernel = kernel_environment("02_causal_attention", "alice", grader)
    assert "GPTCOURSE_SECRET" not in kernel and kernel["PATH"] == "/usr/bin"
    assert "an instructor's private value" not in repr(kernel)
    hidden = [case for case in CASES.values() if case.hidden]
    for case in hidden:  # the kernel draws every hidden case of its lab exactly as the grader does for alice
        if case.id.startswith("02."):
            assert case_seed(case, kernel) == case_seed(case, grader, "alice") != case_seed(case, {}, "alice")
    seeds = dict(item.split("=") for item in kernel["GPTCOURSE_HIDDEN_SEEDS"].split())
    assert seeds and all(test_id.startswith("02.") for test_id in seeds)  # other labs' hidden cases stay private
    assert {case.id for case in hidden if case.id.startswith("02.")} == set(seeds)


def test_each_student_gets_hidden_cases_of_their_own():
    """A hidden seed is sha256(secret, student, case id): recomputed here with hashlib, not with the package."""
    import hashlib

    grader = {"GPTCOURSE_SECRET": "an instructor's private value"}
    case = get_case("02.attention.hidden_heads")
    def by_hand(*parts: str) -> int:
        return int.from_bytes(hashlib.sha256("\0".join(parts).encode()).digest()[:4], "big") & 0x7FFF_FFFF
    assert case_seed(case, grader, "alice") == by_hand("an instructor's private value", "alice", case.id)
    assert case_seed(case, grader) == by_hand("an instructor's private value", case.id)  # Validate: no student
    seeds = {student: case_seed(case, grader, student) for student in ("alice", "bob", "carol", "dave")}
    assert len(set(seeds.values())) == 4
    assert case_seed(case, grader, "alice") == seeds["alice"]  # grading again gives the same cases
    shapes = {tuple(case.inputs(seed)["q"].shape) for seed in seeds.values()}
    assert len(shapes) > 1  # the students' hidden sizes differ, not only their values
    visible = get_case("02.attention.visible")
    assert case_seed(visible, grader, "alice") == case_seed(visible, grader, "bob") == case_seed(visible)


def _payload_of(test_id: str, obj) -> dict:
    case = get_case(test_id)
    seed = case_seed(case)
    return make_payload(test_id, seed, case.call(obj, case.inputs(seed)), None)


def test_a_payload_is_judged_without_the_student_code():
    good = _payload_of("02.causal_mask.visible", lambda t: torch.ones(t, t, dtype=torch.bool).tril())
    assert judge_payload(good) == (True, "✓ 02.causal_mask.visible passed: causal_mask(4)")
    bad = _payload_of("02.causal_mask.visible", lambda t: torch.ones(t, t, dtype=torch.bool).triu())
    passed, message = judge_payload(bad)
    assert not passed and "wrong triangle" in message


def test_a_payload_for_other_inputs_or_an_unknown_test_is_rejected():
    payload = _payload_of("02.causal_mask.visible", lambda t: torch.ones(t, t, dtype=torch.bool).tril())
    passed, message = judge_payload(payload | {"seed": payload["seed"] + 1})
    assert not passed and "computed for other inputs" in message
    passed, message = judge_payload(payload | {"test_id": "02.no_such_piece.visible"})
    assert not passed and "no test case '02.no_such_piece.visible'" in message


def test_student_errors_are_named_with_their_line(capsys):
    def causal_mask(t):
        return torch.ones(t, t, dtype=torch.bool)[t].tril()

    expected = (r"(?s)your code raised IndexError: index 4 is out of bounds .*line \d+ of your cell: "
                r"`return torch.ones\(t, t, dtype=torch.bool\)\[t\].tril\(\)")
    with pytest.raises(CheckFailed, match=expected):
        check("02.causal_mask.visible", causal_mask)
    with pytest.raises(CheckFailed, match=r"not written yet \(your code raises NotImplementedError\)"):
        check("02.causal_mask.visible", lambda t: (_ for _ in ()).throw(NotImplementedError()))
    with pytest.raises(CheckFailed, match=r"returned list, expected a torch.Tensor"):
        check("02.causal_mask.visible", lambda t: [[True]])


def test_tensors_round_trip_as_plain_data():
    class Sneaky(torch.Tensor):
        def __eq__(self, other):  # always "equal", like a cheating subclass
            return True

    for value in (torch.randn(2, 3), torch.arange(6).view(2, 3), torch.ones(2, 2, dtype=torch.bool),
                  torch.randn(3).as_subclass(Sneaky)):
        decoded = decode_value(encode_value(value))
        assert type(decoded) is torch.Tensor and decoded.dtype == value.dtype
        assert torch.equal(decoded, value.as_subclass(torch.Tensor))
    assert decode_value(encode_value(3.5)) == 3.5
    with pytest.raises(CheckFailed, match="far more than expected"):
        encode_value(torch.zeros(MAX_ELEMENTS + 1))
