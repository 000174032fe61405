"""The grader's pieces in-process (no kernel, no nbgrader run): payloads from a hostile kernel are judged without
crashing, the forbidden-reference scan follows imports and aliases, and a test cell's verdict comes only from
its recorded payloads."""

from __future__ import annotations

import base64

import pytest
import torch
from nbformat.v4 import new_code_cell, new_output

from gptcourse.grading import MIME, case_seed, get_case, judge_payload
from gptcourse.grading.cases import case_expected, case_inputs
from gptcourse.grading.forbidden import find_forbidden
from gptcourse.grading.payload import make_payload
from gptcourse.grading.piece import forbidden_names
from gptcourse.grading.steps.judge import expected_test_ids, judge_cell


def _mask_payload(mask: torch.Tensor, test_id: str = "02.causal_mask.visible") -> dict:
    case = get_case(test_id)
    return make_payload(test_id, case_seed(case), {"mask": mask}, None)


GOOD = _mask_payload(torch.ones(4, 4, dtype=torch.bool).tril())


@pytest.mark.parametrize("outputs, message", [
    ({"mask": {"dtype": "bool", "shape": [4, 4], "data": "not base64!"}}, "not base64"),
    ({"mask": {"dtype": "bool", "shape": [4, 4], "data": base64.b64encode(b"\x01" * 15).decode()}},
     "15 bytes for shape [4, 4]"),
    ({"mask": {"dtype": "object", "shape": [4, 4], "data": ""}}, "unsupported dtype 'object'"),
    ({"mask": {"dtype": "bool", "shape": [-4, 4], "data": ""}}, "bad shape"),
    ({"mask": {"dtype": "bool", "shape": [10**9, 10**9], "data": ""}}, "bad shape"),
    ({"mask": {"value": [1, 2]}}, "an output value is a list"),
    ({"mask": "tensor"}, "encoded as str"),
    ("everything passed", "the outputs are not an object"),
])
def test_garbage_payloads_fail_with_a_message(outputs, message):
    passed, text = judge_payload(GOOD | {"outputs": outputs})
    assert not passed and message in text


def test_non_dict_payloads_and_values_the_judge_cannot_handle_fail():
    assert judge_payload(["not", "a", "payload"])[0] is False
    nan = _mask_payload(torch.full((4, 4), float("nan")))
    passed, text = judge_payload(nan)
    assert not passed and "02.causal_mask.visible failed" in text


def _cell(source: str, *payloads: object, error: tuple[str, str] | None = None):
    cell = new_code_cell(source)
    cell.outputs = [new_output("display_data", data={MIME: p, "text/plain": ""}) for p in payloads]
    if error:
        cell.outputs.append(new_output("error", ename=error[0], evalue=error[1], traceback=[]))
    return cell


def test_expected_ids_come_from_the_cells_source():
    source = '# Hidden tests\n### BEGIN HIDDEN TESTS\ncheck("02.a.hidden_x", f)\ncheck("02.a.hidden_y", f)\n'
    assert expected_test_ids(source + "### END HIDDEN TESTS") == ["02.a.hidden_x", "02.a.hidden_y"]
    assert expected_test_ids("print('no checks')") == []
    assert expected_test_ids("check(") == []


def test_a_cells_verdict_needs_exactly_one_fresh_payload_per_test():
    ids = ["02.causal_mask.visible"]
    assert judge_cell(_cell("", GOOD), ids, {}) == (True, ["✓ 02.causal_mask.visible passed: causal_mask(4)"])
    # in-kernel errors are ignored when the payload is right (a patched traceback display, a stderr warning)
    assert judge_cell(_cell("", GOOD, error=("AssertionError", "")), ids, {})[0]
    passed, [text] = judge_cell(_cell("", error=("NameError", "name 'causal_mask' is not defined")), ids, {})
    assert not passed and text == ("no result recorded for 02.causal_mask.visible: the test cell did not run to the "
                                   "end (it stopped with NameError: name 'causal_mask' is not defined)")
    passed, [text] = judge_cell(_cell("", GOOD, GOOD), ids, {})
    assert not passed and "2 results recorded for 02.causal_mask.visible" in text
    passed, [text] = judge_cell(_cell("", GOOD | {"seed": GOOD["seed"] + 1}), ids, {})
    assert not passed and "computed for other inputs" in text
    passed, [text] = judge_cell(_cell("", GOOD), ids, {"causal_mask": "cell 4 imports gptcourse.x"})
    assert not passed and text == "02.causal_mask.visible: 0 points: cell 4 imports gptcourse.x"


def test_a_graded_kernels_cell_that_ran_on_after_a_failure_is_judged_as_if_it_stopped():
    """A graded kernel cannot judge, so its cell records the checks after a failing one; they count as not run,
    exactly as where the failing check raised (same messages, same score)."""
    ids = ["02.causal_mask.visible", "02.causal_mask.hidden_single"]
    wrong = _mask_payload(torch.ones(4, 4, dtype=torch.bool))
    single = _mask_payload(torch.ones(1, 1, dtype=torch.bool), "02.causal_mask.hidden_single")
    stopped = judge_cell(_cell("", wrong, error=("CheckFailed", "02.causal_mask.visible failed")), ids, {})
    assert judge_cell(_cell("", wrong, single), ids, {}) == stopped
    assert not stopped[0] and stopped[1][1] == ("no result recorded for 02.causal_mask.hidden_single: the test cell "
                                                "did not run to the end (it stopped with an earlier test of this cell "
                                                "failing)")
    assert judge_cell(_cell("", GOOD, single), ids, {})[0]


def _scan(*student_sources: str, setup: str = "import math\nimport torch\nfrom torch import nn\n") -> set:
    cells = [("setup", setup, False)] + [(f"cell {i}", s, True) for i, s in enumerate(student_sources)]
    return {(f.name, f.pieces, f.how) for f in find_forbidden(cells, forbidden_names("02"))}


ATTENTION_PIECES = ("AttentionHead", "attention")  # sorted


@pytest.mark.parametrize("source, found", [
    ("from gptcourse.model.causal_attention import attention as a",
     ("gptcourse.attention", ATTENTION_PIECES, "imports")),
    ("import gptcourse.model.causal_attention as A\ndef f(q):\n    return A.causal_mask(4)",
     ("gptcourse.causal_mask", ("causal_mask",), "uses")),
    ("import gptcourse\nx = gptcourse.model.block.MultiHeadAttention",
     ("gptcourse.MultiHeadAttention", ("AttentionHead",), "uses")),
    ("F = torch.nn.functional\ny = F.scaled_dot_product_attention",
     ("torch.nn.functional.scaled_dot_product_attention", ATTENTION_PIECES, "uses")),
    ("import gptcourse.model.causal_attention\ny = getattr(gptcourse.model.causal_attention, 'fused_attention')",
     ("gptcourse.fused_attention", ATTENTION_PIECES, "uses")),
    ("from gptcourse.model.causal_attention import *",
     ("gptcourse.model.causal_attention.*", ("AttentionHead", "attention", "causal_mask"), "imports")),
    ("import importlib\nm = importlib.import_module('gptcourse.model.causal_attention')", ("importlib", (), "dynamic")),
    ("x = __import__('gptcourse')", ("__import__()", (), "dynamic")),
    ("exec(open('x.py').read())", ("exec()", (), "dynamic")),
    ("import timeit\ng = {}\ntimeit.timeit('import transformers as t', number=1, globals=g)",
     ("timeit", (), "dynamic")),
    ("import pydoc\nf = pydoc.locate('transformers.models.llama.modeling_llama.apply_rotary_pos_emb')",
     ("pydoc", (), "dynamic")),
    ("__builtins__.isinstance = lambda *a: True", ("__builtins__", (), "dynamic")),
    ("import sys\nm = sys.modules['gptcourse.model.causal_attention']", ("sys.modules", (), "dynamic")),
    ("o, w = torch.ops.aten._scaled_dot_product_attention_math(1, 2, 3)",
     ("torch.ops.aten._scaled_dot_product_attention_math", (), "dynamic")),
    ("from gptcourse.grading import get_case\nr = get_case('02.attention.visible').reference",
     ("gptcourse.grading.get_case", (), "dynamic")),
])
def test_the_scan_follows_imports_and_aliases(source, found):
    assert found in _scan(source)


def test_the_scan_leaves_honest_code_and_instructor_cells_alone():
    honest = ("def causal_mask(T):\n    return torch.ones(T, T, dtype=torch.bool).tril()\n"
              "def attention(q, k, v):\n    w = (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1)\n"
              "    return w @ v, w\nclass AttentionHead(nn.Module):\n    pass\n"
              "from gptcourse.grading import check\ncheck('02.causal_mask.visible', causal_mask)")
    assert _scan(honest) == set()
    # an import in a locked (instructor) cell is not the student's doing; a later student use of it is
    assert _scan("y = 1", setup="from gptcourse import causal_mask") == set()
    assert ("gptcourse.causal_mask", ("causal_mask",), "uses") in _scan(
        "m = causal_mask(3)", setup="from gptcourse import causal_mask")
    # a student's own definition shadows an imported name
    assert _scan("def attention(q, k, v):\n    return q, q\nattention(1, 2, 3)",
                 setup="from torch import nn\nattention = None") == set()


# Issue 49: a hidden case reaches the kernel as an opaque handle, and comes back as its case.

def test_a_hidden_test_cell_runs_under_handles_that_name_no_case():
    from gptcourse.grading.handles import run_source

    handles: dict[str, str] = {}
    source = ('# Hidden tests: T = 1.\n### BEGIN HIDDEN TESTS\ncheck("02.causal_mask.hidden_single", causal_mask)\n'
              'check("02.causal_mask.visible", causal_mask)  # a visible id stays\n### END HIDDEN TESTS')
    run = run_source(source, handles)
    assert list(handles.values()) == ["02.causal_mask.hidden_single"]
    [handle] = handles
    assert run == f"check('{handle}', causal_mask)\ncheck('02.causal_mask.visible', causal_mask)"
    assert run_source('check("02.causal_mask.visible", causal_mask)', handles) is None  # nothing to hide
    assert run_source(source, {}) != run  # drawn afresh for each submission


def test_a_payload_under_a_handle_is_judged_as_its_case_with_the_graders_seed():
    from gptcourse.grading.handles import named_payload

    handles = {"hidden-0a1b": "02.causal_mask.hidden_single"}
    case = get_case("02.causal_mask.hidden_single")
    t = case.inputs(case_seed(case, student="alice"))["t"]
    recorded = make_payload("hidden-0a1b", 0, {"mask": torch.ones(t, t, dtype=torch.bool).tril()}, None)
    named = named_payload(recorded, handles, "alice")
    assert named["test_id"] == "02.causal_mask.hidden_single" and judge_payload(named, "alice")[0]
    assert named_payload(recorded | {"test_id": "hidden-ffff"}, handles, "alice")["test_id"] == "hidden-ffff"
    assert not judge_payload(recorded, "alice")[0]  # a handle the grader did not draw names no case


def test_a_test_cell_whose_kernel_sent_a_forged_message_fails():
    from gptcourse.grading.steps.judge import FORGED

    cell = new_code_cell('check("02.causal_mask.visible", causal_mask)')
    cell.outputs = [new_output("display_data", data={MIME: GOOD, "text/plain": ""}),
                    new_output("error", ename=FORGED, evalue="the kernel sent a message of unknown type 'x': dropped",
                               traceback=[])]
    passed, messages = judge_cell(cell, ["02.causal_mask.visible"], {})
    assert not passed and messages == ["02.causal_mask.visible: 0 points: while this cell ran, the kernel sent a "
                                       "message of unknown type 'x': dropped"]


@pytest.mark.parametrize("content, problem", [
    ({"data": {"text/plain": "1"}, "metadata": {}, "execution_count": "one"}, "whose execution_count is str"),
    ({"data": {"text/html": {"not": "text"}}, "metadata": {}}, "whose text/html is dict"),
    ({"data": ["text/plain"], "metadata": {}}, "whose data is list"),
    ({"data": {"text/plain": "1"}}, "without its metadata"),
    ({"data": {"text/plain": "1"}, "metadata": {}, "transient": {"display_id": ["d"]}}, "malformed display id"),
])
def test_a_kernel_message_that_nbformat_would_refuse_is_named(content, problem):
    from gptcourse.grading.steps.execute import message_problem

    msg_type = "execute_result" if "execution_count" in content else "display_data"
    message = {"msg_type": msg_type, "header": {"msg_type": msg_type}, "parent_header": {}, "content": content}
    assert problem in message_problem(message)
    good = {"data": {MIME: [1, 2], "text/plain": ["a", "b"]}, "metadata": {}, "transient": {"display_id": "d"},
            "execution_count": 3}
    assert message_problem(message | {"content": good}) is None  # JSON where JSON may be, text as lines
    assert "unknown type 'made_up'" in message_problem(message | {"msg_type": "made_up",
                                                                   "header": {"msg_type": "made_up"}})


@pytest.mark.parametrize("test_id", ["09.adamw_step.visible", "09.adamw_step.hidden_sizes"])
def test_a_case_made_once_is_handed_out_as_independent_copies(test_id):
    """The grader makes a case's inputs once per seed and process (a visible case's seed is the same for every
    student; a hidden case's inputs are made for the kernel, then judged), and a visible case's expected outputs
    once: what one run does to its copy must not reach the next one's, and the copies equal what the case makes
    afresh."""
    case = get_case(test_id)
    seed = case_seed(case, {"GPTCOURSE_SECRET": "a class"})
    first, second = case_inputs(case, seed), case_inputs(case, seed)
    fresh = case.inputs(seed)
    first["param"].add_(1.0)
    first["grads"][0].zero_()
    assert torch.equal(second["param"], fresh["param"]) and torch.equal(second["grads"][0], fresh["grads"][0])
    expected = case_expected(case, seed, second)
    expected["params"].zero_()
    again = case_expected(case, seed, case_inputs(case, seed))
    assert torch.equal(again["params"], case.expected(fresh)["params"])
